"""The master's flags per Prometheus line, and that each line's real binary takes them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from federation.master.render import master_flags
from federation.spec import GpufedSpec
from tests.conftest import stack_tool

SPEC: dict[str, Any] = {
    "cluster": "c",
    "regions": [{"name": "r"}],
    "jobs": [{"name": "gpu"}],
    "remote_write": [{"name": "m", "url": "http://master:9090/api/v1/write"}],
    "master": {"replicas": 2},
}


def flags_for(version: str, *, protocol: str = "1.0") -> list[str]:
    doc = {**SPEC, "prometheus": {"version": version},
           "remote_write": [{**SPEC["remote_write"][0], "protocol": protocol}]}
    return list(master_flags(GpufedSpec.model_validate(doc))["flags"])


def test_env_expansion_flag_only_on_line_2() -> None:
    assert "--enable-feature=expand-external-labels" in flags_for("2.53")
    assert not any(flag.startswith("--enable-feature") for flag in flags_for("3"))


def test_remote_write_2_accepted_only_when_opted_in() -> None:
    accepted = [f for f in flags_for("3", protocol="2.0") if "accepted-protobuf-messages" in f]
    messages = [f.split("=", 1)[1] for f in accepted]
    assert messages == ["prometheus.WriteRequest", "io.prometheus.write.v2.Request"]
    assert not any("accepted-protobuf-messages" in f for f in flags_for("3"))


@pytest.mark.parametrize(("line", "version"), [(2, "2.53"), (3, "3"), (3, "3.5")])
def test_each_lines_prometheus_takes_its_flags(line: int, version: str, tmp_path: Path) -> None:
    """The real binary parses the flags (`--help` after them: parse, print, exit 0)."""
    accept = "--web.remote-write-receiver.accepted-protobuf-messages=prometheus.WriteRequest"
    extra = [accept] if line == 3 else []
    flags = [f.replace("/var/lib/prometheus/master", str(tmp_path)) for f in flags_for(version)]
    done = subprocess.run([stack_tool(line, "prometheus"), *flags, *extra, "--help"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr[-500:]
