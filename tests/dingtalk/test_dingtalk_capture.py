"""The relay against the local DingTalk: real HTTP, signature and keyword checked there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.app import create_app
from federation.localrun.dingtalk import LocalDingTalk, Rejection

from .payloads import SECRET, alert, relay_config, webhook


@pytest.fixture
def api() -> Iterator[LocalDingTalk]:
    with LocalDingTalk() as server:
        yield server


def deliver(api: LocalDingTalk, *, secret: str, keywords: list[str], bodies: list[dict[str, object]],
            script: tuple[int, ...] = (), clock: Callable[[], float] = time.time,
            between: Callable[[], None] = lambda: None) -> tuple[list[int], CollectorRegistry]:
    url = api.add_robot("tok-capture-1", secret=SECRET, keywords=["告警"])
    api.script("tok-capture-1", *script)
    config = relay_config(url=url, robot={"secret": secret, "keywords": keywords})
    registry = CollectorRegistry()

    async def main() -> list[int]:
        async with httpx.AsyncClient() as http:
            app = create_app(config, http_client=http, registry=registry, clock=clock)
            transport = httpx.ASGITransport(app=app)
            statuses = []
            async with httpx.AsyncClient(transport=transport, base_url="http://r") as relay:
                for body in bodies:
                    statuses.append((await relay.post("/dingtalk/cn-bj/send", json=body)).status_code)
                    between()
            return statuses

    return asyncio.run(main()), registry


def test_signed_message_with_keyword_is_accepted(api: LocalDingTalk) -> None:
    statuses, _ = deliver(api, secret=SECRET, keywords=["告警"], bodies=[webhook([alert(1)])])
    assert statuses == [200]
    assert api.rejected("tok-capture-1") == []
    (message,) = api.messages("tok-capture-1")
    assert "node=node-0001" in message.text and message.text == message.body["markdown"]["text"]


def test_wrong_secret_is_permanent(api: LocalDingTalk) -> None:
    body = webhook([alert(1)])
    statuses, registry = deliver(api, secret="SECwrong-secret", keywords=["告警"], bodies=[body])
    assert statuses == [200]
    assert api.rejected("tok-capture-1") == [
        Rejection("tok-capture-1", 310000, "sign not match: signature mismatch")]
    labels = {"robot": "cn-bj", "kind": "permanent", "reason": "errcode_310000"}
    assert registry.get_sample_value("gpufed_dingtalk_send_failures_total", labels) == 1


def test_missing_keyword_is_rejected_by_dingtalk(api: LocalDingTalk) -> None:
    statuses, _ = deliver(api, secret=SECRET, keywords=[], bodies=[webhook([alert(1)])])
    assert statuses == [200]
    assert api.rejected("tok-capture-1") == [Rejection("tok-capture-1", 310000, "keywords not in content")]


def test_scripted_130101_is_retried_by_the_sender_of_the_webhook(api: LocalDingTalk) -> None:
    body = webhook([alert(1)])
    skew = [0.0]

    def later() -> None:  # Alertmanager's retries arrive 30 s, then 31 s more, apart
        skew[0] += 30 if skew[0] == 0 else 31

    statuses, _ = deliver(api, secret=SECRET, keywords=["告警"], bodies=[body, body, body], script=(130101,),
                          clock=lambda: time.time() + skew[0], between=later)
    assert statuses == [503, 503, 200], "the robot backs off 60 s after 130101"
    assert len(api.messages("tok-capture-1")) == 1
