"""Real Alertmanagers that cannot gossip each send every notification; DingTalk shows each once.

Two ``prometheus-alertmanager`` processes run gpufed's rendered ``alertmanager.yml`` with
clustering off (``--cluster.listen-address=``), as a partitioned HA pair behaves: each one
notifies the relay of everything, so every notification reaches the relay twice, as the
real webhook payloads Alertmanager writes. Two episodes of one alert, within a minute:
DingTalk must show FIRING, RESOLVED, FIRING, RESOLVED, and the relay must count exactly one
dropped copy per notification (``gpufed_dingtalk_dedup_dropped_total``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_tool, stop_process
from conftest import wait_for as shared_wait_for
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import load_config
from alertmanager.models import (
    AlertingSpec,
    ReceiverSpec,
    RegionRouteSpec,
    RobotSpec,
    SeverityTiming,
    SeverityTimings,
    Timing,
)
from alertmanager.render import ALERTMANAGER_FILE, RELAY_FILE, render_alerting_bundle
from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import listening_socket
from federation.testing.harnesses.alertmanager import RelayThread, gpu_alert, loopback_replicas

REGION, ROBOT, TOKEN, SECRET = "cn-live", "live", "tok-live-1", "SEClive-secret-0123"
FAST = SeverityTiming(group_wait="1s", group_interval="2s", repeat_interval="1h")
wait_for = partial(shared_wait_for, timeout=30.0, interval=0.1)


def spec(capture_url: str, *, relay_port: int) -> AlertingSpec:
    return AlertingSpec(
        relay_url=f"http://127.0.0.1:{relay_port}", relay_listen=f"127.0.0.1:{relay_port}",
        replicas=loopback_replicas(2),
        timing=Timing(group_wait=FAST.group_wait, group_interval=FAST.group_interval,
                      repeat_interval=FAST.repeat_interval),
        severities=SeverityTimings(critical=FAST, warning=FAST, info=FAST),
        robots=[RobotSpec(name=ROBOT, url=f"{capture_url}/robot/send?access_token=${{LIVE_TOKEN}}",
                          secret="${LIVE_SECRET}")],
        receivers=[ReceiverSpec(name="sre", robots=[ROBOT])], default_receiver="sre",
        routes=[RegionRouteSpec(region=REGION, robot=ROBOT)],
    )


class Partitioned:
    """The rendered config under two Alertmanagers that do not cluster."""

    def __init__(self, alerting: AlertingSpec, config: Path, tmp: Path) -> None:
        binary = require_tool("prometheus-alertmanager")
        self.urls = [f"http://{replica.address}" for replica in alerting.replicas]
        self.procs = []
        for replica in alerting.replicas:
            log = (tmp / f"{replica.name}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.path={tmp / replica.name}",
                 f"--web.listen-address={replica.address}", "--cluster.listen-address=", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT))
            log.close()

        def ready() -> bool:
            try:
                return all(httpx.get(f"{url}/-/ready", timeout=1).status_code == 200 for url in self.urls)
            except httpx.HTTPError:
                return False

        wait_for(ready, what="both alertmanagers ready")

    def post(self, alert: dict[str, Any]) -> None:
        """To both, as Prometheus posts every alert to every Alertmanager."""
        for url in self.urls:
            httpx.post(f"{url}/api/v2/alerts", json=[alert], timeout=10).raise_for_status()

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[LocalDingTalk, Partitioned, CollectorRegistry]]:
    with LocalDingTalk() as api:
        api.add_robot(TOKEN, secret=SECRET)
        sock = listening_socket()
        alerting = spec(api.base_url, relay_port=sock.getsockname()[1])
        bundle = render_alerting_bundle(alerting, cluster="live", regions=[REGION])
        for name in (ALERTMANAGER_FILE, RELAY_FILE):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(bundle[name])
        config = load_config(tmp_path / RELAY_FILE, env={"LIVE_TOKEN": TOKEN, "LIVE_SECRET": SECRET})
        registry = CollectorRegistry()
        with RelayThread(create_app(config, registry=registry), sock=sock):
            pair = Partitioned(alerting, tmp_path / ALERTMANAGER_FILE, tmp_path)
            try:
                yield api, pair, registry
            finally:
                pair.stop()


Stack = tuple[LocalDingTalk, Partitioned, CollectorRegistry]


def test_two_episodes_through_a_partitioned_pair(stack: Stack) -> None:
    api, pair, registry = stack

    def copies() -> float:
        return registry.get_sample_value("gpufed_dingtalk_dedup_dropped_total", {"robot": ROBOT}) or 0.0

    alert = gpu_alert(region=REGION, node="live-n001", cluster="live")
    expected: list[str] = []
    for number in (1, 2):
        starts = datetime.now(UTC)  # the next episode begins after the last one ended
        for status in ("firing", "resolved"):
            # Prometheus: a firing alert's endsAt is a few resends ahead, a resolved one's is now.
            ends = datetime.now(UTC) + (timedelta(hours=1) if status == "firing" else timedelta(0))
            pair.post({**alert, "startsAt": starts.isoformat(), "endsAt": ends.isoformat()})
            expected.append(f"[{status.upper()}:1]")
            wait_for(lambda: len(api.messages(TOKEN)) == len(expected) and copies() == len(expected),
                     what=f"episode {number} {status}: one message, one dropped copy")
    titles = [m.title.split(" ")[0] for m in api.messages(TOKEN)]
    assert titles == expected == ["[FIRING:1]", "[RESOLVED:1]", "[FIRING:1]", "[RESOLVED:1]"]
    assert api.rejected(TOKEN) == []
