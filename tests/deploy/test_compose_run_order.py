"""``depends_on`` conditions and healthchecks as Compose applies them, on a small project run by the
compose runner (root): a service that waits for another's healthcheck and for a one-shot
service's successful exit, sharing a named volume with it."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import ROOT
from deploy_tools import runner_marks

from federation.testing.harnesses.composerun.run import ComposeRun

pytestmark = runner_marks("compose")

IMAGE = "ghcr.io/gpufed/gpufed:0.1.0"
PROJECT = {
    "name": "order",
    "services": {
        "web": {  # healthy only once it serves, two seconds after its start
            "image": IMAGE,
            "command": ["sh", "-c", "sleep 2; exec python -m http.server 8000"],
            "healthcheck": {
                "test": ["CMD", "wget", "-qO-", "http://127.0.0.1:8000/"],
                "interval": "1s",
                "start_interval": "1s",
                "start_period": "30s",
                "timeout": "2s",
                "retries": 3,
            },
        },
        "init": {  # one-shot: writes the marker into the shared volume, then exits 0
            "image": IMAGE,
            "command": ["sh", "-c", "sleep 1; echo ready > /data/marker"],
            "volumes": [{"type": "volume", "source": "shared", "target": "/data"}],
            "restart": "no",
        },
        "app": {  # fails at once (no restart) unless both conditions held when it started
            "image": IMAGE,
            "command": [
                "sh",
                "-c",
                "grep -q ready /data/marker && wget -qO- http://web:8000/ >/dev/null && exec sleep 300",
            ],
            "depends_on": {
                "web": {"condition": "service_healthy"},
                "init": {"condition": "service_completed_successfully"},
            },
            "volumes": [{"type": "volume", "source": "shared", "target": "/data", "read_only": True}],
            "restart": "no",
        },
        "sidecar": {  # network_mode service:web: web's namespace, so web answers on 127.0.0.1
            "image": IMAGE,
            "network_mode": "service:web",
            "command": ["sh", "-c", "wget -qO- http://127.0.0.1:8000/ >/dev/null && exec sleep 300"],
            "depends_on": {"web": {"condition": "service_healthy"}},
            "restart": "no",
        },
        "consul": {  # under its profile: the Consul stand-in, probed in place of `consul members`
            "image": "hashicorp/consul:1.19.2",
            "profiles": ["consul"],
            "command": ["agent", "-server", "-bootstrap-expect=1", "-client=0.0.0.0"],
            "healthcheck": {
                "test": ["CMD", "consul", "members"],
                "interval": "1s",
                "start_interval": "1s",
                "start_period": "30s",
                "timeout": "2s",
                "retries": 3,
            },
        },
        "registrar": {  # reaches consul:8500 by name once the stand-in is healthy
            "image": IMAGE,
            "profiles": ["consul"],
            "command": ["sh", "-c", "wget -qO- http://consul:8500/v1/agent/services && exec sleep 300"],
            "depends_on": {"consul": {"condition": "service_healthy"}},
            "restart": "no",
        },
    },
    "volumes": {"shared": {}},
}


def test_depends_on_waits_for_healthy_and_completed_successfully(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    compose_file = tmp_path / "project" / "compose.yml"
    compose_file.write_text(yaml.safe_dump(PROJECT))
    env = tmp_path / "empty.env"
    env.write_text("")
    run = ComposeRun(
        monitoring=compose_file,
        monitoring_env=env,
        node_file=ROOT / "compose" / "node.yml",
        node_env_example=ROOT / "compose" / "node.env.example",
        nodes=[],
        workdir=tmp_path / "run",
        profiles=("consul",),
    )
    with run:
        app = run.state("app")
        assert run.planned["app"].process is not None
        assert run.planned["app"].process.wait_for(lambda s: bool(s.pids), 60)
        init = run.state("init")
        assert init.done and [e.code for e in init.exits] == [0]
        assert run.health()["web"] == "healthy"
        assert app.started_at[0] >= init.exits[0].at
        # still running: the marker was there and web answered when it started
        assert run.planned["app"].process.wait_for(lambda s: s.done, 3) is False
        assert app.exits == [] and len(app.pids) == 1
        assert run.planned["consul"].kind == "standin" and run.health()["consul"] == "healthy"
        sidecar = run.planned["sidecar"].process
        assert sidecar is not None and sidecar.wait_for(lambda s: s.done, 1) is False
        registrar = run.planned["registrar"].process
        assert registrar is not None and registrar.wait_for(lambda s: s.done, 3) is False
    assert run.network.existing() == []
