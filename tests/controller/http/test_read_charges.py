"""Every tokenless route but HTTP SD and health pays for what it costs (issue 38, items 1, 2, 6).

Costs are counted from what the request did, through injected clocks and byte counts: the
route CPU clock is a fake that says how long a route "took", so nothing here is timed.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from federation.commands.cli import _register
from federation.commands.cli import app as cli_app
from federation.controller.base.options import ControllerOptions
from federation.controller.http import redact
from federation.controller.http.client_address import ClientAddress, ProxyListError, parse_trusted
from federation.controller.http.ratelimit import MAX_KEY, MAX_RETRY_S, RateLimited, RateLimiter
from federation.controller.http.read_guard import BYTES_PER_UNIT
from tests.controller.harness import TOKEN, ControllerHarness, build, fleet, write_spec

FREE = ("/v1/sd/r1-0", "/healthz", "/readyz", "/metrics", "/v1/sd-children")
CHARGED = (
    "/v1/status",
    "/v1/targets",
    "/v1/targets/10.0.0.1:9400",
    "/v1/shards",
    "/v1/load",
    "/v1/handovers",
    "/v1/audit",
    "/v1/registry/targets",
    "/v1/configs",
    "/v1/configs/nothing.yml",
    "/",
    "/web/app.js",
    "/openapi.json",
    "/no/such/route",
)


def _harness(tmp_path: Path, *, rate: float = 0.001, burst: int = 3) -> ControllerHarness:
    options = ControllerOptions(debounce_s=0.0, grace_s=0.0, read_rate=rate, read_burst=burst)
    h = build(tmp_path, options=options)
    h.feed(fleet(20, region="r1"))
    return h


def _client(h: ControllerHarness, peer: str = "192.0.2.10") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=h.service.app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://ctl")


@pytest.mark.asyncio
@pytest.mark.parametrize("path", CHARGED)
async def test_every_route_but_sd_and_health_is_charged(tmp_path: Path, path: str) -> None:
    h = _harness(tmp_path)
    async with _client(h) as client:
        answers = [(await client.get(path)).status_code for _ in range(4)]
        assert answers[:3] != [429] * 3 and answers[3] == 429, answers
        for free in FREE:
            assert (await client.get(free)).status_code != 429, free
        with_token = await client.get(path, headers=h.auth(TOKEN))
        assert with_token.status_code != 429


@pytest.mark.asyncio
async def test_a_route_is_charged_the_cpu_time_it_measured(tmp_path: Path) -> None:
    """The fake route clock says every metered route took 30 ms: 30 units against a burst of
    100, so the fourth status read is refused; at 0.5 ms a read costs its one unit only."""
    h = _harness(tmp_path, burst=100)
    ticks = itertools.count()
    h.service.app.state.cpu_clock = lambda: next(ticks) * 0.030
    async with _client(h) as client:
        codes = [(await client.get("/v1/status")).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]  # 1 + 29 each: 30, 60, 90 (-> 90 spent), 120 > 100
    h2 = _harness(tmp_path / "cheap", burst=100)
    ticks2 = itertools.count()
    h2.service.app.state.cpu_clock = lambda: next(ticks2) * 0.0005
    async with _client(h2) as client:
        codes = [(await client.get("/v1/status")).status_code for _ in range(100)]
    assert codes.count(200) == 100


@pytest.mark.asyncio
async def test_a_published_file_is_charged_by_its_bytes_and_masked_once_per_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _harness(tmp_path, burst=40)
    publisher = h.controller.publisher
    assert publisher is not None
    group = {"targets": ["10.0.0.1:9400"], "labels": {"password": "hunter2-hunter2"}}
    big = json.dumps([group] * 8000).encode()
    publisher.files = {"lists/big.json": big}
    masked: list[str] = []
    real = redact.redact_file

    def counting(path: str, content: bytes) -> bytes:
        masked.append(path)
        return real(path, content)

    monkeypatch.setattr(redact, "redact_file", counting)
    h.service.app.state.cpu_clock = lambda: 0.0  # bytes only: the route's CPU is another test's
    async with _client(h) as client:
        first = await client.get("/v1/configs/lists/big.json")
        assert first.status_code == 200 and b"hunter2" not in first.content
        units = len(first.content) / BYTES_PER_UNIT
        assert 1 < units < 40
        answers = [first]
        while answers[-1].status_code == 200:
            answers.append(await client.get("/v1/configs/lists/big.json"))
        assert answers[-1].status_code == 429
        assert len(answers) - 1 == int((40 - 1) // units) + 1  # admitted while a unit is left
        assert masked == ["lists/big.json"]  # repeat reads were copies of the masked bytes
        publisher.files = {"lists/big.json": bytes(bytearray(big))}  # republished: a new version
    async with _client(h, peer="192.0.2.11") as client:
        assert (await client.get("/v1/configs/lists/big.json")).status_code == 200
    assert masked == ["lists/big.json"] * 2


@pytest.mark.asyncio
async def test_status_counts_sources_without_sorting_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sharder.live import merging

    h = _harness(tmp_path, rate=0)

    def no_sorting(*args: Any) -> Any:
        raise AssertionError("/v1/status sorted a source's targets")

    monkeypatch.setattr(merging, "sort_targets", no_sorting)
    async with _client(h) as client:
        status = await client.get("/v1/status")
    assert status.status_code == 200
    assert {r["source"]: r["targets"] for r in status.json()["discovery"]}["file"] == 20


@pytest.mark.asyncio
async def test_x_forwarded_for_from_loopback_is_not_believed(tmp_path: Path) -> None:
    """Rotating the header from one peer spends one bucket; and the header cannot spend
    another client's."""
    h = _harness(tmp_path)
    async with _client(h, peer="127.0.0.1") as client:
        codes = [
            (await client.get("/v1/status", headers={"X-Forwarded-For": f"10.0.0.{i}"})).status_code
            for i in range(6)
        ]
        assert codes.count(429) == 3
    async with _client(h, peer="192.0.2.50") as victim:
        assert (await victim.get("/v1/status")).status_code == 200


