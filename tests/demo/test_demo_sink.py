"""The demo's DingTalk sink and child router, over real HTTP on loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from alertmanager.dingtalk.sign import signed_url
from federation.demo.router import ChildRouter
from federation.demo.sink import DingTalkSink, Message, Robot, as_group_sees_it
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer

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



def test_a_hung_child_whose_scraper_hung_up_first_prints_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A frozen child (SIGSTOP) outlasts the master's scrape timeout: the router's 502 then
    goes to a closed connection, which is no error of the router's (it printed a traceback)."""
    with socket.create_server(("127.0.0.1", 0)) as hung, ChildRouter(timeout=0.5) as router:
        router.set("region-0-0", hung.getsockname()[1])
        url = router.template().format(child="region-0-0") + "/metrics"
        with pytest.raises(httpx.TimeoutException):
            httpx.get(url, timeout=0.1)  # the scraper gives up and hangs up
        conn, _ = hung.accept()  # the router's request, never answered
        with conn:
            conn.settimeout(5)
            while conn.recv(4096):  # until the router gives up on the child
                pass
        # The router answers right after it gives up; a later request through it is served
        # after that answer was written (or failed) on the router's side.
        time.sleep(0.5)
        router.remove("region-0-0")
        assert httpx.get(router.template().format(child="region-0-0"), timeout=5).status_code == 502
    assert "Traceback" not in capfd.readouterr().err
