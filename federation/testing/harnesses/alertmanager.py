"""Real-process harness: an Alertmanager 0.25 HA set and the relay on loopback.

Used by ``tests/e2e/test_alertmanager_ha.py`` and ``bench``. It runs what gpufed renders:
the ``alertmanager.yml`` bytes from ``alertmanager.render`` and each replica's flags from
``alertmanager.ha.all_replica_flags`` (replicas on free loopback ports, see
``loopback_replicas``); it adds only flags that shorten gossip timings for tests. Owns the
subprocesses and always kills them on exit; state lives in a temp dir.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from alertmanager import ha
from alertmanager.models import AlertingSpec, ReplicaSpec
from alertmanager.render import render_alertmanager_config
from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until
from federation.testing.harnesses.app_server import AppServer
from sharder.kernel.output import dump_yaml

#: Test-only timings; the rendered flags leave these at Alertmanager's defaults.
FAST_GOSSIP = ("--cluster.settle-timeout=2s", "--cluster.gossip-interval=50ms",
               "--cluster.pushpull-interval=1s")


def loopback_replicas(count: int = 2) -> list[ReplicaSpec]:
    """An HA set on free loopback ports, for ``AlertingSpec.replicas``."""
    return [ReplicaSpec(name=f"am-{i}", host="127.0.0.1", port=free_port(), cluster_port=free_port())
            for i in range(count)]


class AlertmanagerHA:
    """One ``prometheus-alertmanager`` per replica of ``alerting``, gossiping; ``urls`` once entered.

    ``config`` is the file content to run, by default ``render_alertmanager_config(alerting)``
    dumped as ``gpufed render`` dumps it; pass the bundle's bytes to run exactly those.
    """

    def __init__(self, alerting: AlertingSpec, *, config: bytes | None = None, peer_timeout: str = "1s",
                 binary: str = "prometheus-alertmanager", web_config: Path | None = None,
                 client: httpx.Client | None = None, cluster_tls_config: Path | None = None) -> None:
        """``web_config``: run every replica with ``--web.config.file`` (then ``urls`` are https);
        ``client``: what the harness's own calls go through (a client certificate, a CA);
        ``cluster_tls_config``: every replica gossips over it (``--cluster.tls-config``)."""
        self.alerting = alerting
        self.config = config if config is not None else dump_yaml(render_alertmanager_config(alerting))
        self.flags = ha.all_replica_flags(alerting)
        self.peer_timeout = peer_timeout
        self.binary = shutil.which(binary) or binary
        self.dir = Path(tempfile.mkdtemp(prefix="gpufed-am-"))
        self.config_path = self.dir / "alertmanager.yml"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.web_config = web_config
        self.cluster_tls_config = cluster_tls_config
        self.client = client if client is not None else httpx.Client(timeout=30)
        self._own_client = client is None
        scheme = "https" if web_config is not None else "http"
        self.urls = [f"{scheme}://{replica.address}" for replica in alerting.replicas]

    def __enter__(self) -> AlertmanagerHA:
        self.config_path.write_bytes(self.config)
        try:
            for name, flags in self.flags.items():
                args = [self.binary, f"--config.file={self.config_path}",
                        f"--storage.path={self.dir / f'data-{name}'}", *flags, *FAST_GOSSIP,
                        f"--cluster.peer-timeout={self.peer_timeout}", "--log.level=warn",
                        *([f"--web.config.file={self.web_config}"] if self.web_config else []),
                        *([f"--cluster.tls-config={self.cluster_tls_config}"]
                          if self.cluster_tls_config else [])]
                with (self.dir / f"{name}.log").open("wb") as log:
                    self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
            self._wait_clustered()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_clustered(self, timeout: float = 20.0) -> None:

        def clustered() -> bool:
            states = [self.client.get(f"{url}/api/v2/status", timeout=1).json()["cluster"]
                      for url in self.urls]
            size = len(self.urls)
            return all(s["status"] == "ready" and len(s.get("peers") or []) == size for s in states)

        def alive() -> None:
            if any(proc.poll() is not None for proc in self.procs):
                raise RuntimeError(f"alertmanager exited: {self.logs()}")

        wait_until(clustered, timeout=timeout, what="the alertmanager replicas to cluster", interval=0.1,
                   alive=alive, retry_on=(httpx.HTTPError, KeyError, ValueError),
                   fail=lambda message: TimeoutError(f"{message}: {self.logs()}"))

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.dir.glob("*.log")))

    def post_alerts(self, alerts: Sequence[dict[str, Any]]) -> None:
        """Post to BOTH replicas, as Prometheus does with an HA Alertmanager."""
        for url in self.urls:
            self.client.post(f"{url}/api/v2/alerts", json=list(alerts), timeout=30).raise_for_status()

    def __exit__(self, *exc: object) -> None:
        # One at a time: a replica leaving the gossip mesh waits for a live peer's ack, so
        # stopping all at once makes each sit out its 10 s leave timeout.
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._own_client:
            self.client.close()


class RelayThread(AppServer):
    """The relay app under uvicorn in a daemon thread (uvicorn skips signal handlers there)."""

    def __init__(self, app: FastAPI, *, sock: socket.socket | None = None) -> None:
        """``sock``: a listening socket bound before the app's config named its port."""
        super().__init__(app, sock=sock, name="relay", lifespan="on")

    def __enter__(self) -> RelayThread:
        self.start()
        return self


def gpu_alert(*, region: str, node: str, cluster: str, alertname: str = "GPUXidError",
              severity: str = "critical", component: str = "gpu", gpu: int | None = 0,
              **labels: str) -> dict[str, Any]:
    """An alert as Prometheus posts it to ``/api/v2/alerts``, labelled as the rule pack does.

    ``startsAt`` is set here, as Prometheus sets it (the rule's active-since time) in what it
    posts to every replica: left out, each Alertmanager stamps its own arrival time, the two
    replicas' notifications name different episodes, and the relay rightly sends both.
    """
    base = {"alertname": alertname, "severity": severity, "component": component, "region": region,
            "cluster": cluster, "node": node}
    if gpu is not None:
        base["gpu"] = str(gpu)
    return {"labels": {**base, **labels},
            "annotations": {"summary": f"{alertname} on {node}" + ("" if gpu is None else f" gpu {gpu}")},
            "generatorURL": "http://prometheus:9090/graph",
            "startsAt": datetime.now(UTC).isoformat()}
