"""Scrape addresses: one normalisation, applied where a ``Target`` is built, so nothing later sees raw text.

A target's ``address`` is a *host* only (the port is its own field): a DNS name, an IPv4
address, or an IPv6 address with or without brackets. :func:`normalise_host` returns the
one spelling every later step uses (hashing identities, duplicate detection, rendering):
DNS names lower-cased without a trailing dot, IPv4 in dotted decimal, IPv6 compressed
(``fd00:0:0:0:0:0:0:1`` is ``fd00::1``) without brackets, an IPv4-mapped IPv6 address
(``::ffff:10.0.0.1``) as its IPv4 address. :func:`normalise_identity` gives an identity
spelled ``host:port`` the same treatment, so ``GPU-1.Example:9400`` is ``gpu-1.example:9400``.
:func:`host_port` puts the brackets back for IPv6, as Prometheus needs in ``host:port``.

Everything else is refused with a reason: empty, whitespace, a scheme (``http://``), a
path, an embedded port (``10.0.0.1:9400``, ``[fd00::1]:9400``: the port is given apart,
and two sources of truth for it would disagree sooner or later), IPv6 zone ids, and
dotted numbers that are not an IPv4 address (``10.0.0.256``).
"""

from __future__ import annotations

import ipaddress
import re

_LABEL_RE = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_PORT_RE = re.compile(r"^[0-9]{1,5}\Z")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# Already canonical and by far the most common spellings: answered without ipaddress.
_CANONICAL_IPV4 = re.compile(rf"^{_OCTET}(\.{_OCTET}){{3}}\Z")
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_CANONICAL_DNS = re.compile(rf"^(?=.{{1,{253}}}\Z){_LABEL}(\.{_LABEL})*\Z")
MAX_DNS_NAME = 253


def normalise_host(text: str) -> str:
    """The canonical spelling of a scrape host; ValueError naming what is wrong."""
    if _CANONICAL_IPV4.match(text):
        return text
    if _CANONICAL_DNS.match(text) and not text.rpartition(".")[2].isdigit():
        return text
    if not text:
        raise ValueError("address is empty")
    if not text.isprintable() or " " in text:  # other Unicode spaces are not printable
        raise ValueError("address contains whitespace or control characters")
    if "://" in text:
        raise ValueError("address must be a host, not a URL (drop the scheme; set port and metrics_path)")
    if "/" in text or "?" in text or "#" in text:
        raise ValueError("address must be a host, without a path (set metrics_path instead)")
    if "@" in text:
        raise ValueError("address must be a host, without user info")
    if text.startswith("["):
        inner, close, rest = text[1:].partition("]")
        if not close:
            raise ValueError("address has an unclosed '['")
        if rest:
            raise ValueError(f"address includes a port ({rest!r}); give the host only and set port")
        return _ipv6(inner)
    if text.count(":") == 1:  # IPv6 has at least two; bracket-less IPv6 is taken as a host
        port = text.partition(":")[2]
        if _PORT_RE.match(port):
            raise ValueError(f"address includes a port (':{port}'); give the host only and set port")
        raise ValueError("address has a ':' but is not an IPv6 address")
    if ":" in text:
        return _ipv6(text)
    labels = text.rstrip(".").split(".") if text != "." else [""]
    if all(label.isdigit() for label in labels):
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ValueError("address is not a valid IPv4 address") from None
    return _dns(text, labels)


def _ipv6(text: str) -> str:
    if "%" in text:
        raise ValueError("IPv6 zone ids (%...) are not supported in scrape addresses")
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError("address is not a valid IPv6 address") from None
    mapped = address.ipv4_mapped  # ::ffff:10.0.0.1 is the host 10.0.0.1 is: one spelling
    return str(mapped) if mapped is not None else address.compressed


def _dns(text: str, labels: list[str]) -> str:
    name = ".".join(labels).lower()
    if len(name) > MAX_DNS_NAME:
        raise ValueError(f"DNS name longer than {MAX_DNS_NAME} characters")
    for label in labels:
        if not _LABEL_RE.match(label.lower()):
            raise ValueError(
                "not a DNS name, IPv4 or IPv6 address (DNS labels are 1-63 letters, digits, '-', '_')"
            )
    if labels[-1].isdigit():
        raise ValueError("not a DNS name (its last label is all digits) nor an IPv4 address")
    return name


def host_port(host: str, port: int) -> str:
    """``host:port`` as Prometheus wants it: IPv6 in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def normalise_identity(identity: str) -> str:
    """An identity spelled ``host:port`` with its host normalised; any other identity as given.

    Identities are hashed, so two spellings of one endpoint would land on two shards.
    Identities that are not ``host:port`` (``gpu/node-1``) are names, kept as they are.
    """
    host, colon, port = identity.rpartition(":")
    if not colon or not _PORT_RE.match(port) or not host or not 1 <= int(port) <= 65535:
        return identity
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # bare IPv6 with a port is ambiguous: leave the name alone
        return identity
    try:
        return host_port(normalise_host(host), int(port))
    except ValueError:
        return identity
