"""One normalisation of scrape addresses: every spelling of a host becomes one string."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.model.addresses import host_port, normalise_host


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("fd00:0:0:0:0:0:0:1", "fd00::1"),
        ("[fd00:0:0:0:0:0:0:1]", "fd00::1"),
        ("FD00::A", "fd00::a"),
        ("2001:DB8:0000::0001", "2001:db8::1"),
        ("GPU-Node-01.Example.COM", "gpu-node-01.example.com"),
        ("gpu-node-01.example.com.", "gpu-node-01.example.com"),
        ("localhost", "localhost"),
        ("exporter_1.svc", "exporter_1.svc"),
    ],
)
def test_spellings_of_one_host_become_one(raw: str, canonical: str) -> None:
    assert normalise_host(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty"),
        ("10.0.0.16 ", "whitespace"),
        (" 10.0.0.16", "whitespace"),
        ("10.0.0.1\n", "whitespace"),
        ("gpu\x00node", "control"),
        ("10.0.0.1:9400", r"includes a port \(':9400'\)"),
        ("[fd00::1]:9400", r"includes a port \(':9400'\)"),
        ("node-7:9100", "includes a port"),
        ("http://10.0.0.1", "not a URL"),
        ("https://gpu.example.com:443/metrics", "not a URL"),
        ("10.0.0.1/metrics", "without a path"),
        ("admin@10.0.0.1", "user info"),
        ("10.0.0.256", "not a valid IPv4"),
        ("010.0.0.1", "not a valid IPv4"),
        ("1.2.3", "not a valid IPv4"),
        ("fd00::1::2", "not a valid IPv6"),
        ("[10.0.0.1]", "not a valid IPv6"),
        ("[fd00::1", "unclosed"),
        ("fe80::1%eth0", "zone ids"),
        ("host:name", "not an IPv6"),
        ("-bad.example", "not a DNS name"),
        ("a..b", "not a DNS name"),
        ("x" * 64 + ".example", "not a DNS name"),
        (".".join(["abcdefgh"] * 40), "longer than 253"),
        ("example.123", "last label is all digits"),
    ],
)
def test_what_is_not_a_host_is_refused_with_a_reason(raw: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        normalise_host(raw)


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses())
def test_every_ip_is_canonical_and_stable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    exploded = address.exploded.upper() if address.version == 6 else str(address)
    canonical = normalise_host(exploded)
    mapped = address.ipv4_mapped if address.version == 6 else None
    assert ipaddress.ip_address(canonical) == (mapped or address)  # ::ffff:a.b.c.d is a.b.c.d
    assert normalise_host(canonical) == canonical
    if address.version == 6 and mapped is None:
        assert normalise_host(f"[{exploded}]") == canonical
        assert host_port(canonical, 9400) == f"[{canonical}]:9400"
    else:
        assert host_port(canonical, 9400) == f"{canonical}:9400"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_a_host_or_a_value_error(text: str) -> None:
    try:
        host = normalise_host(text)
    except ValueError:
        return
    assert host == normalise_host(host)
    assert host and host == host.strip() and "/" not in host
