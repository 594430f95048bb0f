"""HTTP hygiene (issue 21, item 6 and the HTTP bounds of item 3): auth schemes, 401 headers,
relative redirects, ids decoded once, 413 for chunked bodies, body and header deadlines."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from federation.controller.http.http_guards import BodyGuard, DeadlineH11Protocol, relative_location
from federation.testing.harnesses.app_server import AppServer
from tests.controller.harness import TOKEN, ControllerHarness


@pytest.mark.asyncio
async def test_bearer_scheme_is_case_insensitive_and_401_says_bearer(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
            ok = await client.post("/v1/plan", json={}, headers={"Authorization": f"{scheme} {TOKEN}"})
            assert ok.status_code == 200, (scheme, ok.text)
        refusals: list[dict[str, str]] = [{}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer"}]
        for header in refusals:
            refused = await client.post("/v1/plan", json={}, headers=header)
            assert refused.status_code == 401, header
            assert refused.headers["www-authenticate"].startswith("Bearer"), header


@pytest.mark.asyncio
async def test_redirects_never_echo_the_host_header(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        response = await client.get("/v1/shards/?x=1", headers={"Host": "evil.example"})
        assert response.status_code in (307, 308)
        assert response.headers["location"] == "/v1/shards?x=1"
    assert relative_location(b"http://evil.example//other.example/p") == b"/other.example/p"
    assert relative_location(b"/v1/a") == b"/v1/a"


@pytest.mark.asyncio
async def test_ids_are_percent_decoded_once(harness: ControllerHarness) -> None:
    literal = "odd%41id"  # an identity that holds a literal '%41'
    entry = {"address": "10.7.0.1", "port": 9400, "job": "gpu", "node": "n-odd", "region": "r1"}
    async with harness.client() as client:
        created = await client.put(
            "/v1/registry/targets/odd%2541id", json={**entry, "identity": literal}, headers=harness.auth()
        )
        assert created.status_code == 201, created.text
        assert created.json()["identity"] == literal
        harness.tick()
        explained = await client.get("/v1/targets/odd%2541id")
        assert explained.status_code == 200, explained.text
        assert (await client.get("/v1/targets/oddAid")).status_code == 404  # not decoded twice
        gone = await client.delete("/v1/registry/targets/odd%2541id", headers=harness.auth())
        assert gone.status_code == 204


@pytest.mark.asyncio
async def test_target_pages_are_capped(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        assert (await client.get("/v1/targets?limit=1000")).status_code == 200
        too_many = await client.get("/v1/targets?limit=5000")
        assert too_many.status_code == 422 and "limit" in too_many.text


@pytest.mark.asyncio
async def test_an_oversized_chunked_body_is_413_not_400(harness: ControllerHarness) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"reason": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    async with harness.client() as client:
        response = await client.post(
            "/v1/plan", content=chunks(), headers={**harness.auth(), "content-type": "application/json"}
        )
        assert response.status_code == 413, response.text
        assert "limited to" in response.json()["detail"]
        small = await client.post("/v1/plan", json={"reason": "fits"}, headers=harness.auth())
        assert small.status_code == 200


@pytest.mark.asyncio
async def test_a_trickled_body_gets_408() -> None:
    called: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append((await receive())["body"])

    async def slow_receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = BodyGuard(app, limit=1 << 20, timeout_s=0.3)
    scope = {"type": "http", "method": "POST", "path": "/v1/plan", "headers": []}
    await guard(scope, slow_receive, send)
    assert sent[0]["status"] == 408 and not called


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _QuickDeadline(DeadlineH11Protocol):
    header_timeout_s = 0.5


@pytest.fixture
def server() -> Iterator[int]:
    with AppServer(_hello, http=_QuickDeadline, log_level="error") as served:
        yield served.port


def test_slowloris_headers_are_cut_within_seconds(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 4:
            try:
                sock.sendall(b"X-a: b\r\n")  # one more header line, never the blank line
                sock.settimeout(0.2)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
        assert closed, "a request head trickled for 4 s was not cut"
        assert time.monotonic() - started < 2.5


def test_a_prompt_request_and_keep_alive_still_work(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        for _ in range(2):
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok"):
                answer += sock.recv(1024)
            assert answer.startswith(b"HTTP/1.1 200")
