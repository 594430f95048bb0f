"""The logs tier as deployed: Promtail in compose/node.yml, Loki in the rendered monitoring tier.

Compose v2's ``config`` (the real binary, no daemon) checks the files interpolate and
cross-reference; ``logs.formats`` checks the Loki config compose mounts. Neither Promtail
nor Loki runs here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from conftest import ROOT
from deploy_tools import compose_binary
from typer.testing import CliRunner

from federation.commands import render
from logs import formats

SPEC = ROOT / "compose" / "federation.yaml"
INVENTORY = ROOT / "examples" / "inventory.yaml"


def compose(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(compose_binary()), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parent") / "out"
    app = typer.Typer(pretty_exceptions_enable=False)
    render.register(app)
    result = CliRunner().invoke(
        app,
        [
            "render",
            "--spec",
            str(SPEC),
            "--inventory",
            str(INVENTORY),
            "--out",
            str(out),
            "--target",
            "compose",
            "--no-check",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def monitoring(rendered: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    example = (rendered / "compose" / ".env.example").read_text().splitlines()
    lines = [
        re.sub(r"^((?![A-Z0-9_]*_FLAGS=)[A-Z0-9_]+)=$", r"\1=x-0123456789abcdef", line) for line in example
    ]
    env = tmp_path_factory.mktemp("env") / "m.env"
    env.write_text("\n".join([*lines, f"GPUFED_SPEC={SPEC}"]) + "\n")
    done = compose(
        "--env-file", str(env), "-f", "monitoring.yml", "config", "--format", "json", cwd=rendered / "compose"
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_loki_service_runs_the_rendered_config_in_the_thanos_bucket(
    rendered: Path, monitoring: dict[str, Any]
) -> None:
    loki = monitoring["services"]["loki"]
    config_arg = next(a for a in loki["command"] if a.startswith("-config.file="))
    assert "-config.expand-env=true" in loki["command"]
    path = rendered / config_arg.split(f"/gpufed/{rendered.name}/", 1)[1]
    config = formats.parse_loki(path.read_bytes(), source=str(path))
    assert config.target == "all"
    # the bucket Thanos writes to (MinIO here), under Loki's own prefix, keys from the env file
    store = config.storage_config.object_store
    assert store is not None and store.s3 is not None and store.storage_prefix == "loki"
    objstore = yaml.safe_load((rendered / "thanos" / "objstore.yml").read_text())
    assert (store.s3.bucket_name, store.s3.endpoint) == (
        objstore["config"]["bucket"],
        objstore["config"]["endpoint"],
    )
    assert store.s3.access_key_id == "${S3_ACCESS_KEY}" and loki["environment"]["S3_ACCESS_KEY"]
    # the ruler reads the rendered rules from the mounted tree
    assert config.ruler_storage is not None and config.ruler_storage.local is not None
    rules_dir = config.ruler_storage.local.directory.split(f"/gpufed/{rendered.name}/", 1)[1]
    rule_files = list((rendered / rules_dir).glob("*/*.yml"))
    assert [p.parent.name for p in rule_files] == ["fake"]
    formats.parse_rules(rule_files[0].read_bytes())
    assert any(p["published"] == "3100" for p in loki["ports"])


def test_node_file_runs_promtail_only_with_the_logs_profile() -> None:
    compose_dir = ROOT / "compose"
    plain = compose(
        "--env-file", "node.env.example", "-f", "node.yml", "config", "--format", "json", cwd=compose_dir
    )
    assert plain.returncode == 0, plain.stderr
    assert "promtail" not in json.loads(plain.stdout)["services"]
    done = compose(
        "--env-file",
        "node.env.example",
        "-f",
        "node.yml",
        "--profile",
        "logs",
        "config",
        "--format",
        "json",
        cwd=compose_dir,
    )
    assert done.returncode == 0, done.stderr
    promtail = json.loads(done.stdout)["services"]["promtail"]
    assert promtail["command"] == ["-config.file=/etc/promtail/promtail.yml", "-config.expand-env=true"]
    env = promtail["environment"]
    assert (env["NODE_NAME"], env["GPUFED_REGION"], env["GPUFED_LOKI_URL"]) == (
        "gpu-node-001",
        "cn-beijing",
        "http://monitoring-host:3100",
    )
    targets = {v["target"]: v for v in promtail["volumes"]}
    assert targets["/var/log/journal"]["read_only"] and targets["/etc/machine-id"]["read_only"]
    assert targets["/etc/promtail/promtail.yml"]["source"] == "/etc/gpufed/promtail.yml"
    assert promtail["restart"] == "unless-stopped" and promtail["healthcheck"]["test"]
