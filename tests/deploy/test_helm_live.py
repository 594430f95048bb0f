"""The chart's shell against a real ``gpufed serve`` and a real Prometheus: config sync, HTTP SD, helm test.

No cluster runs here, so what the pods would do runs as processes: the controller with
the spec the chart's ConfigMap holds (its ``http_sd_url`` pointed at this controller
instead of the in-cluster Service), the child's config-sync init container (the
chart's script, with the env the StatefulSet gives it), a Prometheus 2.42 agent with
the args the StatefulSet gives it and the file that script fetched, and finally the
``helm test`` pod's script with the in-cluster URLs swapped for these processes.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml
from conftest import require_tool, stop_process, wait_for
from test_helm import CHART, find, render, values

from federation.localrun.loopback import free_port
from tests.controller.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CLUSTER_CONTROLLER = "http://gpufed-controller.monitoring.svc:8080"
POD = "gpufed-child-cn-beijing-0"  # region cn-beijing, ordinal 0: child cn-beijing-0, which helm test asks


def inventory(path: Path, count: int) -> Path:
    targets = [{"address": "127.0.0.1", "port": 20000 + i, "job": "gpu", "node": f"gpu-{i:03d}",
                "region": "cn-beijing", "gpus": 8} for i in range(count)]
    path.write_text(yaml.safe_dump({"targets": targets}))
    return path


def env_of(container: dict[str, Any], **overrides: str) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return {"PATH": os.environ["PATH"], **env, **overrides}


def test_child_syncs_its_config_pulls_sd_and_helm_test_passes(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    require_tool("wget")
    objects = render(helm.Chart.load(CHART), values(CHART / "ci" / "default-values.yaml"))
    spec = yaml.safe_load(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    assert spec["children"]["http_sd_url"] == CLUSTER_CONTROLLER
    port = free_port()
    local = f"http://127.0.0.1:{port}"
    spec["children"]["http_sd_url"] = local
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    scripts = find(objects, "ConfigMap", "-scripts")["data"]
    (tmp_path / "config-sync.sh").write_text(scripts["config-sync.sh"])
    child_set = find(objects, "StatefulSet", "-child-cn-beijing")["spec"]["template"]["spec"]
    (init,) = child_set["initContainers"]
    (agent,) = [c for c in child_set["containers"] if c["name"] == "prometheus"]
    config_dir = tmp_path / "config"
    config_dir.mkdir()

    extra = ("--inventory", str(inventory(tmp_path / "inventory.yaml", 8)))
    with ServeProcess(spec=spec_file, data_dir=tmp_path / "ctl", log=tmp_path / "serve.log", port=port,
                      extra=extra) as ctl:
        wait_for(lambda: ctl.client.get("/readyz").status_code == 200, timeout=90, what="controller ready")

        # the init container: the chart's script and env; this pod's name from the downward API
        sync = subprocess.run(
            ["sh", str(tmp_path / "config-sync.sh")],
            env=env_of(init, GPUFED_URL=local, POD_NAME=POD, CONFIG_DIR=str(config_dir), RETRY_SECONDS="1"),
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert sync.returncode == 0, sync.stdout + sync.stderr
        synced = (config_dir / "prometheus.yml").read_bytes()
        assert synced == ctl.client.get("/v1/configs/children/cn-beijing-0/prometheus.yml").content
        sd_urls = re.findall(r"url: (\S+/v1/sd/\S+)", synced.decode())
        assert f"{local}/v1/sd/cn-beijing-0/gpu" in sd_urls, sd_urls

        # the child: Prometheus with the StatefulSet's args, paths moved into tmp_path
        web = free_port()
        args = [a.replace("/config/", f"{config_dir}/").replace("=/prometheus", f"={tmp_path / 'agent'}")
                for a in agent["args"]]
        with (tmp_path / "prometheus.log").open("wb") as log:
            proc = subprocess.Popen([prometheus, *args, f"--web.listen-address=127.0.0.1:{web}"],
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            child_url = f"http://127.0.0.1:{web}"
            assigned = {row["identity"] for row in ctl.client.get(
                "/v1/targets", params={"shard": "cn-beijing-0", "limit": 100}).json()["targets"]}
            assert assigned

            def scraped_targets() -> set[str] | None:
                answer = httpx.get(f"{child_url}/api/v1/targets", timeout=5)
                if answer.status_code != 200:  # 503 while Prometheus starts
                    return None
                data = answer.json()["data"]["activeTargets"]
                found = {t["labels"]["instance"] for t in data if t["labels"]["job"] != "gpufed-heartbeat"}
                return found if found else None

            found = wait_for(scraped_targets, timeout=90, interval=0.5, what="targets from HTTP SD")
            assert found == assigned

            # helm test: the hook pod's script, in-cluster URLs swapped for these processes
            hook = next(o for o in objects if o["kind"] == "Pod")
            script = hook["spec"]["containers"][0]["command"][-1].replace(CLUSTER_CONTROLLER, local)
            script = re.sub(r"http://gpufed-child-cn-beijing-0\.[\w.-]+:9090", child_url, script)
            assert "monitoring.svc" not in script, script
            done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                                  check=False)
            assert done.returncode == 0, done.stdout + done.stderr
            # and it can fail: a shard the controller does not have
            broken = script.replace('"shard":"cn-beijing-0"', '"shard":"cn-beijing-9"')
            assert subprocess.run(["sh", "-c", broken], capture_output=True, timeout=60,
                                  check=False).returncode != 0
        finally:
            stop_process(proc)
