"""The local DingTalk (``federation.localrun.dingtalk``) over real HTTP: DingTalk's answers
to signed, unsigned, oversized, malformed, unkeyworded and too-frequent messages, the group's
view the demo prints, the heartbeat count, and the process the compose runner starts."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import stop_process

from alertmanager.dingtalk.sign import signed_url
from federation.localrun.dingtalk import PER_MINUTE, LocalDingTalk, Message, Rejection, as_group_sees_it
from tests.webconfig.pki import Pki

SECRET = "SEC" + "5" * 40


@pytest.fixture
def dingtalk() -> Iterator[LocalDingTalk]:
    seen: list[Message] = []
    with LocalDingTalk(on_message=seen.append) as server:
        server.add_robot("tok-bj", secret=SECRET, name="bj")
        server.seen = seen  # type: ignore[attr-defined]
        yield server


def send(dingtalk: LocalDingTalk, *, secret: str = SECRET, token: str = "tok-bj", text: str = "GPU hot",
         body: Any = None) -> Any:
    url = f"{dingtalk.base_url}/robot/send?access_token={token}"
    body = {"msgtype": "markdown", "markdown": {"title": "GPU", "text": text}} if body is None else body
    # The relay's own signer: the local DingTalk checks it with code of its own.
    return httpx.post(signed_url(url, secret, int(time.time() * 1000)), json=body, timeout=5).json()


def test_signed_message_is_accepted_recorded_and_shown(dingtalk: LocalDingTalk) -> None:
    assert send(dingtalk, text="### GPUXidError\n- node=gpu-1") == {"errcode": 0, "errmsg": "ok"}
    (message,) = dingtalk.snapshot().messages
    assert message.robot == "bj" and message.title == "GPU"
    assert message.body == {"msgtype": "markdown",
                            "markdown": {"title": "GPU", "text": "### GPUXidError\n- node=gpu-1"}}
    assert dingtalk.messages("tok-bj") == [message]
    assert dingtalk.seen == [message]  # type: ignore[attr-defined]
    shown = as_group_sees_it(message)
    assert "robot bj" in shown and "│ ### GPUXidError" in shown and "│ - node=gpu-1" in shown


def test_bad_signature_and_unknown_robot_are_refused_like_dingtalk(dingtalk: LocalDingTalk) -> None:
    assert send(dingtalk, secret="SEC" + "6" * 40)["errcode"] == 310000
    assert send(dingtalk, token="tok-nobody") == {"errcode": 300001, "errmsg": "token is not exist"}
    unsigned = httpx.post(f"{dingtalk.base_url}/robot/send?access_token=tok-bj",
                          json={"msgtype": "text", "text": {"content": "x"}}, timeout=5).json()
    assert unsigned == {"errcode": 310000, "errmsg": "sign not match: timestamp/sign missing"}
    inbox = dingtalk.snapshot()
    assert inbox.messages == [] and [r.errcode for r in inbox.rejected] == [310000, 310000]
    assert dingtalk.rejected("tok-bj") == inbox.rejected


def test_too_long_malformed_and_unkeyworded_messages_are_refused(dingtalk: LocalDingTalk) -> None:
    assert send(dingtalk, text="x" * 20_000)["errcode"] == 460101
    assert send(dingtalk, body={"markdown": {"title": "no msgtype"}})["errcode"] == 40035
    dingtalk.add_robot("tok-kw", keywords=["告警"])  # keyword-only security: no secret
    assert send(dingtalk, token="tok-kw", text="GPU hot")["errcode"] == 310000
    assert send(dingtalk, token="tok-kw", text="告警: GPU hot")["errcode"] == 0
    assert [r.errcode for r in dingtalk.rejected("tok-bj")] == [460101, 40035]
    assert dingtalk.rejected("tok-kw") == [Rejection("tok-kw", 310000, "keywords not in content")]
    assert [m.text for m in dingtalk.messages("tok-kw")] == ["告警: GPU hot"]


def test_the_twenty_first_message_in_a_minute_is_130101_and_scripts_answer_first(
    dingtalk: LocalDingTalk,
) -> None:
    dingtalk.script("tok-bj", 130101, 0)
    assert send(dingtalk)["errcode"] == 130101  # scripted, then answered as usual
    answers = [send(dingtalk)["errcode"] for _ in range(PER_MINUTE + 1)]
    assert answers == [0] * PER_MINUTE + [130101]
    assert [r.errmsg for r in dingtalk.rejected("tok-bj")] == [
        "scripted", "send too fast, exceed 20 times per minute"]
    assert len(dingtalk.messages("tok-bj")) == PER_MINUTE


def test_one_robot_name_is_one_token(dingtalk: LocalDingTalk) -> None:
    with pytest.raises(ValueError, match="robot name 'bj' is already taken"):
        dingtalk.add_robot("tok-other", name="bj")


def test_heartbeats_are_counted_and_listed(dingtalk: LocalDingTalk) -> None:
    for _ in range(2):
        watchdog = {"alerts": [{"labels": {"alertname": "Watchdog"}}]}
        assert httpx.post(f"{dingtalk.base_url}/heartbeat", json=watchdog, timeout=5).status_code == 200
    assert send(dingtalk, secret="SECwrong")["errcode"] == 310000
    assert send(dingtalk, text="GPU hot") == {"errcode": 0, "errmsg": "ok"}
    doc = httpx.get(f"{dingtalk.base_url}/v1/messages", timeout=5).json()
    assert doc["heartbeats"] == 2
    assert [(m["robot"], m["text"], m["body"]["markdown"]["title"]) for m in doc["messages"]] == [
        ("bj", "GPU hot", "GPU")]
    assert doc["rejected"] == [
        {"robot": "bj", "errcode": 310000, "errmsg": "sign not match: signature mismatch"}]


def test_as_a_process_it_serves_https_with_the_robots_of_a_file(tmp_path: Path) -> None:
    """What the compose runner starts (``python -m federation.localrun.dingtalk``), on a port of its own."""
    pki = Pki(tmp_path)
    leaf = pki.server()
    robots = tmp_path / "robots.json"
    robot = {"name": "cn-bj", "token": "tok-bj", "secret": SECRET, "keywords": ["GPU"]}
    robots.write_text(json.dumps([robot]))
    proc = subprocess.Popen([sys.executable, "-m", "federation.localrun.dingtalk", "--robots", str(robots),
                             "--cert", str(leaf.cert), "--key", str(leaf.key)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().decode().strip()  # the base URL, once it listens
        assert base.startswith("https://127.0.0.1:"), base
        url = signed_url(f"{base}/robot/send?access_token=tok-bj", SECRET, int(time.time() * 1000))
        body = {"msgtype": "markdown", "markdown": {"title": "t", "text": "GPU hot"}}
        with httpx.Client(verify=ssl.create_default_context(cafile=str(pki.ca_file)), timeout=5) as client:
            assert client.post(url, json=body).json() == {"errcode": 0, "errmsg": "ok"}
            doc = client.get(f"{base}/v1/messages").json()
        assert [(m["robot"], m["body"]) for m in doc["messages"]] == [("cn-bj", body)]
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_bad_robots_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    robots = tmp_path / "robots.json"
    robots.write_text('{"token": "not a list"}')
    done = subprocess.run([sys.executable, "-m", "federation.localrun.dingtalk", "--robots", str(robots)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert f"--robots {robots}" in done.stderr and "Traceback" not in done.stderr
