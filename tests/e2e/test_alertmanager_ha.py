"""End to end: real Alertmanager 0.25 HA pair -> relay (uvicorn) -> DingTalk capture server.

One pair, relay and capture server per module; each test owns a region (and robot) so
messages do not mix. The capture server checks signatures and keywords like DingTalk.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import require_tool
from fakes.dingtalk_api import FakeDingTalk

from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import parse_config
from alertmanager.dingtalk.harness import AlertmanagerHA, RelayThread, alertmanager_config, gpu_alert

pytestmark = pytest.mark.e2e

REGIONS = ("e2e-dedup", "e2e-inhibit", "e2e-retry", "e2e-split")
SECRET = "SECe2e-secret-for-capture"


@dataclass
class Stack:
    api: FakeDingTalk
    am: AlertmanagerHA
    relay: RelayThread
    tokens: dict[str, str]

    def messages(self, region: str) -> list[dict[str, Any]]:
        return self.api.messages(self.tokens[region])


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    binary = require_tool("prometheus-alertmanager")
    with FakeDingTalk() as api:
        tokens = {region: f"tok-{region}" for region in REGIONS}
        robots = {region: {"url": api.add_robot(tokens[region], secret=SECRET, keywords=["告警"]),
                           "secret": SECRET, "keywords": ["告警"]} for region in REGIONS}
        config = parse_config({"max_wait": "3s", "dedup_window": "5m", "robots": robots}, env={})
        with RelayThread(create_app(config)) as relay, AlertmanagerHA(
                alertmanager_config(relay.url, {r: r for r in REGIONS}), binary=binary) as am:
            yield Stack(api=api, am=am, relay=relay, tokens=tokens)


def wait_for(check: Callable[[], bool], *, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.1)


def texts(stack: Stack, region: str) -> list[str]:
    return [m["markdown"]["text"] for m in stack.messages(region)]


def test_config_passes_amtool(stack: Stack) -> None:
    amtool = require_tool("amtool")
    command = [amtool, "check-config", str(stack.am.config_path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_one_message_per_group_despite_two_replicas(stack: Stack) -> None:
    region = "e2e-dedup"
    stack.am.post_alerts([gpu_alert(region=region, node=f"n{i}", gpu=i) for i in range(3)]
                         + [gpu_alert(region=region, node="n0", alertname="GPUHighTemp")])

    def headings() -> list[str]:  # one per group; the relay may merge groups into one message
        return sorted(re.findall(r"^### (.*)$", "\n".join(texts(stack, region)), flags=re.M))

    wait_for(lambda: len(headings()) >= 2)
    time.sleep(3)  # past the second replica's peer timeout: a duplicate would have arrived by now
    assert headings() == [f"[FIRING:1] GPUHighTemp {region}", f"[FIRING:3] GPUXidError {region}"]
    assert stack.api.robots[stack.tokens[region]].rejected == [], "signature and keyword accepted"


def test_node_down_inhibits_that_nodes_gpu_alerts(stack: Stack) -> None:
    region = "e2e-inhibit"
    stack.am.post_alerts([gpu_alert(region=region, node="dead", alertname="NodeDown"),
                          gpu_alert(region=region, node="dead", gpu=1),
                          gpu_alert(region=region, node="alive", gpu=2)])
    wait_for(lambda: all(name in "".join(texts(stack, region)) for name in ("GPUXidError", "NodeDown")))
    time.sleep(2)
    body = "\n".join(texts(stack, region))
    assert "NodeDown" in body
    gpu_lines = [line for line in body.splitlines() if line.startswith("- **GPUXidError**")]
    assert gpu_lines and all("node=alive" in line for line in gpu_lines)


def test_130101_is_retried_until_delivered(stack: Stack) -> None:
    region = "e2e-retry"
    stack.api.script(stack.tokens[region], 130101)
    stack.am.post_alerts([gpu_alert(region=region, node="r1")])
    wait_for(lambda: len(stack.messages(region)) >= 1)
    time.sleep(2)
    robot = stack.api.robots[stack.tokens[region]]
    assert [code for code, _ in robot.rejected] == [130101]
    assert len(robot.messages) == 1 and "node=r1" in robot.messages[0]["markdown"]["text"]


def test_large_group_split_under_20000_bytes(stack: Stack) -> None:
    region = "e2e-split"
    nodes = {f"big-{i:03d}" for i in range(400)}
    stack.am.post_alerts([gpu_alert(region=region, node=n, gpu=i % 8) for i, n in enumerate(sorted(nodes))])
    delivered: set[str] = set()

    def all_in() -> bool:
        delivered.update(n for t in texts(stack, region) for n in re.findall(r"node=(big-\d{3})", t))
        return delivered == nodes

    wait_for(all_in)
    assert len(stack.messages(region)) > 1
    sizes = [len(json.dumps(m, ensure_ascii=False).encode()) for m in stack.messages(region)]
    assert max(sizes) < 20_000
    assert stack.api.robots[stack.tokens[region]].rejected == []
