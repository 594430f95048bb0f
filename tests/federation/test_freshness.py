"""The freshness records (``federation.master.freshness``): bounds from the spec, the shipped copy,
the bundle.

Their behaviour (a dead child's targets read as down, a removed target is gone, a shard
missing within 2 minutes) is proven by ``promtool test rules`` in
``federation/rules/tests/federation_test.yml``; here: that the bounds follow the spec and
that every copy of the file is the rendering it claims to be.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import stack_tool

from federation.master import freshness
from federation.master.render import RULES_DIR, load_rule_pack, render_master_bundle
from federation.spec import GpufedSpec, load_gpufed_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "federation.yaml"
SHIPPED = ROOT / "federation" / "rules" / freshness.FILE_NAME
REGENERATE = (
    "python -c \"from federation import freshness; from federation.spec import load_gpufed_spec; "
    "open('federation/rules/freshness.yml','wb').write(freshness.render_file("
    "load_gpufed_spec('examples/federation.yaml')))\" && cp federation/rules/freshness.yml helm/gpufed/rules/"
)


def test_shipped_file_is_the_rendering_of_the_example_spec() -> None:
    rendered = freshness.render_file(load_gpufed_spec(EXAMPLE))
    assert SHIPPED.read_bytes() == rendered, f"regenerate with: {REGENERATE}"


def test_bounds_are_three_intervals_plus_the_send_deadline() -> None:
    spec = load_gpufed_spec(EXAMPLE)  # gpu 15s, node 30s, batch_send_deadline 5s, master 30s
    assert freshness.bounds(spec) == ({"gpu": "50s", "node": "95s"}, "95s")
    assert freshness.shard_bound(spec) == "50s"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["jobs"][0]["scrape_interval"] = "1m"
    doc["remote_write"] = [{"name": "m", "url": "http://m:9090/api/v1/write",
                            "queue_config": {"batch_send_deadline": "10s"}}]
    slower = GpufedSpec.model_validate(doc)
    assert freshness.bounds(slower) == ({"gpu": "190s", "node": "100s"}, "190s")
    # The heartbeat runs at the shortest interval (node, 30s): 3 x 30s + 10s.
    assert freshness.shard_bound(slower) == "100s"
    doc["jobs"][1]["scrape_interval"] = "20s"
    assert freshness.shard_bound(GpufedSpec.model_validate(doc)) == "70s"
    doc["remote_write"] = []
    assert freshness.send_slack_s(GpufedSpec.model_validate(doc)) == freshness.DEFAULT_SEND_DEADLINE_S


@pytest.mark.parametrize("line", [2, 3])
def test_master_bundle_carries_the_spec_own_bounds(line: int, tmp_path: Path) -> None:
    demo = ROOT / "federation" / "demo" / "default-spec.yaml"
    spec = GpufedSpec.model_validate(yaml.safe_load(demo.read_text()))
    bundle = render_master_bundle(spec, rule_pack=load_rule_pack())
    text = bundle[f"{RULES_DIR}/{freshness.FILE_NAME}"].decode()
    # 3 x 5s + 1s deadline
    assert 'gpufed:up_copy:silent_last_seen_seconds{job="gpu"} > time() - 3600) < time() - 16' in text
    assert bundle[f"{RULES_DIR}/{freshness.FILE_NAME}"] != SHIPPED.read_bytes()
    # Region records read the spec's jobs, never the master's own scrapes; shard records the
    # children's heartbeats, never `up` (3 x the 5s heartbeat + 1s).
    jobs = "|".join(sorted(job.name for job in spec.jobs))
    assert f'count_values by (cluster, region) ("up", gpufed:target_up:fresh{{job=~"{jobs}"}})' in text
    assert "gpufed-child" not in text
    assert "max by (cluster, region, shard) (timestamp(gpufed_child_heartbeat))" in text
    assert "timestamp(up{shard" not in text and "< time() - 16\n" in text
    path = tmp_path / freshness.FILE_NAME
    path.write_text(text)
    done = subprocess.run([stack_tool(line, "promtool"), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