def test_a_trusted_proxy_names_the_client_by_its_right_most_untrusted_hop() -> None:
    clients = ClientAddress(trusted=parse_trusted(["10.0.0.0/8", "fd00::/8"]))

    def scope(peer: str, *xff: str) -> dict[str, Any]:
        return {"client": (peer, 1), "headers": [(b"x-forwarded-for", v.encode()) for v in xff]}

    assert clients.of(scope("10.1.2.3", "198.51.100.7, 10.9.9.9")) == "198.51.100.7"
    assert clients.of(scope("10.1.2.3", "6.6.6.6", "198.51.100.7")) == "198.51.100.7"  # spoofed left hop
    assert clients.of(scope("192.0.2.1", "198.51.100.7")) == "192.0.2.1"  # peer not a trusted proxy
    assert clients.of(scope("10.1.2.3", "not-an-ip")) == "10.1.2.3"
    assert clients.of(scope("10.1.2.3", "x" * 10_000)) == "10.1.2.3"
    assert clients.of(scope("10.1.2.3")) == "10.1.2.3"
    assert ClientAddress().of(scope("127.0.0.1", "198.51.100.7")) == "127.0.0.1"
    with pytest.raises(ProxyListError, match=r"--trusted-proxies.*'10\.0\.0\.0/33'"):
        parse_trusted(["10.0.0.0/33"])


def test_the_bucket_table_is_bounded_least_recently_used_first() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=2, clock=lambda: now[0], max_callers=3)
    for name in ("a", "b", "c"):
        limiter.take(name, 2)
    limiter.spend("a", 0.5)  # "a" used last: "b" is the oldest
    limiter.take("d")
    assert len(limiter) == 3
    with pytest.raises(RateLimited):
        limiter.take("a")  # kept, still empty
    limiter.take("b", 2)  # forgotten, so a full bucket again (evicts "c")
    long_key = "k" * 100_000
    limiter.take(long_key)
    assert all(len(k) <= MAX_KEY for k in limiter._buckets)
    with pytest.raises(RateLimited):
        limiter.take(long_key, 2)  # the cut key still names the same bucket


def test_retry_after_is_a_short_number() -> None:
    limiter = RateLimiter(rate=0.001, burst=1, clock=lambda: 0.0)
    limiter.take("c")
    limiter.spend("c", 1e300)
    with pytest.raises(RateLimited) as caught:
        limiter.take("c")
    assert caught.value.retry_after_s == MAX_RETRY_S
    with pytest.raises(ValueError, match=r"rate must be 0 or from 0\.001"):
        RateLimiter(rate=1e-300, burst=1)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--read-rate", "1e-300"], "--read-rate"),
        (["--registry-rate", "0.0001"], "--registry-rate"),
        (["--trusted-proxies", "10.0.0.0/8,nope"], "--trusted-proxies"),
    ],
)
def test_rates_and_proxies_are_checked_at_start(tmp_path: Path, args: list[str], flag: str) -> None:
    _register()
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    result = CliRunner().invoke(
        cli_app,
        ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", *args],
        env={"GPUFED_TOKEN": TOKEN},
    )
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not (tmp_path / "d").exists()  # refused before the state was opened


