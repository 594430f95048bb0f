"""The CLI through typer's runner: config check, bad config, listen parsing, log redaction."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from alertmanager.dingtalk.cli import RedactFilter, cli, parse_listen

CONFIG = """
robots:
  cn-bj:
    url: https://oapi.dingtalk.com/robot/send?access_token=${CLI_TOKEN}
    secret: ${CLI_SECRET}
"""


def test_check_valid_config(tmp_path: Path) -> None:
    path = tmp_path / "relay.yml"
    path.write_text(CONFIG)
    env = {"CLI_TOKEN": "tok-cli-123", "CLI_SECRET": "SECcli-secret"}
    result = CliRunner().invoke(cli, ["--config", str(path), "--check"], env=env)
    assert result.exit_code == 0, result.output
    assert "robots cn-bj" in result.output and "tok-cli-123" not in result.output


def test_bad_config_exits_2_without_leaking(tmp_path: Path) -> None:
    path = tmp_path / "relay.yml"
    path.write_text(CONFIG)
    result = CliRunner().invoke(cli, ["--config", str(path), "--check"], env={"CLI_TOKEN": "tok-cli-123"})
    assert result.exit_code == 2
    assert "CLI_SECRET is not set" in result.output


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:8060") == ("127.0.0.1", 8060)
    assert parse_listen("[::1]:9000") == ("::1", 9000)
    with pytest.raises(typer.BadParameter):
        parse_listen("8060")


def test_log_filter_redacts_robot_urls() -> None:
    # What httpx logs for every request the relay makes to a robot.
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, 'HTTP Request: %s %s "%s"',
                               ("POST", "https://oapi.dingtalk.com/robot/send?access_token=tok-abc&timestamp=1"
                                "&sign=c2ln%3D", "HTTP/1.1 200 OK"), None)
    assert RedactFilter().filter(record)
    assert record.getMessage() == ('HTTP Request: POST https://oapi.dingtalk.com/robot/send?access_token=<redacted>'
                                   '&timestamp=1&sign=<redacted> "HTTP/1.1 200 OK"')
