"""The demo's DingTalk sink and child router, over real HTTP on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from alertmanager.dingtalk.sign import signed_url
from federation.demo.loopback import LoopbackHandler, LoopbackHTTPServer
from federation.demo.router import ChildRouter
from federation.demo.sink import DingTalkSink, Message, Robot, as_group_sees_it

SECRET = "SEC" + "5" * 40


@pytest.fixture
def sink() -> Iterator[DingTalkSink]:
    seen: list[Message] = []
    with DingTalkSink({"bj": Robot(name="bj", token="tok-bj", secret=SECRET)}, on_message=seen.append) as s:
        s.seen = seen  # type: ignore[attr-defined]
        yield s


def send(sink: DingTalkSink, *, secret: str = SECRET, token: str = "tok-bj", text: str = "GPU hot") -> Any:
    url = f"http://127.0.0.1:{sink.port}/robot/send?access_token={token}"
    body = {"msgtype": "markdown", "markdown": {"title": "GPU", "text": text}}
    # The relay's own signer: the sink checks it with code of its own.
    return httpx.post(signed_url(url, secret, int(time.time() * 1000)), json=body, timeout=5).json()


def test_signed_message_is_accepted_recorded_and_shown(sink: DingTalkSink) -> None:
    assert send(sink, text="### GPUXidError\n- node=gpu-1") == {"errcode": 0, "errmsg": "ok"}
    (message,) = sink.snapshot().messages
    assert message.robot == "bj" and message.title == "GPU"
    assert sink.seen == [message]  # type: ignore[attr-defined]
    shown = as_group_sees_it(message)
    assert "robot bj" in shown and "│ ### GPUXidError" in shown and "│ - node=gpu-1" in shown


def test_bad_signature_and_unknown_robot_are_refused_like_dingtalk(sink: DingTalkSink) -> None:
    assert send(sink, secret="SEC" + "6" * 40)["errcode"] == 310000
    assert send(sink, token="tok-nobody")["errcode"] == 300001
    unsigned = httpx.post(f"http://127.0.0.1:{sink.port}/robot/send?access_token=tok-bj",
                          json={"msgtype": "text", "text": {"content": "x"}}, timeout=5).json()
    assert unsigned["errcode"] == 310000
    inbox = sink.snapshot()
    assert inbox.messages == [] and [code for _, code, _ in inbox.rejected] == [310000, 310000]


def test_heartbeats_are_counted_and_listed(sink: DingTalkSink) -> None:
    base = f"http://127.0.0.1:{sink.port}"
    for _ in range(2):
        assert httpx.post(f"{base}/heartbeat", json={"alerts": [{"labels": {"alertname": "Watchdog"}}]},
                          timeout=5).status_code == 200
    doc = httpx.get(f"{base}/messages", timeout=5).json()
    assert doc["heartbeats"] == 2 and doc["messages"] == []


class _Targets(LoopbackHandler):
    def do_GET(self) -> None:
        self.reply(200, {"path": self.path}, content_type="application/json")


def test_router_reaches_a_child_by_name_and_refuses_unknown_ones() -> None:
    with LoopbackHTTPServer(_Targets) as child, ChildRouter() as router:
        router.set("region-0-2", child.port)
        base = router.template().format(child="region-0-2")
        answer = httpx.get(f"{base}/api/v1/targets?state=active", timeout=5)
        assert answer.status_code == 200
        assert answer.json() == {"path": "/api/v1/targets?state=active"}
        unknown = router.template().format(child="nope")
        assert httpx.get(f"{unknown}/-/ready", timeout=5).status_code == 502
        router.remove("region-0-2")
        assert httpx.get(f"{base}/-/ready", timeout=5).status_code == 502

