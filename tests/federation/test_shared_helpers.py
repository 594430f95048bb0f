"""The shared helpers the demo, benches and tests lean on: one poll-until loop, one loopback
HTTP server, ``gpufed serve --listen HOST:0`` and the one bench command table."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from federation.commands import bench
from federation.commands.cli import _register, app
from federation.commands.serve import bind_free_port, split_listen
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer, free_port, listening_socket
from federation.localrun.waiting import wait_until


def test_wait_until_returns_the_first_answer_that_is_not_none_or_false() -> None:
    answers = iter([None, False, httpx.ConnectError("not yet"), 0, 7])

    def check() -> int | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(check, timeout=5, what="an answer", interval=0) == 0  # 0 is an answer


def test_wait_until_fails_naming_what_and_the_last_answer() -> None:
    with pytest.raises(AssertionError, match=r"gave up waiting for the flag after 0.05 s; last: False"):
        wait_until(lambda: False, timeout=0.05, what="the flag", interval=0.01, fail=AssertionError)
    with pytest.raises(ValueError, match="boom"):  # not in retry_on: raised at once
        wait_until(lambda: int("boom"), timeout=5, what="a number", retry_on=())


def test_wait_until_stops_when_alive_says_the_process_died() -> None:
    calls = itertools.count()

    def alive() -> None:
        if next(calls) == 2:
            raise RuntimeError("exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(lambda: None, timeout=5, what="never", interval=0, alive=alive)


def test_loopback_server_answers_and_frees_its_port() -> None:
    class Echo(LoopbackHandler):
        def do_POST(self) -> None:
            self.reply(201, {"got": self.body().decode()}, headers={"X-Seen": "yes"})

    with LoopbackHTTPServer(Echo) as server:
        answer = httpx.post(f"{server.url}/x", content=b"hi", timeout=5)
        port = server.port
    assert (answer.status_code, answer.json(), answer.headers["x-seen"]) == (201, {"got": "hi"}, "yes")
    assert answer.headers["content-type"] == "application/json; charset=utf-8"
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # stopped: nothing listens there


def test_ports_listening_socket_is_bound_and_free_port_is_free() -> None:
    with listening_socket() as sock:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    with socket.create_server(("127.0.0.1", free_port())):
        pass


def test_serve_listen_port_zero_binds_and_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    assert split_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert split_listen("[::1]:8080") == ("::1", 8080)
    with pytest.raises(ValueError, match="port from 0 to 65535"):
        split_listen("127.0.0.1:65536")
    with bind_free_port("127.0.0.1") as sock:
        port = sock.getsockname()[1]
        assert port > 0
        assert capsys.readouterr().err == f"gpufed serve: listening on http://127.0.0.1:{port}\n"


def test_serve_answers_without_nagle() -> None:
    """Every connection ``gpufed serve`` accepts has TCP_NODELAY: asyncio sets it only on
    sockets made with proto IPPROTO_TCP, and without it an answer written as head then body
    waits for the client's delayed ACK (40 ms on each keep-alive request)."""
    with bind_free_port("127.0.0.1") as server, socket.create_connection(server.getsockname()):
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_bench_table_gives_every_command_json_and_one_error_shape() -> None:
    app = typer.Typer()
    bench.register(app)
    names = {b.name for b in bench.BENCHES}
    assert names == {"sharding", "render", "thanos", "inventory", "discovery", "sd", "rebalance", "failover",
                     "balance", "gap", "first-sample", "blackouts", "live", "dingtalk", "freshness",
                     "state-store", "compose", "helm", "costs"}
    for name in names:
        shown = CliRunner().invoke(app, [name, "--help"], terminal_width=200)
        assert shown.exit_code == 0 and "--json" in shown.output, (name, shown.output)

    def broken() -> bench.Result:
        raise bench.BenchFailed("the stack did not start")

    failing = typer.Typer()
    failing.command("broken")(bench.command(bench.Bench("broken", broken, bench.raw)))
    failing.command("noop", hidden=True)(lambda: None)
    result = CliRunner().invoke(failing, ["broken", "--json"])
    assert result.exit_code == 1 and "error: the stack did not start" in result.output

    # A bench that checks what it measures (blackouts) prints its result, then exits 1 when not ok.
    def answering(ok: bool) -> Callable[[], bench.Result]:
        return lambda: {"ok": ok}

    for ok, code in ((False, 1), (True, 0)):
        checked = typer.Typer()
        checked.command("checked")(bench.command(bench.Bench("checked", answering(ok), bench.raw)))
        checked.command("noop", hidden=True)(lambda: None)
        result = CliRunner().invoke(checked, ["checked", "--json"])
        assert result.exit_code == code and f'"ok": {str(ok).lower()}' in result.output, result.output


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_serve_listen_garbage_is_a_value_error_naming_it(listen: str) -> None:
    """Any --listen text either parses to a host the target check accepts or says why: no
    UnicodeError from the IDNA codec (a label over 63 characters) or a surrogate."""
    try:
        host, port = split_listen(listen)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
    else:
        assert 0 <= port < 65536 and host == host.strip() and host


@pytest.mark.parametrize(
    ("listen", "message"),
    [("\udcff:80", "host '\\udcff'"), ("a" * 5000 + ":1", "host 'aaaa"), ("a b:80", "host 'a b'"),
     ("10.9.9.9:0", "cannot bind 10.9.9.9:0")],
)
def test_serve_cli_refuses_a_bad_listen_naming_the_flag(listen: str, message: str, tmp_path: Path) -> None:
    _register()
    result = CliRunner().invoke(
        app, ["serve", "--spec", "examples/federation.yaml", "--data-dir", str(tmp_path), "--listen", listen],
        env={"GPUFED_TOKEN": "tok-0123456789abcdef0123", "COLUMNS": "400"},
    )
    assert result.exit_code == 2, result.output
    assert "--listen" in result.output and message in " ".join(result.output.split())
    assert "Traceback" not in result.output
