"""Who a request comes from, for the read budget: the TCP peer, unless a proxy is trusted.

By default the client is the address the connection comes from (``scope["client"]``),
whatever the request says: ``X-Forwarded-For`` is a header anyone can write, and honouring
it from loopback (uvicorn's default ``forwarded_allow_ips``) lets a ``kubectl port-forward``,
a sidecar or a node agent pick a new bucket per request, or spend another client's budget.
``serve`` turns uvicorn's proxy handling off, so the peer reaches us unchanged.

``--trusted-proxies CIDR,...`` names the proxies (an ingress controller, say) whose
``X-Forwarded-For`` is believed: the client is then the right-most address in that header
that is not itself a trusted proxy (RFC 7239 §7.4 reasoning: only the hops we trust
appended honestly). A value that is not an IP address is never a key: the peer is used.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyListError(ValueError):
    """A ``--trusted-proxies`` entry that is not an address or a CIDR block."""


def parse_trusted(values: Iterable[str]) -> tuple[Network, ...]:
    """``["10.0.0.0/8", "192.168.1.7"]`` -> networks; raises :class:`ProxyListError` naming the value."""
    networks: list[Network] = []
    for raw in values:
        for item in raw.split(","):
            item = item.strip()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError as exc:
                shown = item if len(item) <= 80 else f"{item[:80]}..."
                raise ProxyListError(
                    f"--trusted-proxies: expected an IP address or CIDR block, got {shown!r}"
                ) from exc
    return tuple(networks)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if len(text) > 45:  # longer than any IPv6 text form: not an address
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ClientAddress:
    trusted: Sequence[Network] = ()

    def _is_trusted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address.version == net.version and address in net for net in self.trusted)

    def of(self, scope: MutableMapping[str, Any]) -> str:
        client = scope.get("client")
        peer = str(client[0]) if client else "unknown"
        if not self.trusted:
            return peer
        peer_ip = _ip(peer)
        if peer_ip is None or not self._is_trusted(peer_ip):
            return peer
        hops: list[str] = []
        for name, value in scope.get("headers", []):
            if name == b"x-forwarded-for":
                hops += value.decode("latin-1").split(",")
        for hop in reversed(hops):
            address = _ip(hop)
            if address is None:
                return peer  # a hop we cannot read: trust nothing left of it
            if not self._is_trusted(address):
                return str(address)
        return peer
