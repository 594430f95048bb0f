"""Relay hard edges: body limit, secrets in config errors, 404 text, @all once, dropped
notifications re-sent, and the back-off after DingTalk's 130101."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from alertmanager.dingtalk.app import reload_config
from alertmanager.dingtalk.cli import cli
from alertmanager.dingtalk.config import load_config
from alertmanager.dingtalk.errors import ConfigError
from alertmanager.dingtalk.ratelimit import BACKOFF_FIRST, BACKOFF_MAX, RateLimiter

from .payloads import alert, relay_config, webhook
from .test_dingtalk_app import FakeClock, errcodes, metric, post, run

REAL_TOKEN = "tok-live-4f1e9a77"
REAL_SECRET = "SEClive-b8c2d0e6a1"


# -- request body limit ------------------------------------------------------------------

def test_body_over_limit_is_413_with_or_without_content_length() -> None:
    config = relay_config(max_request_bytes=4096)
    sent: list[dict[str, Any]] = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b"x" * 1000

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        big = await relay.post("/dingtalk/cn-bj/send", content=b"{" + b" " * 5000 + b"}")
        assert big.status_code == 413 and big.headers["content-type"] == "application/problem+json"
        assert "4096-byte limit" in big.json()["detail"]
        streamed = await relay.post("/dingtalk/cn-bj/send", content=chunks())
        assert streamed.status_code == 413
        assert (await post(relay, webhook([alert(1)]))).status_code == 200  # under the limit

    run(errcodes(sent=sent), scenario, config=config)
    assert len(sent) == 1


# -- secrets in config errors --------------------------------------------------------------

BROKEN = [
    # an unterminated quote on the secret line
    f'robots:\n  cn-bj:\n    url: https://oapi.dingtalk.com/robot/send?access_token={REAL_TOKEN}\n'
    f'    secret: "{REAL_SECRET}\n',
    # a stray ": " inside the URL line
    f'robots:\n  cn-bj:\n    url: https://oapi.dingtalk.com/robot/send?access_token={REAL_TOKEN}: x\n'
    f'    secret: {REAL_SECRET}\n',
    # a tab indent right before the secret
    f'robots:\n  cn-bj:\n\tsecret: {REAL_SECRET}\n',
    # flow mapping never closed
    f'robots: {{cn-bj: {{url: "https://x/send?access_token={REAL_TOKEN}", secret: {REAL_SECRET}\n',
    # a bad escape inside the double-quoted secret
    f'robots:\n  cn-bj:\n    url: https://x/send?access_token={REAL_TOKEN}\n    secret: "{REAL_SECRET}\\q"\n',
]


@pytest.mark.parametrize("text", BROKEN)
def test_yaml_errors_never_echo_secrets(text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "relay.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert "YAML syntax error at line" in error.value.detail
    result = CliRunner().invoke(cli, ["--config", str(path), "--check"])
    assert result.exit_code == 2
    assert "line" in result.output
    # a running relay reloading this file on SIGHUP
    good = tmp_path / "good.yml"
    good.write_text("robots:\n  cn-bj:\n    url: https://x/send?access_token=tok-other-1\n")

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        with caplog.at_level(logging.DEBUG):
            assert reload_config(apps[0].state.relay, path) is False

    apps: list[FastAPI] = []
    run(errcodes(sent=[]), scenario, config=load_config(good), on_app=apps.append)
    assert "keeping the old config" in caplog.text
    for text_out in (error.value.detail, result.output, caplog.text):
        assert REAL_SECRET not in text_out and REAL_TOKEN not in text_out


# -- 404 ------------------------------------------------------------------------------------

def test_unknown_robot_404_lists_nothing() -> None:
    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await post(relay, webhook([alert(1)]), robot="cn-sh")
        assert response.status_code == 404
        assert response.json()["detail"] == "unknown robot 'cn-sh'"
        assert "cn-bj" not in response.text

    run(errcodes(sent=[]), scenario)


# -- @all ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 300])
def test_at_all_once_per_notification(count: int) -> None:
    sent: list[dict[str, Any]] = []
    config = relay_config(robot={"mentions": {"all_on_critical": True}})
    body = webhook([alert(i, severity="critical") for i in range(count)])

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        assert (await post(relay, body)).json()["status"] == "sent"
        assert (await post(relay, webhook([alert(i, severity="critical") for i in range(2)], group="g2")))\
            .json()["status"] == "sent"

    run(errcodes(sent=sent), scenario, config=config)
    flags = [m["at"]["isAtAll"] for m in sent]
    parts = len(sent) - 1
    assert parts == 1 if count == 1 else parts > 1
    assert flags == [True] + [False] * (parts - 1) + [True], "once per notification, not per part"


# -- dropped is not duplicate ---------------------------------------------------------------

def test_dropped_notification_is_tried_again_when_resent() -> None:
    sent: list[dict[str, Any]] = []
    body = webhook([alert(1), alert(2)])

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        first = (await post(relay, body)).json()
        assert first["status"] == "dropped" and first["reason"] == "errcode_310000"
        again = (await post(relay, body)).json()  # Alertmanager re-sends (or the robot was fixed)
        assert again["status"] == "sent"
        assert (await post(relay, body)).json()["status"] == "duplicate"  # now it really is one
        assert metric(registry, "gpufed_dingtalk_dedup_dropped_total") == 1

    run(errcodes(310000, sent=sent), scenario)
    assert len(sent) == 1


# -- back-off after 130101 ----------------------------------------------------------------

def test_limiter_back_off_doubles_to_ten_minutes_and_resets() -> None:
    now = [0.0]
    limiter = RateLimiter(18, clock=lambda: now[0])
    assert [limiter.back_off() for _ in range(6)] == [60, 120, 240, 480, 600, 600]
    assert limiter.wait_time() == BACKOFF_MAX and not limiter.try_acquire()
    now[0] += BACKOFF_MAX
    assert limiter.try_acquire()
    limiter.succeeded()
    assert limiter.back_off() == BACKOFF_FIRST


def test_robot_backs_off_after_130101() -> None:
    sent: list[dict[str, Any]] = []
    calls: list[int] = []
    clock = FakeClock()
    script = errcodes(130101, 130101, sent=sent)

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return script(request)

    config = relay_config(max_wait="300ms")

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        first = await post(relay, webhook([alert(1)], group="a"))
        assert first.status_code == 503 and first.headers["retry-after"] == "60"
        # DingTalk muted the robot: nothing is sent while the back-off lasts
        held = await post(relay, webhook([alert(2)], group="b"))
        assert held.status_code == 503 and int(held.headers["retry-after"]) == 60
        assert len(calls) == 1
        clock.now += 61
        second = await post(relay, webhook([alert(2)], group="b"))
        assert second.status_code == 503 and second.headers["retry-after"] == "120"  # doubled
        assert len(calls) == 2
        clock.now += 121
        assert (await post(relay, webhook([alert(2)], group="b"))).status_code == 200
        assert metric(registry, "gpufed_dingtalk_send_failures_total", kind="transient",
                      reason="errcode_130101") == 2

    run(handler, scenario, config=config, clock=clock)
    assert len(sent) == 1
