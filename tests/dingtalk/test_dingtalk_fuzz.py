"""Fuzzing the relay's webhook edge: any body gets 200 or a 4xx naming the field, never a 5xx.

The digest's paths are fuzzed the same way: info alerts with a part replaced are batched,
sent when the period ends, and round-trip through the memory rows; any digest memory
loads or is refused with ``ValueError``.

Bodies are valid Alertmanager payloads with one part replaced by arbitrary JSON (or a
datetime at the edges of the calendar), plus arbitrary bytes; they go through the real
app in-process, twice (the second time the relay already remembers the first), on a clock
that moves past the dedup window (and the robot's rate limit) between posts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alertmanager.dingtalk.app import create_app, flush_digests
from alertmanager.dingtalk.config import DigestConfig
from alertmanager.dingtalk.digest import Digests, render_digest

from .payloads import alert, relay_config, webhook

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
#: RFC 3339 times at the calendar's edges and without a zone: the datetime arithmetic
#: behind "since", the logs link's window and the dedup key must not overflow on them.
TIMES = st.sampled_from([
    "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59-05:00",
    "2024-05-01T10:00:00", "2024-05-01T10:00:00.123456789Z", "2024-05-01T10:00:00+14:00", "not a time", "",
    # the rule pack's `since` annotation: Go's time.String() as humanizeTimestamp writes it
    "0001-01-01 00:00:00 +0500 X", "9999-12-31 23:59:59 -0500 EST", "2024-05-01 10:00:00.5 +0000 UTC",
]) | st.datetimes().map(lambda d: d.isoformat()) | st.datetimes().map(
    lambda d: f"{d:%Y-%m-%d %H:%M:%S} +0000 UTC")
PATHS = st.sampled_from([
    ("version",), ("groupKey",), ("status",), ("receiver",), ("alerts",), ("groupLabels",),
    ("truncatedAlerts",), ("alerts", 0), ("alerts", 0, "status"), ("alerts", 0, "labels"),
    ("alerts", 0, "labels", "node"), ("alerts", 0, "annotations"), ("alerts", 0, "fingerprint"),
])
TIME_PATHS = st.sampled_from([
    ("alerts", 0, "annotations", "since"), ("alerts", 0, "startsAt"), ("alerts", 0, "endsAt"),
    ("alerts", 1, "annotations", "since"), ("alerts", 1, "startsAt"), ("alerts", 1, "endsAt"),
])


def replaced(body: Any, path: tuple[str | int, ...], value: Any) -> Any:
    *head, last = path
    target = body
    for key in head:
        target = target[key]
    target[last] = value
    return body


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["field", "time", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    body = webhook([alert(1), alert(2, status="resolved")])
    if kind == "time":
        return json.dumps(replaced(body, draw(TIME_PATHS), draw(TIMES))).encode()
    return json.dumps(replaced(body, draw(PATHS), draw(JSON | TIMES))).encode()


class Relay:
    """One app and event loop for the whole fuzz run (the relay remembers across examples)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.http = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda _: httpx.Response(200, json={"errcode": 0, "errmsg": "ok"})))
        # Each post a dedup window after the last: a body that differs only in what the key
        # leaves out (annotations) is rendered again rather than answered "duplicate".
        self.now = 1_800_000_000.0
        self.app = create_app(relay_config(), http_client=self.http, clock=lambda: self.now)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://relay")

    def post(self, body: bytes) -> httpx.Response:
        self.now += 120
        return self.loop.run_until_complete(self.client.post(
            "/dingtalk/cn-bj/send", content=body, headers={"content-type": "application/json"}))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    app = Relay()
    yield app
    app.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies())
def test_any_body_gets_an_answer_naming_the_field(relay: Relay, body: bytes) -> None:
    for _ in range(2):
        response = relay.post(body)
        assert response.status_code in {200, 400, 422}, (response.status_code, response.text)
        if response.status_code != 200:
            problem = response.json()
            assert response.headers["content-type"] == "application/problem+json"
            assert problem["field"] and problem["detail"].startswith(problem["field"]), problem


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deeply_nested_json_is_a_400_not_a_crash(relay: Relay, depth: int) -> None:
    response = relay.post(b"[" * depth + b"]" * depth)
    assert response.status_code in {400, 422}, response.text
    assert response.json()["field"] == "body"


# The digest's paths: info alerts (with one part replaced as above) join a batch, the batch
# is sent when its period ends, and the memory rows it leaves load back as they were.
INFO_PATHS = st.sampled_from([
    ("alerts", 0, "labels"), ("alerts", 0, "labels", "alertname"), ("alerts", 0, "labels", "node"),
    ("alerts", 0, "annotations"), ("alerts", 0, "annotations", "summary"), ("alerts", 0, "fingerprint"),
    ("alerts", 0, "status"), ("alerts", 1, "startsAt"), ("alerts", 1, "endsAt"), ("alerts", 1, "labels"),
])


@st.composite
def info_bodies(draw: st.DrawFn) -> bytes:
    body = webhook([alert(1, severity="info"), alert(2, status="resolved", severity="info"),
                    alert(3, severity="critical")])
    path = draw(INFO_PATHS)
    value = draw(TIMES) if path[-1] in ("startsAt", "endsAt") else draw(JSON | TIMES | st.text(max_size=300))
    return json.dumps(replaced(body, path, value)).encode()


class DigestRelay(Relay):
    def __init__(self) -> None:
        super().__init__()
        self.app = create_app(relay_config(digest={"period": "1h"}), http_client=self.http,
                              clock=lambda: self.now)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://relay")

    def flush(self) -> int:
        return self.loop.run_until_complete(flush_digests(self.app.state.relay))


@pytest.fixture(scope="module")
def digest_relay() -> Iterator[DigestRelay]:
    app = DigestRelay()
    yield app
    app.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=info_bodies())
def test_info_bodies_batch_flush_and_reload(digest_relay: DigestRelay, body: bytes) -> None:
    for _ in range(2):
        response = digest_relay.post(body)
        assert response.status_code in {200, 400, 422}, (response.status_code, response.text)
        if response.status_code != 200:
            assert response.json()["field"], response.text
    digests = digest_relay.app.state.relay.digests
    rows = json.loads(json.dumps(digests.snapshot()))
    again = Digests(digests.config, zone=digests.zone, clock=lambda: digest_relay.now)
    again.restore(rows)
    assert again.snapshot() == rows
    digest_relay.now += 3600  # past the hour's end: the batch goes out
    assert digest_relay.flush() <= 1
    assert digests.pending("cn-bj") is None


@settings(max_examples=300, deadline=None)
@given(data=JSON | st.dictionaries(st.text(max_size=4), st.fixed_dictionaries(
    {"opened": JSON, "due": JSON, "alerts": st.lists(st.lists(JSON, min_size=8, max_size=8), max_size=2)})))
def test_any_digest_memory_loads_or_is_refused(data: Any) -> None:
    digests = Digests(DigestConfig(), zone="Asia/Shanghai", clock=lambda: 1_800_000_000.0)
    try:
        digests.restore(data)
    except ValueError:
        return
    for robot in list(digests.snapshot()):
        batch = digests.take(robot)
        assert batch is not None
        render_digest(relay_config().robots["cn-bj"], batch, period=3600, zone="Asia/Shanghai", limit=19_000)
