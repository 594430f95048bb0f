"""The logs tier as deployed: Promtail in compose/node.yml, Loki in the rendered monitoring tier.

Compose v2's ``config`` (the real binary, no daemon) checks the files interpolate and
cross-reference; ``logs.formats`` checks the Loki config compose mounts. Neither Promtail
nor Loki runs here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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


def _node_services(*profiles: str) -> dict[str, Any]:
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    done = compose("--env-file", "node.env.example", "-f", "node.yml", *args, "config", "--format", "json",
                   cwd=ROOT / "compose")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["services"])


def test_node_file_runs_alloy_only_with_the_logs_profile() -> None:
    plain = _node_services()
    assert not {"alloy", "alloy-config", "promtail"} & set(plain)
    services = _node_services("logs")
    assert "promtail" not in services  # end of life: only its own profile starts it
    init, alloy = services["alloy-config"], services["alloy"]
    assert init["command"] == ["python", "-m", "logs.expand_env", "/etc/gpufed/promtail.yml",
                               "/etc/alloy/promtail.yml"]
    env = init["environment"]
    assert (env["NODE_NAME"], env["GPUFED_REGION"], env["GPUFED_LOKI_URL"]) == (
        "gpu-node-001",
        "cn-beijing",
        "http://monitoring-host:3100",
    )
    sources = {v["target"]: v["source"] for v in init["volumes"]}
    assert sources["/etc/gpufed/promtail.yml"] == "/etc/gpufed/promtail.yml"
    assert alloy["depends_on"]["alloy-config"]["condition"] == "service_completed_successfully"
    assert alloy["command"][:2] == ["run", "--config.format=promtail"]
    assert alloy["command"][-1] == "/etc/alloy/promtail.yml"  # the file alloy-config wrote
    targets = {v["target"]: v for v in alloy["volumes"]}
    # Alloy reads what alloy-config wrote: the same volume
    assert targets["/etc/alloy"]["source"] == sources["/etc/alloy"] and targets["/etc/alloy"]["read_only"]
    assert targets["/var/log/journal"]["read_only"] and targets["/etc/machine-id"]["read_only"]
    assert alloy["restart"] == "unless-stopped" and alloy["healthcheck"]["test"]


def test_promtail_is_opt_in_and_marked_end_of_life() -> None:
    promtail = _node_services("promtail")["promtail"]
    assert promtail["command"] == ["-config.file=/etc/promtail/promtail.yml", "-config.expand-env=true"]
    text = (ROOT / "compose" / "node.yml").read_text()
    assert "END OF LIFE since 2026-03-02" in text.split("  promtail:")[0]


# ---- Helm: the opt-in DaemonSet and Loki, rendered by the Helm v4 SDK ----------------------------

CHART = ROOT / "helm" / "gpufed"
LOGS_VALUES = CHART / "ci" / "logs-values.yaml"


def _chart_objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    import helm_python as helm

    out = helm.Chart.load(CHART).render(values, name="gpufed", namespace="monitoring")
    return [
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_chart_logs_tier_runs_what_the_controller_renders(tmp_path: Path) -> None:
    """The chart's spec, rendered by gpufed, names exactly the Services and mounts the chart makes."""
    from federation.master.pipeline import logs_part
    from federation.spec import load_gpufed_spec
    from logs import loki, promtail, rules

    objects = _chart_objects(yaml.safe_load(LOGS_VALUES.read_text()))
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(_named(objects, "ConfigMap", "gpufed-spec")["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    assert spec.logs is not None and spec.logs.loki.host == "gpufed-loki"
    bundle = logs_part(spec, [], None)  # type: ignore[arg-type]
    config = formats.parse_loki(bundle[loki.SCALABLE_FILE])
    assert config.memberlist is not None
    members = {m.split(":")[0] for m in config.memberlist.join_members}
    assert members == {_named(objects, "Service", "gpufed-loki-memberlist")["metadata"]["name"]}
    assert config.common.compactor_address == "http://gpufed-loki-backend:3100"
    for target in ("read", "write", "backend"):
        kind = "Deployment" if target == "read" else "StatefulSet"
        pod = _named(objects, kind, f"gpufed-loki-{target}")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert f"-target={target}" in container["args"] and "-config.expand-env=true" in container["args"]
        assert container["envFrom"] == [{"secretRef": {"name": "gpufed-objstore-env"}}]
        init = pod["initContainers"][0]
        assert {e["name"]: e.get("value") for e in init["env"]}["PREFIX"] == "logs/"
        assert f"-config.file=/config/{loki.SCALABLE_FILE}" in container["args"]
    # the ruler reads the rendered rule files where the tree sync puts them: <config_dir>/rules/<tenant>/
    assert config.ruler_storage is not None and config.ruler_storage.local is not None
    assert f"/config/{rules.rules_file(spec.logs)}".startswith(
        config.ruler_storage.local.directory + "/fake/"
    )
    # The node agent, Alloy by default: alloy-config (logs.expand_env, as compose/node.yml runs
    # it) fills in every ${VAR} the rendered Promtail file names, from the DaemonSet's env
    daemon = _named(objects, "DaemonSet", "gpufed-alloy")["spec"]["template"]["spec"]
    (expand,) = [c for c in daemon["initContainers"] if c["name"] == "alloy-config"]
    assert expand["command"] == ["python", "-m", "logs.expand_env", "/config/promtail.yml",
                                 "/alloy/promtail.yml"]
    (alloy,) = daemon["containers"]
    assert alloy["args"][:2] == ["run", "--config.format=promtail"]
    assert alloy["args"][-1] == "/alloy/promtail.yml"  # the file alloy-config wrote
    for holder in (expand, _promtail_container(values_with_agent("promtail"))):
        env = {e["name"]: e for e in holder["env"]}
        wanted = set(re.findall(r"\$\{([A-Z_]+)", bundle[promtail.CONFIG_FILE].decode()))
        assert wanted <= set(env), sorted(wanted - set(env))
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["GPUFED_LOKI_URL"]["value"] == "http://gpufed-loki-write.monitoring.svc:3100"
        assert (env["GPUFED_REGION"]["value"], env["GPUFED_RACK"]["value"]) == ("cn-beijing", "r01")
    mounts = {m["mountPath"]: m for m in alloy["volumeMounts"]}
    assert mounts["/var/log/journal"]["readOnly"] and mounts["/var/log/pods"]["readOnly"]
    assert mounts["/alloy"]["readOnly"] and "/var/lib/promtail" in mounts  # the file's positions path
    # the init container's command, run here with its env (the downward API's node name filled in)
    source, written = tmp_path / "promtail.yml", tmp_path / "alloy" / "promtail.yml"
    source.write_bytes(bundle[promtail.CONFIG_FILE])
    written.parent.mkdir()
    env = {e["name"]: e.get("value", "gpu-7") for e in expand["env"]}
    done = subprocess.run([sys.executable, *expand["command"][1:3], str(source), str(written)],
                          env={**os.environ, **env}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = written.read_text()
    assert "${" not in text and "gpu-7" in text and "http://gpufed-loki-write.monitoring.svc:3100" in text


def values_with_agent(agent: str) -> dict[str, Any]:
    given = yaml.safe_load(LOGS_VALUES.read_text())
    given["logs"]["agent"] = agent
    return given


def _promtail_container(values: dict[str, Any]) -> dict[str, Any]:
    daemon = _named(_chart_objects(values), "DaemonSet", "gpufed-promtail")["spec"]["template"]["spec"]
    (container,) = daemon["containers"]
    assert container["args"] == ["-config.file=/config/promtail.yml", "-config.expand-env=true"]
    return dict(container)


def test_chart_logs_needs_the_federation_sections() -> None:
    import helm_python as helm

    values = yaml.safe_load(LOGS_VALUES.read_text())
    del values["federation"]["logs"]
    with pytest.raises(helm.HelmError, match=r"logs\.enabled needs federation\.logs"):
        _chart_objects(values)
    assert not any(
        o["metadata"]["name"].startswith("gpufed-loki")
        for o in _chart_objects({"controller": {"token": {"value": "ci-token-0123456789abcdef"}}})
    )
