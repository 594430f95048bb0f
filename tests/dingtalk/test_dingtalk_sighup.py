"""SIGHUP reload of a real ``gpufed-dingtalk`` process, not of the function behind it.

The relay runs as a subprocess on a free loopback port with its robots pointing at the
DingTalk capture server and its secrets in its environment. The test rewrites the config
file and signals the process's own PID: a good file adds a robot that then delivers
signed messages; a bad file is refused, counted in the reload metric, and the old robots
keep being served.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
from conftest import stop_process
from conftest import wait_for as shared_wait_for

from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import free_port

from .payloads import alert, webhook

ENV = {"SIGHUP_BJ_TOKEN": "tok-sighup-bj", "SIGHUP_BJ_SECRET": "SECsighup-bj-secret",
       "SIGHUP_SH_TOKEN": "tok-sighup-sh", "SIGHUP_SH_SECRET": "SECsighup-sh-secret"}
BAD_CONFIGS = {
    "unset env var": "robots:\n  bj: {url: 'http://127.0.0.1:1/robot/send?access_token=${SIGHUP_UNSET}'}\n",
    "not YAML": "robots: [unclosed\n",
}


def robot_yaml(base_url: str, name: str, env: str) -> str:
    return (f"  {name}:\n    url: {base_url}/robot/send?access_token=${{SIGHUP_{env}_TOKEN}}\n"
            f"    secret: ${{SIGHUP_{env}_SECRET}}\n    keywords: [告警]\n")


def relay_script() -> str:
    script = Path(sys.executable).with_name("gpufed-dingtalk")
    if not script.exists():
        pytest.fail(f"{script} missing: install the project (pip install -e .) so the console script exists")
    return str(script)


@dataclass
class RelayProcess:
    proc: subprocess.Popen[bytes]
    url: str
    config: Path
    log: Path

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=2)

    def robots(self) -> list[str]:
        return list(self.get("/readyz").json()["robots"])

    def reloads(self, result: str) -> float:
        match = re.search(rf'^gpufed_dingtalk_config_reloads_total{{result="{result}"}} (\S+)$',
                          self.get("/metrics").text, flags=re.M)
        return float(match.group(1)) if match else 0.0

    def reload(self, text: str) -> None:
        self.config.write_text(text, encoding="utf-8")
        self.proc.send_signal(signal.SIGHUP)


wait_for = partial(shared_wait_for, timeout=10.0, interval=0.05)


@pytest.fixture
def api() -> Iterator[LocalDingTalk]:
    with LocalDingTalk() as server:
        for env in ("BJ", "SH"):
            token, secret = ENV[f"SIGHUP_{env}_TOKEN"], ENV[f"SIGHUP_{env}_SECRET"]
            server.add_robot(token, secret=secret, keywords=["告警"])
        yield server


@pytest.fixture
def relay(tmp_path: Path, api: LocalDingTalk) -> Iterator[RelayProcess]:
    config, log = tmp_path / "dingtalk.yml", tmp_path / "relay.log"
    config.write_text("robots:\n" + robot_yaml(api.base_url, "bj", "BJ"), encoding="utf-8")
    port = free_port()
    command = [relay_script(), "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    process = RelayProcess(proc=proc, url=f"http://127.0.0.1:{port}", config=config, log=log)
    try:
        wait_for(lambda: proc.poll() is not None or process.get("/readyz").status_code == 200,
                 what="relay /readyz")
        assert proc.poll() is None, log.read_text(errors="replace")
        yield process
    finally:
        stop_process(proc)


def test_sighup_adds_robot_and_survives_bad_configs(relay: RelayProcess, api: LocalDingTalk) -> None:
    assert relay.robots() == ["bj"]

    relay.reload("robots:\n" + robot_yaml(api.base_url, "bj", "BJ") + robot_yaml(api.base_url, "sh", "SH"))
    wait_for(lambda: relay.robots() == ["bj", "sh"], what="the new robot on /readyz")
    assert relay.reloads("success") == 1
    # The new robot is live: its env-expanded secret signs what the capture server accepts.
    sent = httpx.post(f"{relay.url}/dingtalk/sh/send", json=webhook([alert(1)]), timeout=15)
    assert sent.status_code == 200, sent.text
    assert len(api.messages(ENV["SIGHUP_SH_TOKEN"])) == 1
    assert api.rejected(ENV["SIGHUP_SH_TOKEN"]) == []

    for failures, text in enumerate(BAD_CONFIGS.values(), start=1):
        relay.reload(text)
        wait_for(lambda: relay.reloads("failure") == failures, what=f"reload failure {failures}")  # noqa: B023
        assert relay.robots() == ["bj", "sh"], "the old config keeps being served"
        assert relay.proc.poll() is None
    assert relay.reloads("success") == 1

    log = relay.log.read_text(errors="replace")
    assert "config reload" in log and "failed, keeping the old config" in log
    assert not [value for value in ENV.values() if value in log], "tokens and secrets stay out of the log"
    assert "access_token=<redacted>" in log
