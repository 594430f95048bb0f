"""``gpufed render`` with master:/thanos: sections: one pipeline, checked by promtool, swapped whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from federation.master import pipeline
from federation.master.render import MASTER_FILE, load_rule_pack, render_master_config
from federation.spec import load_gpufed_spec
from sharder.kernel.errors import ConfigCheckError
from sharder.kernel.promtool import Promtool

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "federation.yaml"
INVENTORY = ROOT / "examples" / "inventory.yaml"


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_render_writes_master_and_thanos_beside_the_children(tmp_path: Path, promtool: str) -> None:
    spec, targets = pipeline.load_inputs(SPEC, INVENTORY)
    result = pipeline.render(spec, targets, out=tmp_path / "out", checker=Promtool(promtool))
    assert result.master_checked and pipeline.summary(result)["master_checked"]
    files = tree(tmp_path / "out")
    for name, data in load_rule_pack().items():
        assert files[f"master/rules/{name}"] == data
    for path in (
        "master/prometheus.yml",
        "master/flags.json",
        "thanos/hashrings.json",
        "thanos/objstore.yml",
        "thanos/receive.json",
        "thanos/query.json",
        "thanos/store.json",
        "thanos/compact.json",
    ):
        assert path in files, path


def test_per_region_tenants_and_every_alertmanager(tmp_path: Path) -> None:
    spec = load_gpufed_spec(SPEC)
    config = render_master_config(spec)
    writes = {w["name"]: w for w in config["remote_write"]}
    for region in spec.region_names():
        assert writes[f"thanos-{region}"]["headers"] == {"THANOS-TENANT": region}
        assert writes[f"thanos-{region}"]["write_relabel_configs"][0]["action"] == "keep"
    assert writes["thanos-cluster"]["headers"] == {"THANOS-TENANT": spec.cluster}
    assert spec.alerting is not None
    targets = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == [r.address for r in spec.alerting.replicas]
    relabel = config["alerting"]["alert_relabel_configs"]
    assert {"action": "labeldrop", "regex": "replica|receive_replica"} in relabel
    assert {
        "action": "replace",
        "source_labels": ["node"],
        "regex": "[^*].*",
        "target_label": "shard",
        "replacement": "",
    } in relabel
    assert config["global"]["external_labels"]["replica"] == "${GPUFED_MASTER_REPLICA}"


def test_a_master_config_promtool_rejects_leaves_the_old_tree(tmp_path: Path, promtool: str) -> None:
    spec, targets = pipeline.load_inputs(SPEC, INVENTORY)
    out = tmp_path / "out"
    pipeline.render(spec, targets, out=out, checker=Promtool(promtool))
    before = tree(out)
    broken = tmp_path / "broken.yml"
    broken.write_text("groups: [{name: x, rules: [{alert: A, expr: 'sum(('}]}]\n")
    document = yaml.safe_load(SPEC.read_text())
    document["master"]["extra_rule_files"] = [str(broken)]
    bad = tmp_path / "federation.yaml"
    bad.write_text(yaml.safe_dump(document))
    bad_spec, _ = pipeline.load_inputs(bad, INVENTORY)
    with pytest.raises(ConfigCheckError) as info:
        pipeline.render(bad_spec, targets, out=out, checker=Promtool(promtool))
    assert info.value.path == MASTER_FILE
    assert tree(out) == before
