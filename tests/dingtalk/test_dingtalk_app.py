"""The relay app over ``httpx.MockTransport``: error mapping, throttling, dedup, merging."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.app import create_app, reload_config
from alertmanager.dingtalk.config import RelayConfig, load_config

from .payloads import SECRET, TOKEN, alert, relay_config, webhook

Handler = Callable[[httpx.Request], httpx.Response]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def errcodes(*codes: int, sent: list[dict[str, Any]]) -> Handler:
    """DingTalk answering the given errcodes in turn (then 0), recording accepted bodies."""
    script = list(codes)

    def handle(request: httpx.Request) -> httpx.Response:
        code = script.pop(0) if script else 0
        if code == 0:
            sent.append(json.loads(request.content))
        return httpx.Response(200, json={"errcode": code, "errmsg": "scripted"})

    return handle


def run(handler: Handler, scenario: Callable[[httpx.AsyncClient, CollectorRegistry], Awaitable[None]], *,
        config: RelayConfig | None = None, clock: FakeClock | None = None,
        on_app: Callable[[FastAPI], None] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            app = create_app(config or relay_config(), http_client=http, clock=clock or FakeClock(),
                             registry=registry)
            if on_app is not None:
                on_app(app)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://relay") as relay:
                await scenario(relay, registry)

    asyncio.run(main())
    return registry


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"robot": "cn-bj", **labels}) or 0.0


def post(relay: httpx.AsyncClient, body: dict[str, Any], robot: str = "cn-bj") -> Awaitable[httpx.Response]:
    return relay.post(f"/dingtalk/{robot}/send", json=body)


@pytest.mark.parametrize(("codes", "status", "reason"), [
    ((0,), 200, None),
    ((130101,), 503, ("transient", "errcode_130101")),
    ((310000,), 200, ("permanent", "errcode_310000")),
])
def test_errcode_mapping(codes: tuple[int, ...], status: int, reason: tuple[str, str] | None) -> None:
    sent: list[dict[str, Any]] = []

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await post(relay, webhook([alert(1)]))
        assert response.status_code == status
        if status == 503:
            assert response.headers["content-type"] == "application/problem+json"
            assert "130101" in response.json()["detail"]
        if reason:
            kind, why = reason
            assert metric(registry, "gpufed_dingtalk_send_failures_total", kind=kind, reason=why) == 1

    run(errcodes(*codes, sent=sent), scenario)
    assert len(sent) == (1 if codes == (0,) else 0)


@pytest.mark.parametrize("answer", [
    httpx.Response(502, text="bad gateway"),
    httpx.ConnectError("connection refused"),
])
def test_transport_failures_are_transient(answer: httpx.Response | Exception) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await post(relay, webhook([alert(1)]))
        assert response.status_code == 503

    run(handle, scenario)


def test_permanent_http_4xx_answers_200_with_reason() -> None:
    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await post(relay, webhook([alert(1)]))
        assert response.status_code == 200 and response.json()["reason"] == "http_403"

    run(lambda request: httpx.Response(403), scenario)


def test_retry_after_transient_failure_resends_only_missing_parts() -> None:
    sent: list[dict[str, Any]] = []
    big = webhook([alert(i) for i in range(300)])

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        assert (await post(relay, big)).status_code == 503  # part 1 accepted, part 2 refused
        assert (await post(relay, big)).status_code == 200  # Alertmanager's retry
        assert (await post(relay, big)).status_code == 200  # later copy: duplicate
        assert metric(registry, "gpufed_dingtalk_dedup_dropped_total") == 1

    run(errcodes(0, -1, sent=sent), scenario)  # -1: DingTalk busy (130101 also backs off)
    texts = [m["markdown"]["text"] for m in sent]
    assert len(texts) == 3, "300 alerts need 3 parts; each delivered exactly once"
    assert [f"({k}/3)" in text for k, text in enumerate(texts, start=1)] == [True, True, True]


def test_rate_limit_answers_503_with_retry_after_then_recovers() -> None:
    sent: list[dict[str, Any]] = []
    clock = FakeClock()
    config = relay_config(max_wait="300ms", robot={"rate_per_minute": 2})

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        for group in ("a", "b"):
            assert (await post(relay, webhook([alert(1)], group=group))).status_code == 200
        clock.now += 30
        throttled = await post(relay, webhook([alert(1)], group="c"))
        assert throttled.status_code == 503
        assert throttled.headers["retry-after"] == "30"
        assert metric(registry, "gpufed_dingtalk_throttled_total") == 1
        assert metric(registry, "gpufed_dingtalk_queued_messages") == 0, "withdrawn from the queue"
        clock.now += 30
        assert (await post(relay, webhook([alert(1)], group="c"))).status_code == 200

    run(errcodes(sent=sent), scenario, config=config, clock=clock)
    assert len(sent) == 3


def test_queued_notifications_are_merged_into_one_message() -> None:
    sent: list[dict[str, Any]] = []
    clock = FakeClock()
    config = relay_config(max_wait="5s", robot={"rate_per_minute": 1})

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        assert (await post(relay, webhook([alert(0)], group="first"))).status_code == 200
        waiting = [asyncio.create_task(post(relay, webhook([alert(i)], group=f"g{i}"))) for i in (1, 2, 3)]
        await asyncio.sleep(0.1)
        assert metric(registry, "gpufed_dingtalk_queued_messages") == 3
        clock.now += 60
        assert [r.status_code for r in await asyncio.gather(*waiting)] == [200, 200, 200]
        assert metric(registry, "gpufed_dingtalk_merged_parts_total") == 2

    run(errcodes(sent=sent), scenario, config=config, clock=clock)
    assert len(sent) == 2
    assert all(f"node=node-000{i}" in sent[1]["markdown"]["text"] for i in (1, 2, 3))


def test_duplicate_from_second_replica_is_dropped() -> None:
    sent: list[dict[str, Any]] = []

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        body = webhook([alert(1), alert(2)])
        answers = await asyncio.gather(post(relay, body), post(relay, body))
        assert sorted(r.json()["status"] for r in answers) == ["duplicate", "sent"]
        reordered = {**body, "alerts": list(reversed(body["alerts"]))}
        assert (await post(relay, reordered)).json()["status"] == "duplicate"
        assert (await post(relay, webhook([alert(1)]))).json()["status"] == "sent", "other alert set"
        assert metric(registry, "gpufed_dingtalk_dedup_dropped_total") == 2

    run(errcodes(sent=sent), scenario)
    assert len(sent) == 2


def test_unknown_robot_404() -> None:
    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await post(relay, webhook([alert(1)]), robot="cn-sh")
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["detail"] == "unknown robot 'cn-sh'"

    run(errcodes(sent=[]), scenario)


@pytest.mark.parametrize(("body", "status", "field"), [
    (b"not json", 400, "body"),
    (json.dumps({**webhook([alert(1)]), "version": "3"}).encode(), 422, "version"),
    (json.dumps({**webhook([alert(1)]), "alerts": [{"status": "firing"}]}).encode(), 422, "alerts.0.labels"),
    (json.dumps({**webhook([alert(1)]), "alerts": []}).encode(), 422, "alerts"),
])
def test_bad_payload(body: bytes, status: int, field: str | None) -> None:
    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        response = await relay.post("/dingtalk/cn-bj/send", content=body)
        assert response.status_code == status
        assert response.json().get("field") == field

    run(errcodes(sent=[]), scenario)


def test_secrets_never_in_responses_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    def leak(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url} with {SECRET}")

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        texts = [(await post(relay, webhook([alert(1)]))).text]
        texts += [(await relay.get(path)).text for path in ("/metrics", "/healthz", "/readyz")]
        for text in texts:
            assert TOKEN not in text and SECRET not in text

    with caplog.at_level(logging.DEBUG):
        run(leak, scenario)
    # The failure is logged, redacted: the relay's own redaction names the query key
    # (access_token=<redacted>); where gpufed serve's log filter already ran in this process
    # (it masks a webhook URL whole), the URL reads <redacted> entirely. Never the secret.
    failures = [r.getMessage() for r in caplog.records if "DingTalk unreachable" in r.getMessage()]
    assert failures and all("<redacted>" in line for line in failures), caplog.text
    assert TOKEN not in caplog.text and SECRET not in caplog.text


GOOD = """
robots:
  cn-bj:
    url: https://oapi.dingtalk.com/robot/send?access_token=tok-good-1
    secret: SECgood
"""


def test_reload_keeps_old_config_on_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.yml"
    path.write_text(GOOD)

    async def scenario(relay: httpx.AsyncClient, registry: CollectorRegistry) -> None:
        state = app_state[0].state.relay
        path.write_text("robots: {cn-bj: {url: 'https://x/send?access_token=changeme'}}")
        assert reload_config(state, path) is False
        assert state.config.robots["cn-bj"].url.get_secret_value().endswith("tok-good-1")
        path.write_text("robots: [")
        assert reload_config(state, path) is False
        path.write_text(GOOD + "  cn-sh:\n    url: https://oapi.dingtalk.com/robot/send?access_token=tok-sh\n")
        assert reload_config(state, path) is True
        assert (await post(relay, webhook([alert(1)]), robot="cn-sh")).status_code == 200
        assert registry.get_sample_value("gpufed_dingtalk_config_reloads_total", {"result": "failure"}) == 2

    app_state: list[FastAPI] = []
    run(errcodes(sent=[]), scenario, config=load_config(path), on_app=app_state.append)
