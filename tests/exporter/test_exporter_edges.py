"""Hard edges of the exporter: start-up errors, the HTTP edge under hostile clients, gzip,
backlog, the fast text writer against prometheus-client, and the fleet load benchmark."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import socket
import time

import pytest
from conftest import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily
from typer.testing import CliRunner

from exporter import logs, textformat
from exporter.catalogue import select_families
from exporter.collection import Collection, CollectionLoop
from exporter.commands.cli import cli, main
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.server import Body, HttpServer, NodeRoutes
from exporter.settings import ExporterSettings, parse_listen
from exporter.simulated import SimulatedBackend
from federation.localrun.loopback import listening_socket

BIG = b"x" * 50_000


# -- start-up errors -------------------------------------------------------------------

@pytest.fixture
def busy_port():
    with listening_socket() as sock:
        yield sock.getsockname()[1]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(logs, "configure", lambda **_: None)  # keep pytest's log handlers
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, (out, err)
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for leak in ("Traceback", "pydantic", "validation error", "input_value", "╭"):
        assert leak not in err
    return lines[0]


SIM = ["--backend", "simulated", "--gpus", "1"]


@pytest.mark.parametrize(("argv", "expect"), [
    (["--listen", "127.0.0.1:70000", *SIM], "70000 is out of range"),
    (["fleet", "--nodes", "2", "--listen", "127.0.0.1:99999"], "99999 is out of range"),
    (["--listen", "garbage", *SIM], "expected HOST:PORT"),
    (["fleet", "--listen", "a b:9400"], "neither an IP address nor a host name"),
    (["--listen", "::1:9400", *SIM], "needs brackets"),
    (["--listen", "host.invalid:-1", *SIM], "port must be a number"),
    (["--gpus", "-1", "--backend", "simulated"], "--gpus: Input should be greater than or equal to 0"),
    (["fleet", "--nodes", "-5"], "--nodes"),
    (["fleet", "--regions", "0"], "--regions"),
    (["fleet", "--gpus", "-2"], "--gpus"),
    (["--gpus", "many", "--backend", "simulated"], "Invalid value for '--gpus'"),
    (["--collect-interval", "-1", *SIM], "--collect-interval"),
    (["bench", "--gpus", "-1"], "--gpus"),
    (["bench", "fleet", "--concurrency", "0"], "--concurrency"),
    (["bench", "fleet", "--target", "nonsense"], "--target: expected HOST:PORT"),
    (["--families", "infiniband", *SIM], "unknown families"),
])
def test_startup_errors_are_one_line_and_exit_2(argv, expect, capsys, monkeypatch) -> None:
    assert expect in run_main(argv, capsys, monkeypatch)


def test_environment_errors_name_the_variable(capsys, monkeypatch) -> None:
    monkeypatch.setenv("GPUFED_EXPORTER_LISTEN", "0.0.0.0:123456")
    line = run_main(["fleet", "--nodes", "1"], capsys, monkeypatch)
    assert "GPUFED_EXPORTER_LISTEN" in line and "123456" in line


@pytest.mark.parametrize("mode", [["serve", *SIM], ["fleet", "--nodes", "3"]])
def test_port_in_use_and_unresolvable_host(mode, busy_port, capsys, monkeypatch) -> None:
    line = run_main([*mode, "--listen", f"127.0.0.1:{busy_port}"], capsys, monkeypatch)
    assert f"cannot listen on 127.0.0.1:{busy_port}: address already in use" in line
    line = run_main([*mode, "--listen", "no-such-host.invalid:9400"], capsys, monkeypatch)
    assert "cannot listen on no-such-host.invalid:9400: host 'no-such-host.invalid' does not resolve" in line


def test_parse_listen_forms() -> None:
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    assert parse_listen("[FD00:0:0:0::1]:0") == ("fd00::1", 0)
    assert parse_listen("Node-7.example:65535") == ("Node-7.example", 65535)
    for bad in ("", ":", "1.2.3.4", "h:65536", "h:9 400", "[::1:80", "[::1]", "http://h:1", "h/x:1", "h:٣"):
        with pytest.raises(ValueError):
            parse_listen(bad)


# -- the HTTP edge -----------------------------------------------------------------------

def routes(path: str):
    if path == "/big":
        return 200, "text/plain", Body(BIG)
    if path == "/huge":
        return 200, "text/plain", b"y" * 8_000_000
    if path == "/boom":
        raise RuntimeError("handler bug")
    if path in ("/", "/healthz"):
        return 200, "text/plain", b"ok\n"
    return 404, "text/plain", b"not found\n"


@pytest.fixture
def server():
    srv = HttpServer(routes, port=0, idle_timeout=0.3, request_timeout=0.3, max_body=1000)
    srv.start()
    yield srv
    srv.stop()


def request(srv: HttpServer, method: str, path: str, *, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def raw(srv: HttpServer, data: bytes, *, wait: float = 5) -> bytes:
    """Send bytes, read until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_head_get_and_other_methods(server) -> None:
    for path in ("/big", "/healthz", "/nope"):
        get_status, get_headers, get_body = request(server, "GET", path)
        head_status, head_headers, head_body = request(server, "HEAD", path)
        assert head_status == get_status and head_body == b""
        assert head_headers["content-length"] == get_headers["content-length"] == str(len(get_body))
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        status, headers, _ = request(server, method, "/big")
        assert status == 405 and headers["allow"] == "GET, HEAD"
    assert request(server, "GET", "/boom")[0] == 500


