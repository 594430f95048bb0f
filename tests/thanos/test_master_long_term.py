"""``master.long_term``: where the master remote-writes, validated by field and checked by both promtools.

Regenerate the golden tree with ``GPUFED_REGEN_GOLDEN=1`` and review the diff. Only
``master/prometheus.yml`` is kept there: ``flags.json`` belongs to the flag renderer.
The end-to-end proof (the master's writes read back from a real VictoriaMetrics) is
``tests/e2e/test_long_term_vm.py``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import stack_tool

from federation.master.render import MASTER_FILE, load_rule_pack, render_master_bundle, render_master_config
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.errors import SpecError
from sharder.model.loading import parse_model
from tests.golden_tree import GOLDEN, check_golden_tree

ROOT = Path(__file__).resolve().parents[2]
VM_CASE = GOLDEN / "master-victoriametrics"
#: Master configs whose remote_write carries the master's queue_config: VictoriaMetrics,
#: Thanos Receive per region (split routers) and Thanos Receive with one tenant.
CONFIGS = {
    "victoriametrics": VM_CASE / "spec.yaml",
    "thanos-example": ROOT / "examples" / "federation.yaml",
    "thanos-s3-single": GOLDEN / "thanos-s3-single" / "spec.yaml",
}
BASE: dict[str, Any] = {
    "cluster": "gpu-dc1",
    "regions": [{"name": "dc1"}, {"name": "dc2"}],
    "jobs": [{"name": "gpu"}],
}
VM_URL = "http://vm:8428/api/v1/write"
RECEIVE = {
    "mode": "receive",
    "objstore": {"type": "FILESYSTEM", "config": {"directory": "/var/lib/thanos/bucket"}},
    "receive": {"hashrings": [{"name": "default", "endpoints": [{"address": "receive-0:10901"}]}]},
}
SIDECAR = {"mode": "sidecar", "objstore": RECEIVE["objstore"]}


def spec_of(master: dict[str, Any], **sections: Any) -> GpufedSpec:
    return parse_model(GpufedSpec, {**BASE, "master": master, **sections}, source="federation.yaml")


def test_golden() -> None:
    bundle = render_master_bundle(load_gpufed_spec(VM_CASE / "spec.yaml"), rule_pack={})
    check_golden_tree(VM_CASE, {MASTER_FILE: bundle[MASTER_FILE]})


@pytest.mark.parametrize("line", [2, 3])
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_master_config_passes_promtool_of_both_lines(case: str, line: int, tmp_path: Path) -> None:
    bundle = render_master_bundle(load_gpufed_spec(CONFIGS[case]), rule_pack=load_rule_pack())
    for rel, data in bundle.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    done = subprocess.run(
        [stack_tool(line, "promtool"), "check", "config", MASTER_FILE],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    writes = yaml.safe_load(bundle[MASTER_FILE])["remote_write"]
    assert writes and all(w["queue_config"]["capacity"] == 50000 for w in writes)
    assert all(w["queue_config"]["max_shards"] == 100 for w in writes)


def test_victoriametrics_is_one_write_with_the_spec_settings() -> None:
    spec = spec_of(
        {
            "long_term": {
                "kind": "victoriametrics",
                "url": VM_URL,
                "remote_timeout": "45s",
                "queue_config": {"capacity": 80000, "batch_send_deadline": "2s"},
                "basic_auth": {"username": "gpufed", "password_file": "/run/secrets/vm"},
            }
        },
        thanos=SIDECAR,  # sidecar uploads blocks; the remote_write is free for another store
    )
    assert render_master_config(spec)["remote_write"] == [
        {
            "name": "victoriametrics",
            "url": VM_URL,
            "remote_timeout": "45s",
            "queue_config": {"capacity": 80000, "max_shards": 100, "batch_send_deadline": "2s"},
            "basic_auth": {"username": "gpufed", "password_file": "/run/secrets/vm"},
        }
    ]


def test_any_receiver_and_no_store() -> None:
    other = spec_of({"long_term": {"kind": "remote_write", "url": "https://mimir.example/api/v1/push"}})
    (write,) = render_master_config(other)["remote_write"]
    assert (write["name"], write["url"]) == ("long-term", "https://mimir.example/api/v1/push")
    assert "remote_write" not in render_master_config(spec_of({}))


def test_thanos_receive_is_the_default_and_takes_the_queue() -> None:
    implicit = render_master_config(spec_of({}, thanos=RECEIVE))["remote_write"]
    explicit = spec_of({"long_term": {"kind": "thanos", "queue_config": {"max_shards": 30}}}, thanos=RECEIVE)
    assert [w["name"] for w in implicit] == ["thanos-receive"]
    assert implicit[0]["queue_config"] == {"capacity": 50000, "max_shards": 100}
    (write,) = render_master_config(explicit)["remote_write"]
    assert write["queue_config"] == {"capacity": 50000, "max_shards": 30}
    assert write["url"] == implicit[0]["url"] and write["headers"] == {"THANOS-TENANT": "gpu-dc1"}


@pytest.mark.parametrize(
    ("master", "sections", "field", "says"),
    [
        ({"long_term": {"kind": "victoriametrics"}}, {}, "master.long_term", "needs url"),
        (
            {"long_term": {"kind": "victoriametrics", "url": "http://vm:8428"}},
            {}, "master.long_term", "/api/v1/write",
        ),
        ({"long_term": {"kind": "influxdb", "url": VM_URL}}, {}, "master.long_term.kind", "'influxdb'"),
        ({"long_term": {"kind": "remote_write", "url": "vm:8428"}}, {}, "master.long_term.url", "http://"),
        (
            {"long_term": {"kind": "thanos", "url": VM_URL}},
            {"thanos": RECEIVE}, "master.long_term", "leave url out",
        ),
        (
            {"long_term": {"kind": "victoriametrics", "url": VM_URL, "queue_config": {"min_shards": 101}}},
            {}, "master.long_term.queue_config", "min_shards 101 is above max_shards 100",
        ),
        (
            {"long_term": {"kind": "victoriametrics", "url": VM_URL, "queue_config": {"max_shards": 0}}},
            {}, "master.long_term.queue_config.max_shards", "greater than or equal to 1",
        ),
        (
            {"tenants": "per-region", "long_term": {"kind": "victoriametrics", "url": VM_URL}},
            {}, "master", "tenants per-region",
        ),
    ],
)
def test_bad_long_term_names_field_and_value(
    master: dict[str, Any], sections: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(master, **sections)
    assert caught.value.field == field
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("long_term", "thanos", "says"),
    [
        ({"kind": "thanos"}, None, "add a thanos section with mode receive"),
        ({"kind": "thanos"}, SIDECAR, "add a thanos section with mode receive"),
        ({"kind": "victoriametrics", "url": VM_URL}, RECEIVE, "Thanos Receive, which then gets nothing"),
    ],
)
def test_long_term_must_agree_with_thanos(
    long_term: dict[str, Any], thanos: dict[str, Any] | None, says: str
) -> None:
    sections = {} if thanos is None else {"thanos": thanos}
    with pytest.raises(SpecError, match=says):
        spec_of({"long_term": long_term}, **sections)


@pytest.mark.parametrize(
    "url",
    [
        "http://vm:8428/api/v1/write",
        "http://vm:8428/prometheus/api/v1/write",
        "http://vmagent:8429/api/v1/write",
        "http://vminsert:8480/insert/0/prometheus",
        "http://vminsert:8480/insert/7:3/prometheus/api/v1/write",
    ],
)
def test_victoriametrics_write_paths(url: str) -> None:
    spec = spec_of({"long_term": {"kind": "victoriametrics", "url": url}})
    assert render_master_config(spec)["remote_write"][0]["url"] == url


def test_docs_example_is_a_valid_master_section() -> None:
    text = (ROOT / "docs" / "master.md").read_text(encoding="utf-8")
    start = text.index("```yaml\nmaster:\n  long_term:")
    block = text[start + len("```yaml\n") : text.index("```", start + 3)]
    master = yaml.safe_load(block)["master"]
    (write,) = render_master_config(spec_of(master))["remote_write"]
    assert write["name"] == "victoriametrics"
    assert write["queue_config"] == {"capacity": 50000, "max_shards": 100}
