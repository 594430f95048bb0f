"""The compose runner's pure parts: Compose's resolved model read as Compose means it, the image
table, the restart policies, the hosts file and the mount wrapper's order (no root needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from federation.testing.harnesses.composerun import images, model, sandbox, supervise
from federation.testing.harnesses.composerun.plan import compose_binary, env_lines


def resolved_node_file(tmp_path: Path) -> dict[str, object]:
    env = tmp_path / "node.env"
    env.write_text(env_lines(ROOT / "compose" / "node.env.example", {"NODE_NAME": "gpu-7"}))
    done = subprocess.run(
        [
            str(compose_binary()),
            "--env-file",
            str(env),
            "-f",
            "node.yml",
            "-p",
            "n7",
            "config",
            "--format",
            "json",
        ],
        cwd=ROOT / "compose",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(done.stdout))


def test_node_file_as_compose_resolves_it(tmp_path: Path) -> None:
    project = model.parse_project(resolved_node_file(tmp_path))
    exporter, node_exporter = project.services["gpufed-exporter"], project.services["node-exporter"]
    assert exporter.command == ("gpufed-exporter",) and exporter.network_mode == "host"
    assert exporter.environment["GPUFED_EXPORTER_NODE_NAME"] == "gpu-7"  # from the env file
    assert exporter.restart == "unless-stopped"
    assert exporter.healthcheck is not None and exporter.healthcheck.test[0] == "python"
    assert exporter.healthcheck.start_period == 20.0 and exporter.healthcheck.interval == 30.0
    assert "runtime" in exporter.ignored and "deploy" in exporter.ignored
    assert node_exporter.volumes == (model.Volume("bind", "/", "/host", True),)
    assert "alloy" not in project.services  # profiles are Compose's to apply


def test_durations_and_cycles() -> None:
    assert model.seconds("1m30s", 0) == 90.0 and model.seconds(None, 5.0) == 5.0
    with pytest.raises(model.ModelError, match="duration"):
        model.seconds("30 s", 0)
    raw = {
        "name": "p",
        "services": {
            "a": {"image": "x", "depends_on": {"b": {"condition": "service_healthy"}}},
            "b": {"image": "x", "depends_on": {"a": {"condition": "service_started"}}},
        },
    }
    with pytest.raises(model.ModelError, match="cycle"):
        model.start_order(model.parse_project(raw).services)
    ordered = {
        "name": "p",
        "services": {
            "a": {"image": "x", "depends_on": {"b": {"condition": "service_healthy"}}},
            "b": {"image": "x"},
        },
    }
    assert model.start_order(model.parse_project(ordered).services) == ["b", "a"]


@pytest.mark.parametrize(
    ("image", "kind"),
    [
        ("ghcr.io/gpufed/gpufed:0.1.0", "real"),
        ("registry.example.com/gpufed/gpufed:0.2.0", "real"),
        ("quay.io/prometheus/prometheus:v3.13.3", "real"),
        ("quay.io/prometheus/alertmanager:v0.35.1@sha256:" + "0" * 64, "real"),
        ("quay.io/thanos/thanos:v0.36.1", "left_out"),
        ("hashicorp/consul:1.19.2", "standin"),
        ("example.com/something/else:1", "left_out"),
    ],
)
def test_every_image_maps_to_a_binary_a_standin_or_nothing(image: str, kind: str) -> None:
    assert images.rule_for(image).kind == kind


def test_overrides_apply_to_the_declared_commands_only() -> None:
    assert {
        k
        for o in images.overrides_for("ghcr.io/gpufed/gpufed:0.1.0", ("gpufed-exporter",))
        for k in o.environment
    } == {"GPUFED_EXPORTER_BACKEND", "GPUFED_EXPORTER_SEED"}
    assert images.overrides_for("ghcr.io/gpufed/gpufed:0.1.0", ("sh", "-c", "exec gpufed serve")) == []
    assert images.overrides_for("quay.io/prometheus/prometheus:v3.13.3", ("gpufed-exporter",)) == []


@pytest.mark.parametrize(
    ("policy", "code", "restarts", "again"),
    [
        ("unless-stopped", -9, 0, True),
        ("always", 0, 5, True),
        ("no", 1, 0, False),
        ("on-failure", 0, 0, False),
        ("on-failure", 1, 0, True),
        ("on-failure:2", 1, 2, False),
    ],
)
def test_restart_policies_as_docker_applies_them(policy: str, code: int, restarts: int, again: bool) -> None:
    assert supervise.restarts_after(policy, code, restarts) is again


def test_hosts_file_names_every_alias_once() -> None:
    text = sandbox.hosts_file(
        {"thanos-router-0": "10.213.0.11", "thanos-router": "10.213.0.11", "oapi.dingtalk.com": "10.213.0.10"}
    )
    assert "10.213.0.11\tthanos-router thanos-router-0\n" in text
    assert text.startswith("127.0.0.1\tlocalhost\n")


def test_wrapper_binds_new_roots_first_and_overlays_missing_parents(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    spec = tmp_path / "federation.yaml"
    spec.write_text("x")
    script = sandbox.wrapper_script(
        root=tmp_path / "root",
        layers=tmp_path / "layers",
        hosts=tmp_path / "hosts",
        binds=[
            sandbox.Bind(spec, "/etc/gpufed-test-absent/federation.yaml", True),
            sandbox.Bind(source, "/gpufed-test-absent", True),
        ],
    )
    lines = script.splitlines()
    new_root = next(
        i for i, line in enumerate(lines) if "/root/gpufed-test-absent" in line and "rbind" in line
    )
    first_host = next(i for i, line in enumerate(lines) if line.startswith("mount --rbind /usr "))
    overlay = next(i for i, line in enumerate(lines) if "lowerdir=/etc," in line)
    spec_bind = next(i for i, line in enumerate(lines) if "federation.yaml" in line and "rbind" in line)
    assert new_root < first_host < overlay < spec_bind  # the host's /etc is never written
    assert lines[-1].startswith("exec chroot ") and "/etc/hosts" in lines[-2]
    assert f"mount -o remount,bind,ro {tmp_path}/root/gpufed-test-absent" in lines
