"""Relay config: env expansion, placeholder refusal, secrets never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from alertmanager.dingtalk.config import load_config, parse_config, parse_duration
from alertmanager.dingtalk.errors import ConfigError

YAML = """
listen: 127.0.0.1:8060
timezone: Asia/Shanghai
dedup_window: 5m
robots:
  cn-beijing:
    url: https://oapi.dingtalk.com/robot/send?access_token=${DINGTALK_BJ_TOKEN}
    secret: ${DINGTALK_BJ_SECRET}
    keywords: [alert]
    rate_per_minute: 18
    mentions: {mobiles: ["13800000000"], user_ids: [ops1], all_on_critical: true, label: dingtalk_at}
"""
ENV = {"DINGTALK_BJ_TOKEN": "realtoken123", "DINGTALK_BJ_SECRET": "SECreal-secret-value"}


def test_load_expands_env_and_hides_secrets(tmp_path: Path) -> None:
    path = tmp_path / "relay.yml"
    path.write_text(YAML)
    config = load_config(path, env=ENV)
    robot = config.robots["cn-beijing"]
    assert config.dedup_window == 300.0
    assert robot.url.get_secret_value().endswith("access_token=realtoken123")
    assert robot.secret is not None and robot.secret.get_secret_value() == "SECreal-secret-value"
    shown = repr(config) + str(config) + config.model_dump_json()
    assert "realtoken123" not in shown and "SECreal-secret-value" not in shown


@pytest.mark.parametrize("secret", ["changeme", "CHANGEME", "<your secret>", "xxx", ""])
def test_placeholder_secret_refused(secret: str) -> None:
    data = {"robots": {"bj": {"url": "https://x/robot/send?access_token=abc123", "secret": secret}}}
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    assert info.value.field == "robots.bj.secret"


def test_placeholder_token_refused() -> None:
    with pytest.raises(ConfigError, match="access_token is a placeholder"):
        parse_config({"robots": {"bj": {"url": "https://x/robot/send?access_token=changeme"}}}, env={})


def test_unset_env_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"robots": {"bj": {"url": "https://x/send?access_token=${NOPE}"}}}, env={})
    assert info.value.field == "NOPE"


def test_rate_above_dingtalk_limit_refused() -> None:
    data = {"robots": {"bj": {"url": "https://x/send?access_token=abc123", "rate_per_minute": 21}}}
    with pytest.raises(ConfigError, match="rate_per_minute"):
        parse_config(data, env={})


def test_durations() -> None:
    assert [parse_duration(v) for v in ("500ms", "10s", "5m", "1h", 7)] == [0.5, 10.0, 300.0, 3600.0, 7.0]
    with pytest.raises(ValueError):
        parse_duration("5 minutes")
