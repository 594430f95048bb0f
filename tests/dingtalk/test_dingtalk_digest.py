"""The weekly digest of ``info`` alerts, on a fake clock: one message a period per robot.

Through the real app (``httpx.ASGITransport``) with DingTalk behind ``httpx.MockTransport``;
``flush_digests`` is what the app's timer calls, here called by the test after moving the
clock, so a simulated week takes no time. Periods run from the config's anchor (Monday
09:00 Asia/Shanghai by default).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from fastapi import FastAPI

from alertmanager.dingtalk import digest, memory
from alertmanager.dingtalk.app import create_app, flush_digests
from alertmanager.dingtalk.config import RelayConfig
from alertmanager.dingtalk.errors import ConfigError

from .payloads import alert, relay_config, webhook

DAY = 86400.0
WEEK = 7 * DAY
#: Monday 2024-05-06 09:00 in Shanghai: the anchor's weekly boundary.
MONDAY = datetime(2024, 5, 6, 9, 0, tzinfo=ZoneInfo("Asia/Shanghai")).timestamp()


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config(**digest_config: Any) -> RelayConfig:
    return relay_config(digest={"period": "7d", **digest_config})


def info(i: int, **changes: Any) -> dict[str, Any]:
    return {**alert(i, alertname=f"GPUIdle{i}", severity="info"), **changes}


def critical(i: int) -> dict[str, Any]:
    return alert(i, alertname="GPUXidError", severity="critical")


class DingTalk:
    """Accepts every message (or answers the scripted errcodes first) and records them."""

    def __init__(self, *codes: int) -> None:
        self.sent: list[dict[str, Any]] = []
        self.script = list(codes)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        code = self.script.pop(0) if self.script else 0
        if code == 0:
            self.sent.append(json.loads(request.content))
        return httpx.Response(200, json={"errcode": code, "errmsg": "scripted"})

    def digests(self) -> list[str]:
        return [m["markdown"]["text"] for m in self.sent if m["markdown"]["title"].startswith("[DIGEST")]

    def others(self) -> list[str]:
        return [m["markdown"]["title"] for m in self.sent if not m["markdown"]["title"].startswith("[DIGEST")]


Scenario = Callable[[httpx.AsyncClient, FastAPI], Awaitable[None]]


def run(api: DingTalk, clock: FakeClock, scenario: Scenario, *, relay: RelayConfig | None = None,
        data_dir: Path | None = None) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(api)) as http:
            app = create_app(relay or config(), http_client=http, clock=clock, data_dir=data_dir)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://relay") as client:
                await scenario(client, app)
            for sender in app.state.relay.senders.values():
                await sender.aclose()

    asyncio.run(main())


async def post(client: httpx.AsyncClient, alerts: list[dict[str, Any]], group: str = "g1") -> str:
    response = await client.post("/dingtalk/cn-bj/send", json=webhook(alerts, group=group))
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def test_a_week_of_info_alerts_is_one_digest(tmp_path: Path) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + 3600)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        relay = app.state.relay
        for day in range(5):
            clock.now = MONDAY + 3600 + day * DAY
            assert await post(client, [info(day)], group=f"info-{day}") == "digested"
            assert await post(client, [info(day)], group=f"info-{day}") == "digested"  # the HA copy
            assert await flush_digests(relay) == 0
        # An earlier alert resolves mid-week; a critical one goes out at once, as before.
        resolved = info(1, status="resolved", endsAt="2024-05-08T02:00:00Z")
        assert await post(client, [resolved], group="info-1") == "digested"
        assert await post(client, [critical(9)], group="crit") == "sent"
        assert api.digests() == [] and len(api.others()) == 1
        clock.now = MONDAY + WEEK - 1
        assert await flush_digests(relay) == 0
        clock.now = MONDAY + WEEK + 30
        assert await flush_digests(relay) == 1
        assert await flush_digests(relay) == 0
        clock.now += WEEK  # a week without info alerts: nothing
        assert await flush_digests(relay) == 0

    run(api, clock, scenario, data_dir=tmp_path,
        relay=relay_config(digest={"period": "7d"}, robot={"keywords": ["gpufed"]}))
    [text] = api.digests()
    assert "[DIGEST] 5 info alert(s), 2024-05-06 09:00 to 2024-05-13 09:00" in text
    assert "4 still firing, 1 resolved" in text
    for day in range(5):
        assert f"**GPUIdle{day}**" in text and f"node=node-{day:04d}" in text
    assert text.count("**GPUIdle1**") == 1 and "resolved 2024-05-08 10:00" in text
    assert "GPUXidError" not in text and "@13800000000" not in text  # no page in a digest
    assert text.endswith("\n\ngpufed")  # the robot's keyword, which DingTalk requires
    assert len(api.others()) == 1 and api.others()[0].startswith("[FIRING:1]")


def test_a_restart_in_mid_week_keeps_the_batch(tmp_path: Path) -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)

    async def first(client: httpx.AsyncClient, app: FastAPI) -> None:
        assert await post(client, [info(1), info(2)]) == "digested"

    async def second(client: httpx.AsyncClient, app: FastAPI) -> None:
        pending = app.state.relay.digests.pending("cn-bj")
        assert pending is not None and len(pending.entries) == 2
        clock.now = MONDAY + 3 * DAY
        assert await post(client, [info(3)], group="g3") == "digested"
        clock.now = MONDAY + WEEK
        assert await flush_digests(app.state.relay) == 1

    run(api, clock, first, data_dir=tmp_path)
    saved = memory.load(tmp_path).digest
    assert sorted(row[1] for row in saved["cn-bj"]["alerts"]) == ["GPUIdle1", "GPUIdle2"]
    run(api, clock, second, data_dir=tmp_path)
    [text] = api.digests()
    assert all(f"**GPUIdle{i}**" in text for i in (1, 2, 3))
    assert memory.load(tmp_path).digest == {}  # sent: the memory no longer holds it


def test_a_failed_digest_is_kept_and_sent_next_time() -> None:
    api, clock = DingTalk(-1), FakeClock(MONDAY + DAY)  # -1: DingTalk busy (transient)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        assert await post(client, [info(1)]) == "digested"
        clock.now = MONDAY + WEEK + 1
        assert await flush_digests(app.state.relay) == 0
        assert await post(client, [info(2)], group="g2") == "digested"  # joins the batch that failed
        assert await flush_digests(app.state.relay) == 1

    run(api, clock, scenario)
    [text] = api.digests()
    assert "**GPUIdle1**" in text and "**GPUIdle2**" in text


def test_mixed_notifications_send_the_rest_and_no_digest_leaves_info_alone() -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        assert await post(client, [critical(2), info(1)]) == "sent"
        clock.now = MONDAY + WEEK + 1
        assert await flush_digests(app.state.relay) == 1

    run(api, clock, scenario)
    text = api.sent[0]["markdown"]["text"]
    assert len(api.others()) == 1 and "node-0002" in text and "node-0001" not in text
    assert "**GPUIdle1**" in api.digests()[0]

    plain = DingTalk()

    async def without(client: httpx.AsyncClient, app: FastAPI) -> None:
        assert await post(client, [info(1)]) == "sent"  # no digest configured: sent as before
        clock.now += 2 * WEEK
        assert await flush_digests(app.state.relay) == 0

    run(plain, clock, without, relay=relay_config())
    assert plain.digests() == [] and len(plain.others()) == 1


def test_periods_follow_the_anchor() -> None:
    anchor = MONDAY - 18 * WEEK
    assert digest.period_end(MONDAY + 1, period=WEEK, anchor=anchor) == MONDAY + WEEK
    assert digest.period_end(MONDAY, period=WEEK, anchor=anchor) == MONDAY + WEEK
    assert digest.period_end(MONDAY - 1, period=WEEK, anchor=anchor) == MONDAY
    assert digest.period_end(MONDAY + 1, period=DAY, anchor=anchor) == MONDAY + DAY


def test_a_big_batch_stays_under_the_limit_and_counts_the_rest() -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)
    long = "GPU idle for a long time " * 20

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        alerts = [{**info(i), "annotations": {"summary": long}} for i in range(digest.MAX_ENTRIES + 7)]
        assert await post(client, alerts) == "digested"
        clock.now = MONDAY + WEEK
        assert await flush_digests(app.state.relay) == 1

    run(api, clock, scenario)
    [message] = [m for m in api.sent if m["markdown"]["title"].startswith("[DIGEST")]
    size = len(json.dumps(message, ensure_ascii=False).encode())
    assert size <= config().max_message_bytes
    text = message["markdown"]["text"]
    assert f"[DIGEST] {digest.MAX_ENTRIES + 7} info alert(s)" in text
    listed = text.count("- **GPUIdle")
    assert listed >= 40, listed  # as many as fit, not a handful
    assert f"- (+{digest.MAX_ENTRIES + 7 - listed} more)" in text


@pytest.mark.parametrize(("field", "value", "words"), [
    ("period", "30s", "greater than or equal to 60"),
    ("period", "a week", "not a duration"),
    ("anchor", "2024-01-01T09:00:00+08:00", "drop the offset"),
    ("anchor", "monday", "ISO date and time"),
])
def test_bad_digest_config_names_the_field(field: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(**{field: value})
    assert caught.value.field == f"digest.{field}" and words in caught.value.detail


def test_a_malformed_digest_in_the_memory_file_starts_empty(tmp_path: Path) -> None:
    path = memory.memory_path(tmp_path)
    path.write_text(json.dumps({"version": 1, "order": [], "dedup": [],
                                "digest": {"cn-bj": {"opened": 1, "due": 2, "alerts": [["x"]]}}}))
    api, clock = DingTalk(), FakeClock(MONDAY)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        assert app.state.relay.digests.pending("cn-bj") is None
        assert app.state.relay.registry.get_sample_value(
            "gpufed_dingtalk_memory_errors_total", {"op": "load"}) == 1.0

    run(api, clock, scenario, data_dir=tmp_path)


def test_a_later_episode_counts_and_a_late_copy_changes_nothing() -> None:
    api, clock = DingTalk(), FakeClock(MONDAY + DAY)

    async def scenario(client: httpx.AsyncClient, app: FastAPI) -> None:
        first = info(1, startsAt="2024-05-07T01:00:00Z")
        assert await post(client, [first]) == "digested"
        ended = {**first, "status": "resolved", "endsAt": "2024-05-07T02:00:00Z"}
        assert await post(client, [ended]) == "digested"
        assert await post(client, [first]) == "digested"  # a replica's late FIRING: older news
        assert await post(client, [info(1, startsAt="2024-05-08T01:00:00Z")]) == "digested"
        clock.now = MONDAY + WEEK
        assert await flush_digests(app.state.relay) == 1

    run(api, clock, scenario)
    [text] = api.digests()
    assert "**GPUIdle1** (2 times)" in text and "1 still firing, 0 resolved" in text
    assert "since 2024-05-08 09:00, firing" in text