@pytest.mark.asyncio
async def test_the_web_page_refresh_stays_within_the_default_budget(tmp_path: Path) -> None:
    """One tab without a token, with the default --read-rate/--read-burst: the page's assets
    once, then its refresh (shards, status, hand-overs, audit, a targets page) every 4 s,
    for 100 cycles, is never refused. The limiter's clock is a fake that the cycles advance."""
    from federation.controller.http.api import WEB_DIR
    from federation.controller.http.read_guard import read_limiter

    h = build(tmp_path, spec=write_spec(tmp_path / "spec.yaml", regions={"r1": 20}))
    h.feed(fleet(2000, region="r1"))
    now = [0.0]
    options = h.controller.options
    limiter = read_limiter(rate=options.read_rate, burst=options.read_burst)
    limiter._clock = lambda: now[0]
    h.service.app.state.read_limiter = limiter
    h.service.app.state.cpu_clock = lambda: 0.0
    refresh = ["/v1/shards", "/v1/status", "/v1/handovers", "/v1/audit?limit=12", "/v1/targets?limit=100"]
    async with _client(h) as client:
        for asset in ["/", *(f"/web/{p.name}" for p in sorted(WEB_DIR.glob("app.*")))]:
            assert (await client.get(asset)).status_code == 200, asset
        for _ in range(100):
            for path in refresh:
                answer = await client.get(path)
                assert answer.status_code == 200, (path, answer.text[:200])
            now[0] += 4.0


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/v1/targets", "/v1/registry/targets"])
async def test_a_cursor_walk_over_a_changing_set_neither_skips_nor_repeats(tmp_path: Path, path: str) -> None:
    """Between every two pages a row is added before the cursor and one is removed ahead of it
    (what moves an offset walk by one): every identity that stayed is seen once."""
    h = _harness(tmp_path, rate=0)
    async with _client(h) as client:

        async def put(i: int) -> None:
            body = {"address": f"10.8.{i // 250}.{i % 250 + 1}", "port": 9400, "job": "gpu",
                    "node": f"w-{i:04d}", "region": "r1"}  # fmt: skip
            where = f"/v1/registry/targets/{body['address']}:9400"
            answer = await client.put(where, json=body, headers=h.auth())
            assert answer.status_code in (200, 201), answer.text

        for i in range(100, 200):
            await put(i)
        h.tick()
        first = (await client.get(path, params={"limit": 1000})).json()
        start = {row["identity"] for row in first["targets"]}
        seen: list[str] = []
        removed: set[str] = set()
        cursor: str | None = None
        for step in range(1000):
            params: dict[str, Any] = {"limit": 7} | ({"cursor": cursor} if cursor else {})
            page = (await client.get(path, params=params)).json()
            assert "version" in page
            seen += [row["identity"] for row in page["targets"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
            await put(step)  # sorts before the cursor (10.8.0.x < 10.8.0.10x ... early identities)
            ahead = sorted(i for i in start - removed - set(seen) if i.startswith("10.8."))
            if ahead:
                gone = ahead[-1]
                deleted = await client.delete(f"/v1/registry/targets/{gone}", headers=h.auth())
                assert deleted.status_code == 204
                removed.add(gone)
            h.tick()
        stayed = start - removed
        assert len(seen) == len(set(seen))  # nothing repeated
        assert stayed <= set(seen)  # nothing that stayed was skipped
        bad = await client.get(path, params={"cursor": "%%%not-base64"})
        assert bad.status_code == 422 and "cursor" in bad.json()["detail"]


def test_a_busy_listen_port_exits_before_the_state_is_opened(tmp_path: Path) -> None:
    import socket

    _register()
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli_app,
            ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"),
             "--listen", f"127.0.0.1:{port}"],
            env={"GPUFED_TOKEN": TOKEN},
        )
    assert result.exit_code == 2, result.output
    assert f"cannot bind 127.0.0.1:{port}" in result.output and "--listen" in result.output
    assert not (tmp_path / "d").exists()  # no state opened, no election run