def test_request_bodies_read_or_refused(server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(2):  # a small body is read and dropped; the connection stays usable
            conn.request("GET", "/healthz", body=b"z" * 900)
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"ok\n")
    finally:
        conn.close()
    status, headers, _ = request(server, "POST", "/healthz", body=b"z" * 5000)
    assert status == 413 and headers["connection"] == "close"
    chunked = b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"z" * 1030
    assert raw(server, chunked).startswith(b"HTTP/1.1 413 ")
    assert raw(server, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    # headers that grow past 16 KiB without ending are refused, not buffered forever
    assert raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40000).startswith(b"HTTP/1.1 431 ")


def test_idle_and_slow_connections_are_closed(server) -> None:
    started = time.monotonic()
    assert raw(server, b"") == b""  # idle: closed after idle_timeout
    assert raw(server, b"GET / HTTP/1.1\r\nHost:") == b""  # slowloris: closed after request_timeout
    assert time.monotonic() - started < 4


def test_pipelined_requests_answered_in_order(server) -> None:
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = raw(server, one * 3 + b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 ") == 3 and answer.rstrip().endswith(b"not found")


def test_gzip_only_when_asked(server) -> None:
    _status, headers, body = request(server, "GET", "/big", headers={"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == BIG
    assert headers["vary"] == "Accept-Encoding"
    for value in ("", "identity", "gzip;q=0", "br, gzip; q=0.0"):
        headers = request(server, "GET", "/big", headers={"Accept-Encoding": value} if value else {})[1]
        assert "content-encoding" not in headers, value
    small = request(server, "GET", "/healthz", headers={"Accept-Encoding": "gzip"})[1]
    assert "content-encoding" not in small


def test_client_gone_mid_response_is_one_debug_line(server, caplog, capfd) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter.server")
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(100)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST while the server is still writing
    wait_for(lambda: len([r for r in caplog.records if "client went away" in r.getMessage()]) >= 3,
             timeout=10, what="three debug lines")
    gone = [r for r in caplog.records if "client went away" in r.getMessage()]
    assert {r.levelno for r in gone} == {logging.DEBUG} and {r.name for r in gone} == {"exporter.server"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in capfd.readouterr().err
    assert request(server, "GET", "/healthz")[0] == 200  # still serving


def test_listen_backlog_holds_a_fleet_of_connects() -> None:
    """Before start() nothing accepts: every connect must still complete from the backlog."""
    srv = HttpServer(routes, port=0, backlog=1024)
    clients = []
    try:
        for _ in range(300):
            sock = socket.socket()
            sock.settimeout(2)  # a SYN dropped by a short backlog would time out here
            sock.connect(("127.0.0.1", srv.port))
            clients.append(sock)
        srv.start()
        for sock in clients:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        for sock in clients:
            assert sock.recv(100).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in clients:
            sock.close()
        srv.stop()


# -- the text writer ---------------------------------------------------------------------

def registry_for(policy: LabelPolicy, *, families=None, gpus: int = 3) -> CollectorRegistry:
    now = [1_700_000_000.0]
    backend = SimulatedBackend(gpus, seed=3, node=policy.node, xid_probability=0.7, clock=lambda: now[0])
    collection = Collection(backend, families or select_families(include=["pcie", "gpm", "process"]),
                            timeout=None, clock=lambda: now[0], timer=lambda: 0.0)
    for step in (0.0, 1800.0, 3600.0):
        now[0] += step
        collection.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, policy))
    return registry


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=st.text(min_size=1, max_size=20), region=st.text(max_size=20),
       legacy=st.booleans(), label=st.sampled_from(["Hostname", "hostname"]))
def test_fast_writer_matches_prometheus_client(node: str, region: str, legacy: bool, label: str) -> None:
    policy = LabelPolicy(node, label, {"region": region, "rack": 'r"\\\n7'}, legacy)
    registry = registry_for(policy)
    assert textformat.render(registry.collect()) == textformat.fallback(registry)


def test_fast_writer_defers_what_it_does_not_know() -> None:
    histogram = HistogramMetricFamily("h", "help", buckets=[("1", 1.0), ("+Inf", 2.0)], sum_value=3)
    assert textformat.render([histogram]) is None
    routes = NodeRoutes(registry_for(LabelPolicy("n", placement={"bad-name": "v"})), ready=lambda: True)
    assert routes.render() == textformat.fallback(routes._registry)  # fell back, same bytes
    # DCGM counters are typed counter under their own name on both paths, as dcgm-exporter writes
    text = routes.render().decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    plain = generate_latest(routes._registry).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total counter" in plain


def test_collection_loop_spreads_a_fleet() -> None:
    collections = [Collection(SimulatedBackend(1, node=f"n{i}"), ["core"], timeout=None) for i in range(2000)]
    batches = CollectionLoop(collections, interval=5.0).batches()
    assert len(batches) <= 5.0 * CollectionLoop.SPREAD / CollectionLoop.BATCH_SPACING
    assert [c for batch in batches for c in batch] == collections
    assert CollectionLoop(collections[:1], interval=5.0).batches() == [collections[:1]]


# -- the load benchmark ------------------------------------------------------------------

def test_bench_fleet_json() -> None:
    result = CliRunner().invoke(cli, ["bench", "fleet", "--nodes", "12", "--concurrency", "4",
                                      "--scrapes", "200", "--gpus", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["fleet_load"]
    assert data["nodes"] == 12 and data["scrapes"] == 200 and data["statuses"] == {"200": 200}
    assert data["gzip_verified"] is True and data["errors"] == {}
    assert 0 < data["p50_ms"] <= data["p99_ms"] <= data["max_ms"]
    assert data["p99_over_target"] == pytest.approx(data["p99_ms"] / data["target_p99_ms"], abs=0.001)


def test_settings_defaults_for_the_edge() -> None:
    settings_ = ExporterSettings()
    assert settings_.listen_backlog >= 1024 and settings_.idle_timeout > 60 and settings_.max_request_body > 0


REQUEST_PARTS = st.sampled_from([
    b"GET /healthz HTTP/1.1\r\n", b"HEAD /big HTTP/1.1\r\n", b"POST / HTTP/1.1\r\n",
    b"GET /big HTTP/1.0\r\n",
    b"Host: x\r\n", b"Content-Length: 5\r\n", b"Content-Length: -1\r\n", b"Transfer-Encoding: chunked\r\n",
    b"Accept-Encoding: gzip;q=0.5\r\n", b"Connection: close\r\n", b"\r\n", b"hello",
    b"5\r\nhello\r\n0\r\n\r\n",
])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(st.one_of(REQUEST_PARTS, st.binary(max_size=40)), max_size=12))
def test_any_bytes_get_an_http_answer_or_a_close(server, caplog, data: list[bytes]) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter.server")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"".join(data))
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer == b"" or answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer[:80]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert request(server, "GET", "/healthz")[0] == 200


def test_bench_fleet_open_loop_rate() -> None:
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["bench", "fleet", "--nodes", "5", "--concurrency", "4", "--rate", "200",
                                      "--scrapes", "200", "--gpus", "1", "--no-gzip", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["fleet_load"]
    assert data["rate_per_s"] == 200 and data["scrapes"] == 200 and data["gzip_verified"] is None
    assert data["scrapes_per_s"] <= 200 * 1.1, "an open loop does not run ahead of its schedule"
    assert time.monotonic() - started < 60
