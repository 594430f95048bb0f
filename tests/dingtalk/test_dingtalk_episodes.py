"""Dedup drops HA copies, never episodes; ordering drops late older states; memory survives.

The six-payload check from issue 36: two episodes of one alert and the copies two
Alertmanagers send, posted to the relay's real app, delivered to the DingTalk stand-in
over real HTTP (signature and keyword checked there).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk import memory
from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.payload import dedup_key, parse_webhook
from federation.localrun.dingtalk import LocalDingTalk

from .payloads import SECRET, alert, relay_config, webhook

TOKEN = "tok-episodes-1"
EP1 = ("2024-05-01T10:00:00Z", "2024-05-01T10:05:00Z")
EP2 = ("2024-05-01T10:07:00Z", "2024-05-01T10:09:30Z")


def state(episode: tuple[str, str], status: str, *, replica: int = 0) -> dict[str, Any]:
    """The group's notification for one episode's state, as replica ``replica`` sends it."""
    body = webhook([{**alert(1, status=status), "startsAt": episode[0],
                     "endsAt": episode[1] if status == "resolved" else "0001-01-01T00:00:00Z"}])
    return {**body, "externalURL": f"http://alertmanager-{replica}:9093"}


#: (name, seconds after the first on the relay's clock, body). A flapping alert: both
#: episodes within 5 minutes (the old 5-minute window swallowed the second). The HA copy
#: comes one peer_timeout (15 s) after the original; the late copy after the window.
SIX = [
    ("episode 1 FIRING", 0, state(EP1, "firing")),
    ("its HA copy", 15, state(EP1, "firing", replica=1)),
    ("episode 1 RESOLVED", 60, state(EP1, "resolved")),
    ("episode 2 FIRING", 120, state(EP2, "firing")),
    ("episode 2 RESOLVED", 180, state(EP2, "resolved")),
    ("late copy of episode 1 FIRING", 240, state(EP1, "firing", replica=1)),
]


@pytest.fixture
def api() -> Iterator[LocalDingTalk]:
    with LocalDingTalk() as server:
        yield server


class Clock:
    """The relay's clock: now, moved to each post's time (DingTalk checks the signing time)."""

    def __init__(self) -> None:
        self.base = self.now = time.time()

    def __call__(self) -> float:
        return self.now


def post_all(api: LocalDingTalk, posts: list[tuple[str, int, dict[str, Any]]], *, clock: Clock,
             data_dir: Path | None = None, registry: CollectorRegistry | None = None) -> list[str]:
    """Post each body at its time to a fresh relay app; the relay's answers' ``status``."""
    url = f"{api.base_url}/robot/send?access_token={TOKEN}"
    config = relay_config(url=url, robot={"secret": SECRET, "keywords": ["alert"]})

    async def main() -> list[str]:
        async with httpx.AsyncClient() as http:
            app = create_app(config, http_client=http, registry=registry or CollectorRegistry(),
                             data_dir=data_dir, clock=clock)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://r") as relay:
                answers = []
                for _, at, body in posts:
                    clock.now = max(clock.now, clock.base + at)
                    response = await relay.post("/dingtalk/cn-bj/send", json=body)
                    assert response.status_code == 200, response.text
                    answers.append(response.json()["status"])
                return answers

    return asyncio.run(main())


def shown(api: LocalDingTalk) -> list[str]:
    """What DingTalk showed: each message's title and the alert's times, as a reader sees them."""
    out = []
    for message in api.messages(TOKEN):
        text = message.text
        times = [word for word in text.split() if word.count(":") == 2 and len(word) == 8]
        out.append(f"{message.title} {' '.join(times)}")
    return out


def test_six_payloads_deliver_both_episodes_and_drop_the_copies(api: LocalDingTalk) -> None:
    api.add_robot(TOKEN, secret=SECRET, keywords=["alert"])
    registry = CollectorRegistry()
    answers = post_all(api, SIX, registry=registry, clock=Clock())
    assert dict(zip([name for name, _, _ in SIX], answers, strict=True)) == {
        "episode 1 FIRING": "sent", "its HA copy": "duplicate", "episode 1 RESOLVED": "sent",
        "episode 2 FIRING": "sent", "episode 2 RESOLVED": "sent", "late copy of episode 1 FIRING": "stale",
    }
    # Asia/Shanghai: 10:00Z is 18:00. Four messages, in order, each naming its episode.
    assert shown(api) == [
        "[FIRING:1] GPUXidError cn-bj 18:00:00",
        "[RESOLVED:1] GPUXidError cn-bj 18:00:00 18:05:00",
        "[FIRING:1] GPUXidError cn-bj 18:07:00",
        "[RESOLVED:1] GPUXidError cn-bj 18:07:00 18:09:30",
    ]
    sample = registry.get_sample_value
    assert sample("gpufed_dingtalk_dedup_dropped_total", {"robot": "cn-bj"}) == 1  # the HA copy only
    assert sample("gpufed_dingtalk_stale_dropped_total", {"robot": "cn-bj"}) == 1  # the late copy
    assert sample("gpufed_dingtalk_messages_sent_total", {"robot": "cn-bj"}) == 4


def test_key_names_the_episode_and_ignores_what_replicas_differ_in() -> None:
    def key(body: dict[str, Any]) -> str:
        return dedup_key("cn-bj", parse_webhook(json.dumps(body).encode()))

    assert key(state(EP1, "firing")) == key(state(EP1, "firing", replica=1))
    assert key(state(EP1, "firing")) != key(state(EP2, "firing"))
    assert key(state(EP1, "resolved")) != key(state(EP2, "resolved"))
    # The same instant in another offset is the same key.
    shifted = state(EP1, "firing")
    shifted["alerts"][0]["startsAt"] = "2024-05-01T18:00:00+08:00"
    assert key(shifted) == key(state(EP1, "firing"))
    # A firing alert's endsAt (zeroed by Alertmanager, moved by other senders) is not part of it.
    moving = state(EP1, "firing")
    moving["alerts"][0]["endsAt"] = "2024-05-01T10:04:00Z"
    assert key(moving) == key(state(EP1, "firing"))


def test_ordering_and_copies_survive_a_restart_with_a_data_dir(api: LocalDingTalk, tmp_path: Path) -> None:
    api.add_robot(TOKEN, secret=SECRET, keywords=["alert"])
    clock = Clock()
    first = post_all(api, SIX[:3], data_dir=tmp_path, clock=clock)
    assert first == ["sent", "duplicate", "sent"]
    saved = memory.load(tmp_path)
    assert len(saved.order) == 1 and len(saved.dedup) == 1  # episode 1 FIRING's key left the window
    assert not [p for p in tmp_path.iterdir() if p.name != memory.FILE_NAME]  # no temp file left
    # A new relay process on the same data dir, 10 s later: a copy of episode 1's RESOLVED
    # is still a copy, a late FIRING of episode 1 still older, and episode 2 still new.
    name, _, body = SIX[2]
    again = post_all(api, [(name, 70, body), SIX[5], SIX[3]], data_dir=tmp_path, clock=clock)
    assert again == ["duplicate", "stale", "sent"]
    assert len(api.messages(TOKEN)) == 3
    # Without a data dir the restart forgets, and the late copy is shown (why the file exists).
    assert post_all(api, [SIX[5]], clock=clock) == ["sent"]


@pytest.mark.parametrize("content", [
    b"{not json", b'{"version": 2}', b'{"version": 1, "order": [[1]], "dedup": []}',
    b'{"version": 1, "order": [["r","g","f",true,"x","y",null,0,null]], "dedup": []}',
])
def test_a_bad_memory_file_is_reported_and_the_relay_starts_empty(api: LocalDingTalk, tmp_path: Path,
                                                                   content: bytes) -> None:
    api.add_robot(TOKEN, secret=SECRET, keywords=["alert"])
    (tmp_path / memory.FILE_NAME).write_bytes(content)
    registry = CollectorRegistry()
    assert post_all(api, [SIX[0]], data_dir=tmp_path, registry=registry, clock=Clock()) == ["sent"]
    assert registry.get_sample_value("gpufed_dingtalk_memory_errors_total", {"op": "load"}) == 1
    assert len(memory.load(tmp_path).order) == 1  # rewritten whole after the next notification


def test_dedup_memory_expires_with_the_window(api: LocalDingTalk, tmp_path: Path) -> None:
    api.add_robot(TOKEN, secret=SECRET, keywords=["alert"])
    clock = Clock()
    assert post_all(api, [SIX[0]], data_dir=tmp_path, clock=clock) == ["sent"]
    assert post_all(api, [SIX[1]], data_dir=tmp_path, clock=clock) == ["duplicate"]  # 15 s later
    # 15 minutes later (a critical route's repeat_interval) the same notification is a
    # reminder, not a copy; the memory file forgot the key when the window passed.
    name, _, body = SIX[1]
    assert post_all(api, [(name, 900, body)], data_dir=tmp_path, clock=clock) == ["sent"]
    assert [at - clock.base for _, at in memory.load(tmp_path).dedup] == [900]
