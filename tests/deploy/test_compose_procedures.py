"""compose/README.md's procedures against a real ``gpufed serve``: a node joins, a shard is added.

Docker does not run here, so the pieces run as processes instead: the controller as
``gpufed serve`` with the compose spec (the example inventory stands in for a fleet that
has registered), and one node's exporter with exactly the environment Compose
interpolates from ``compose/node.yml`` and ``node.env.example`` (only the listen port,
the controller URL and the simulated GPU backend differ). The README's "Add a shard"
shell block runs as written, with curl and jq, against that controller.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, require_tool, stop_process, wait_for
from test_compose import INVENTORY, SPEC, compose, invoke

from federation.localrun.loopback import free_port
from tests.controller.harness import TOKEN
from tests.controller.serve_process import ServeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
README = (ROOT / "compose" / "README.md").read_text()
NODE = "compose-node-test"


def readme_section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.M | re.S)
    assert match, f"compose/README.md has no '## {title}' section"
    return match.group(1)


def shell_blocks(text: str) -> list[str]:
    return [re.sub(r"(?m)^ {3}", "", b) for b in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def node_environment(tmp_path: Path, controller_url: str) -> dict[str, str]:
    """The exporter's environment as Compose interpolates it from node.yml and the env example."""
    text = (ROOT / "compose" / "node.env.example").read_text()
    for name, value in {"NODE_NAME": NODE, "GPUFED_CONTROLLER_URL": controller_url,
                        "GPUFED_REGISTER_TOKEN": TOKEN, "GPUFED_ADVERTISE_ADDRESS": "127.0.0.1"}.items():
        text, found = re.subn(rf"(?m)^{name}=.*$", f"{name}={value}", text)
        assert found == 1, name
    env_file = tmp_path / "node.env"
    env_file.write_text(text)
    done = compose("--env-file", str(env_file), "-f", "node.yml", "config", "--format", "json",
                   cwd=ROOT / "compose")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["services"]["gpufed-exporter"]["environment"])


def registered_jobs(ctl: ServeProcess) -> dict[str, dict[str, Any]] | None:
    rows = ctl.client.get("/v1/registry/targets").json()["targets"]
    jobs = {row["job"]: row for row in rows if row["node"] == NODE}
    return jobs if set(jobs) == {"gpu", "node"} else None


def json_documents(text: str) -> list[Any]:
    """Every JSON value printed one after another (jq's pretty output, then curl's)."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
    return docs


def test_a_node_registers_and_the_readme_adds_a_shard(tmp_path: Path) -> None:
    require_tool("curl")
    require_tool("jq")
    extra = ("--inventory", str(INVENTORY), "--no-check", "--handover-window", "5")
    with ServeProcess(spec=SPEC, data_dir=tmp_path / "ctl", log=tmp_path / "serve.log", extra=extra) as ctl:
        wait_for(lambda: ctl.client.get("/readyz").status_code == 200, timeout=90, what="controller ready")

        # Add a GPU node: node.yml's exporter registers itself and node-exporter.
        env = node_environment(tmp_path, ctl.url)
        port = free_port()
        assert env["GPUFED_EXPORTER_NODE_EXPORTER_PORT"] == "9100"
        env |= {"GPUFED_EXPORTER_LISTEN": f"127.0.0.1:{port}", "GPUFED_EXPORTER_BACKEND": "simulated",
                "GPUFED_EXPORTER_GPUS": "2"}
        with (tmp_path / "exporter.log").open("wb") as log:
            exporter = subprocess.Popen(
                [str(Path(sys.executable).with_name("gpufed-exporter")), "serve"],
                env={"PATH": os.environ["PATH"], **env}, stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            jobs = wait_for(lambda: registered_jobs(ctl), timeout=90, what="gpu and node targets registered")
            got = {job: (row["address"], row["port"], row["region"]) for job, row in jobs.items()}
            assert got == {"gpu": ("127.0.0.1", port, "cn-beijing"),
                           "node": ("127.0.0.1", 9100, "cn-beijing")}
            identities = {row["identity"] for row in jobs.values()}

            def assigned() -> dict[str, str] | None:
                placed = {i: s for i, s in ctl.placement().items() if i in identities}
                return placed if len(placed) == 2 else None

            placed = wait_for(assigned, timeout=90, what="both targets assigned")
            assert all(shard.startswith("cn-beijing-") for shard in placed.values()), placed
        finally:
            stop_process(exporter)
        wait_for(lambda: registered_jobs(ctl) is None, timeout=60, what="deregistered on stop")

        # Add a shard, step 2: the README's REST calls, as written.
        blocks = shell_blocks(readme_section("Add a shard"))
        assert len(blocks) == 2
        script = blocks[1].replace("http://monitoring-host:8080", ctl.url)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                              timeout=120, check=False,
                              env={"PATH": os.environ["PATH"], "GPUFED_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr
        summary, applied = json_documents(done.stdout)
        assert summary["added_shards"] == ["cn-beijing-2"], summary
        assert applied["applied"] is True and applied["counts"]["moved"] > 0, applied
        shards = {row["shard"]: row for row in ctl.client.get("/v1/shards").json()["shards"]}
        assert {"cn-beijing-0", "cn-beijing-1", "cn-beijing-2"} <= set(shards)
        served = httpx.get(f"{ctl.url}/v1/sd/cn-beijing-2/gpu", timeout=10).json()
        assert sum(len(group["targets"]) for group in served) > 0

    # Add a shard, step 1: the render with the region's shards raised names that child.
    spec = yaml.safe_load(SPEC.read_text())
    next(r for r in spec["regions"] if r["name"] == "cn-beijing")["shards"] = 3
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    out = tmp_path / "parent" / "out"
    result = invoke("render", "--spec", spec_file, "--inventory", INVENTORY, "--out", out,
                    "--target", "compose", "--no-check")
    assert result.exit_code == 0, result.output
    services = yaml.safe_load((out / "compose" / "monitoring.yml").read_text())["services"]
    assert "child-cn-beijing-2" in services
    child = yaml.safe_load((out / "children" / "cn-beijing-2" / "prometheus.yml").read_text())
    urls = {c["url"] for job in child["scrape_configs"] for c in job.get("http_sd_configs", [])}
    assert "http://gpufed-controller:8080/v1/sd/cn-beijing-2/gpu" in urls, urls
