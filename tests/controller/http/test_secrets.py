"""Secrets are write-only: never in a GET, an audit entry, a log line or a world-readable file."""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import ROOT

from federation.controller.base.options import ControllerOptions
from federation.controller.http.redact import redact_file
from federation.controller.http.service import ServeSettings, build_service
from federation.controller.live.publisher import Publisher
from federation.spec import load_gpufed_spec
from sharder.kernel.errors import ConfigCheckError
from tests.controller.harness import TOKEN, fleet

SECRETS = {
    "GPUFED_TOKEN": TOKEN,
    "DINGTALK_BJ_TOKEN": "bj-robot-token-5f1e2d3c4b5a",
    "DINGTALK_BJ_SECRET": "SECbj0123456789abcdef",
    "DINGTALK_SH_TOKEN": "sh-robot-token-a1b2c3d4e5",
    "DINGTALK_SH_SECRET": "SECsh0123456789abcdef",
    "DINGTALK_SRE_TOKEN": "sre-robot-token-0f9e8d",
    "DINGTALK_SRE_SECRET": "SECsre0123456789abcdef",
    "CONSUL_HTTP_TOKEN": "consul-acl-6c2d9a51-token",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-key-9z8y7x6w",
}


def test_no_get_audit_or_log_shows_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    document = yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text())
    document["children"] = {"target_discovery": "http_sd", "http_sd_url": "http://127.0.0.1:8080"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    spec = load_gpufed_spec(tmp_path / "spec.yaml")
    service = build_service(
        ServeSettings(
            spec=spec,
            data_dir=tmp_path / "data",
            check_configs=False,
            options=ControllerOptions(debounce_s=0, grace_s=0),
            env=dict(SECRETS),
        )
    )
    controller = service.controller
    controller.restore()
    regions = spec.region_names()
    caplog.set_level(logging.DEBUG)
    controller.reconciler.on_change(
        "file", [t for i, r in enumerate(regions) for t in fleet(5, region=r, start=100 * i)]
    )
    with controller._lock:
        controller.tick(idle=False)
    controller.publish_configs()

    async def everything() -> list[str]:
        seen: list[str] = []
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=service.app), base_url="http://ctl"
        ) as client:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            plan = (
                await client.post(
                    "/v1/plan", json={"add_shard": [regions[0]], "reason": "more room"}, headers=auth
                )
            ).json()
            seen.append(str(plan))
            seen.append(
                (await client.post("/v1/rebalance", json={"version": plan["version"]}, headers=auth)).text
            )
            files = (await client.get("/v1/configs")).json()["files"]
            assert any(f["path"] == "alertmanager/dingtalk.yml" for f in files)
            for entry in files:
                seen.append((await client.get(f"/v1/configs/{entry['path']}")).text)
            for path in (
                "/v1/status",
                "/v1/shards",
                "/v1/targets",
                "/v1/audit",
                "/v1/handovers",
                "/metrics",
                "/v1/registry/targets",
                "/openapi.json",
                "/",
            ):
                seen.append((await client.get(path)).text)
        return seen

    answers = asyncio.run(everything())
    published = "\n".join(answers)
    assert "${DINGTALK_BJ_SECRET}" in published  # the reference is shown, its value never
    logged = caplog.text
    stored = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    for name, value in SECRETS.items():
        assert value not in published, name
        assert value not in logged, name
        assert value.encode() not in stored, name
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "state.db").stat().st_mode) == 0o600
    service.stop()


def test_literal_secrets_in_rendered_files_are_masked() -> None:
    shown = redact_file(
        "alertmanager/dingtalk.yml",
        b"robots:\n  bj:\n    secret: SEC123literal\n"
        b"    url: https://oapi.dingtalk.com/robot/send?access_token=literal-token\n",
    )
    assert b"SEC123literal" not in shown and b"literal-token" not in shown
    assert redact_file("x.yml", b"secret: ${FROM_ENV}\n") == b"secret: ${FROM_ENV}\n"


def test_a_robot_url_whose_token_is_a_reference_is_served_as_it_is() -> None:
    """The chart's relay syncs dingtalk.yml from the controller and fills ``${...}`` from its
    environment: masking the whole URL (a robot URL's query is its credential) left it
    ``url: <redacted>`` and the relay refused to start. A literal token still masks it whole."""
    dingtalk = (b"robots:\n  sre:\n    secret: ${DINGTALK_SRE_SECRET}\n"
                b"    url: https://oapi.dingtalk.com/robot/send?access_token=${DINGTALK_SRE_TOKEN}\n")
    assert redact_file("alertmanager/dingtalk.yml", dingtalk) == dingtalk
    wecom = b"url: https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=${WECOM_KEY}\n"
    assert redact_file("alertmanager/dingtalk.yml", wecom) == wecom
    for literal in (b"access_token=abc0123literal", b"access_token=${T}&secret=abc0123literal"):
        shown = redact_file("a.yml", b"url: https://oapi.dingtalk.com/robot/send?" + literal + b"\n")
        assert b"abc0123literal" not in shown and b"oapi.dingtalk.com" not in shown


class Rejecting:
    """A promtool stand-in that refuses one child's config."""

    def __init__(self, bad: str) -> None:
        self.bad = bad

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        if self.bad in config:
            raise ConfigCheckError("refused by the stand-in", path=config)


def test_a_config_that_fails_its_check_is_never_published(tmp_path: Path) -> None:
    results: list[str] = []
    publisher = Publisher(
        out=tmp_path / "out",
        checker=Rejecting("children/b/"),
        alert_checker=None,
        agent=False,
        on_result=results.append,
    )
    good = {"manifest.json": b"{}", "children/a/prometheus.yml": b"global: {}\n"}
    assert publisher.publish(good, version=1)
    bad = {**good, "children/b/prometheus.yml": b"global: {}\n"}
    assert not publisher.publish(bad, version=2)
    assert publisher.files == good and publisher.status.version == 1
    assert not publisher.status.ok and "refused by the stand-in" in publisher.status.error
    assert publisher.status.failed_version == 2
    assert sorted(p.name for p in (tmp_path / "out" / "children").iterdir()) == ["a"]
    assert results == ["ok", "failed"]
