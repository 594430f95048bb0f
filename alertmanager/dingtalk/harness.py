"""Real-process harness: an Alertmanager 0.25 HA pair and the relay on loopback.

Used by ``tests/e2e/test_alertmanager_ha.py`` and ``bench``. Owns the subprocesses and
always kills them on exit; ports are free loopback ports, state lives in a temp dir.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alertmanager_config(relay_url: str, regions: dict[str, str], *, group_wait: str = "1s",
                        group_interval: str = "2s", repeat_interval: str = "1h") -> dict[str, Any]:
    """Route each region to its robot's relay endpoint; NodeDown inhibits a node's GPU alerts."""
    return {
        "route": {"receiver": "blackhole", "group_by": ["region", "alertname"], "group_wait": group_wait,
                  "group_interval": group_interval, "repeat_interval": repeat_interval,
                  "routes": [{"matchers": [f'region="{region}"'], "receiver": f"dingtalk-{robot}"}
                             for region, robot in sorted(regions.items())]},
        "receivers": [{"name": "blackhole"}] + [
            {"name": f"dingtalk-{robot}", "webhook_configs": [
                {"url": f"{relay_url}/dingtalk/{robot}/send", "send_resolved": True, "max_alerts": 0}]}
            for robot in sorted(set(regions.values()))],
        "inhibit_rules": [{"source_matchers": ['alertname="NodeDown"'],
                           "target_matchers": ['alertname=~"GPU.*"'], "equal": ["node"]}],
    }


class AlertmanagerHA:
    """Two gossiping ``prometheus-alertmanager`` replicas; ``urls`` once entered."""

    def __init__(self, config: dict[str, Any], *, peer_timeout: str = "1s",
                 binary: str = "prometheus-alertmanager") -> None:
        self.config = config
        self.peer_timeout = peer_timeout
        self.binary = shutil.which(binary) or binary
        self.dir = Path(tempfile.mkdtemp(prefix="gpufed-am-"))
        self.config_path = self.dir / "alertmanager.yml"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []

    def __enter__(self) -> AlertmanagerHA:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=True))
        web, cluster = [free_port(), free_port()], [free_port(), free_port()]
        try:
            for i in (0, 1):
                args = [
                    self.binary, f"--config.file={self.config_path}",
                    f"--storage.path={self.dir / f'data{i}'}",
                    f"--web.listen-address=127.0.0.1:{web[i]}",
                    f"--cluster.listen-address=127.0.0.1:{cluster[i]}",
                    f"--cluster.advertise-address=127.0.0.1:{cluster[i]}",
                    f"--cluster.peer=127.0.0.1:{cluster[1 - i]}", "--cluster.settle-timeout=2s",
                    "--cluster.gossip-interval=50ms", "--cluster.pushpull-interval=1s",
                    f"--cluster.peer-timeout={self.peer_timeout}", "--log.level=warn",
                ]
                with (self.dir / f"am{i}.log").open("wb") as log:
                    self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
                self.urls.append(f"http://127.0.0.1:{web[i]}")
            self._wait_clustered()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_clustered(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                states = [httpx.get(f"{url}/api/v2/status", timeout=1).json()["cluster"] for url in self.urls]
                if all(s["status"] == "ready" and len(s.get("peers") or []) == 2 for s in states):
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if any(proc.poll() is not None for proc in self.procs):
                raise RuntimeError(f"alertmanager exited: {self.logs()}")
            time.sleep(0.1)
        raise TimeoutError(f"alertmanager pair did not cluster in {timeout}s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.dir.glob("am*.log")))

    def post_alerts(self, alerts: Sequence[dict[str, Any]]) -> None:
        """Post to BOTH replicas, as Prometheus does with an HA Alertmanager."""
        for url in self.urls:
            httpx.post(f"{url}/api/v2/alerts", json=list(alerts), timeout=30).raise_for_status()

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RelayThread:
    """The relay app under uvicorn in a daemon thread (uvicorn skips signal handlers there)."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> RelayThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("relay did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def gpu_alert(*, region: str, node: str, alertname: str = "GPUXidError", gpu: int = 0,
              **labels: str) -> dict[str, Any]:
    """An alert as Prometheus posts it to ``/api/v2/alerts``."""
    return {"labels": {"alertname": alertname, "region": region, "node": node, "gpu": str(gpu), **labels},
            "annotations": {"summary": f"{alertname} on {node} gpu {gpu}"},
            "generatorURL": "http://prometheus:9090/graph"}
