"""master.query.max_concurrency: the spec field, the flag in flags.json (compose runs it), and
the flag name as both pinned Prometheus lines spell it (``prometheus --help``)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from pydantic import ValidationError

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


def flags(master: dict[str, Any]) -> list[str]:
    spec = GpufedSpec.model_validate({**SPEC, "master": {**SPEC["master"], **master}})
    return list(master_flags(spec)["flags"])


def test_set_renders_the_flag_unset_keeps_prometheus_default() -> None:
    assert "--query.max-concurrency=64" in flags({"query": {"max_concurrency": 64}})
    assert not any(f.startswith("--query.max-concurrency") for f in flags({}))


@pytest.mark.parametrize("bad", [0, -1, "many"])
def test_bad_values_name_the_field(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        flags({"query": {"max_concurrency": bad}})
    assert caught.value.errors()[0]["loc"][-3:] == ("master", "query", "max_concurrency")


@pytest.mark.parametrize("line", [2, 3])
def test_both_lines_know_the_flag(line: int) -> None:
    done = subprocess.run([stack_tool(line, "prometheus"), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert "--query.max-concurrency=" in done.stdout + done.stderr
