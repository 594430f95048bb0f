"""Child config rendering: golden trees checked by the real promtool, plus unit checks.

Regenerate the golden trees with ``GPUFED_REGEN_GOLDEN=1 pytest tests/sharder/children/test_render.py``
and review the diff; without the flag a mismatch fails and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharder.children import render, tree
from sharder.engine.assignment import Assignment, ShardInfo
from sharder.kernel import output
from sharder.kernel.errors import AssignmentError, ConfigCheckError
from sharder.kernel.promtool import Promtool, check_all
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec, PrometheusSpec
from tests.conftest import stack_tool

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
REGEN = os.environ.get("GPUFED_REGEN_GOLDEN") == "1"

Case = tuple[FederationSpec, list[Target], Assignment]

JOBS: list[dict[str, Any]] = [
    {
        "name": "gpu",
        "scrape_interval": "15s",
        "scrape_timeout": "10s",
        "keep_metrics": ["DCGM_FI_.*", "up"],
        "drop_labels": ["pci_bus_id", "uuid"],
        "sample_limit": 50000,
    },
    {"name": "node", "drop_metrics": ["node_filesystem_device_error"], "honor_labels": True},
]


def node_targets(region: str, count: int, *, prefix: str, octet: int) -> list[Target]:
    targets = []
    for i in range(count):
        common = {"address": f"10.{octet}.0.{i + 10}", "node": f"{prefix}-n{i:02d}", "region": region}
        targets.append(Target(**common, port=9400, job="gpu", rack="r00", team="llm", gpus=8 - 4 * (i % 2)))
        targets.append(
            Target(**common, port=9100, job="node", metrics_path="/node/metrics" if i == 0 else None)
        )
    return targets


def assign_round_robin(
    targets: list[Target], shards: dict[str, ShardInfo], *, replicas: int = 1
) -> Assignment:
    """A fixed, engine-free assignment: nodes dealt round-robin over their region's shards."""
    by_region: dict[str, list[str]] = {}
    for shard, info in sorted(shards.items()):
        by_region.setdefault(info.region, []).append(shard)
    owners: dict[str, str] = {}
    for target in targets:
        pool = by_region[target.region]
        owners[target.identity] = pool[int(target.node.rsplit("n", 1)[1]) % len(pool)]
    return Assignment(
        algorithm="bounded-rendezvous",
        algorithm_version=1,
        replication_factor=replicas,
        shards=shards,
        targets=owners,
        weights={t.identity: t.weight for t in targets},
    )


def case_file_sd_basic() -> Case:
    spec = FederationSpec.model_validate(
        {
            "cluster": "gpu-test",
            "regions": [{"name": "cn-beijing", "shards": 2}],
            "jobs": JOBS,
            "remote_write": [
                {
                    "name": "master",
                    "url": "http://master:9090/api/v1/write",
                    "queue_config": {"capacity": 10000, "max_shards": 30, "batch_send_deadline": "5s"},
                }
            ],
            "external_labels": {"env": "test"},
        }
    )
    targets = node_targets("cn-beijing", 4, prefix="bj", octet=10)
    shards = {f"cn-beijing-{i}": ShardInfo(region="cn-beijing", index=i) for i in range(2)}
    return spec, targets, assign_round_robin(targets, shards)


def case_http_sd_rf2() -> Case:
    spec = FederationSpec.model_validate(
        {
            "cluster": "gpu-test",
            "regions": [{"name": "cn-beijing", "shards": 1}, {"name": "cn-shanghai", "shards": 2}],
            "sharding": {"replication_factor": 2},
            "jobs": JOBS,
            "children": {
                "target_discovery": "http_sd",
                "http_sd_url": "http://gpufed-controller:8080/",
                "http_sd_refresh_interval": "15s",
            },
        }
    )
    targets = node_targets("cn-beijing", 2, prefix="bj", octet=10)
    targets += node_targets("cn-shanghai", 3, prefix="sh", octet=11)
    shards = {"cn-beijing-0": ShardInfo(region="cn-beijing", index=0)}
    shards |= {f"cn-shanghai-{i}": ShardInfo(region="cn-shanghai", index=i) for i in range(2)}
    return spec, targets, assign_round_robin(targets, shards, replicas=2)


def case_agent_region_rw() -> Case:
    spec = FederationSpec.model_validate(
        {
            "cluster": "gpu-test",
            "regions": [{"name": "cn-beijing", "shards": 1}, {"name": "cn-hangzhou", "shards": 1}],
            "jobs": JOBS,
            "remote_write": [
                {
                    "name": "global",
                    "url": "https://thanos-receive:19291/api/v1/receive",
                    "authorization": {"credentials_file": "/etc/prometheus/secrets/receive-token"},
                },
                {
                    "name": "beijing-only",
                    "url": "http://bj-master:9090/api/v1/write",
                    "regions": ["cn-beijing"],
                    "basic_auth": {"username": "gpufed", "password_file": "/etc/prometheus/secrets/bj-write"},
                    "remote_timeout": "20s",
                    "headers": {"X-Scope-OrgID": "gpu"},
                    "queue_config": {
                        "max_samples_per_send": 2000,
                        "min_backoff": "50ms",
                        "max_backoff": "5s",
                    },
                },
            ],
            "children": {"agent_mode": True, "scrape_interval": "15s"},
        }
    )
    targets = node_targets("cn-beijing", 2, prefix="bj", octet=10)
    targets += node_targets("cn-hangzhou", 1, prefix="hz", octet=12)
    shards = {f"{r}-0": ShardInfo(region=r, index=0) for r in ("cn-beijing", "cn-hangzhou")}
    return spec, targets, assign_round_robin(targets, shards)


def case_agent_prometheus2() -> Case:
    """agent_region_rw rendered for Prometheus 2.53: the 2.x agent flag, no 3.x-only fields."""
    spec, targets, assignment = case_agent_region_rw()
    spec = spec.model_copy(update={"prometheus": PrometheusSpec(version="2.53")})
    return spec, targets, assignment


CASES: dict[str, Callable[[], Case]] = {
    "file_sd_basic": case_file_sd_basic,
    "http_sd_rf2": case_http_sd_rf2,
    "agent_region_rw": case_agent_region_rw,
    "agent_region_rw_prometheus2": case_agent_prometheus2,
}


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_tree(name: str) -> None:
    spec, targets, assignment = CASES[name]()
    bundle = tree.build_bundle(spec, targets, assignment)
    golden = GOLDEN / name
    if REGEN:
        shutil.rmtree(golden, ignore_errors=True)
        output.write_tree(golden, bundle)
    assert golden.is_dir(), f"no golden tree for {name}: run with GPUFED_REGEN_GOLDEN=1 and review"
    expected = read_tree(golden)
    assert sorted(bundle) == sorted(expected)
    for path, content in bundle.items():
        assert content == expected[path], f"{name}/{path} differs from golden"
    # The promtool of the line the tree was rendered for.
    promtool = stack_tool(spec.prometheus.release().major, "promtool")
    checked = promtool_check(golden, bundle, agent=spec.children.agent_mode, binary=promtool)
    assert checked == len(tree.prometheus_configs(bundle)) > 0


def test_each_line_gets_its_own_flags_and_fields() -> None:
    spec3, targets, assignment = case_agent_region_rw()
    spec2 = case_agent_prometheus2()[0]
    three = render.render_children(spec3, targets, assignment)[0]
    two = render.render_children(spec2, targets, assignment)[0]
    assert three.flags == ["--agent"] and two.flags == ["--enable-feature=agent"]
    assert {job.get("fallback_scrape_protocol") for job in three.prometheus["scrape_configs"]} == {
        "PrometheusText0.0.4"
    }
    assert all("fallback_scrape_protocol" not in job for job in two.prometheus["scrape_configs"])


def test_a_config_for_line_3_is_refused_by_promtool_2(tmp_path: Path) -> None:
    """Why the check must use the line's promtool: 2.53 does not know 3.x's scrape fields."""
    spec, targets, assignment = case_agent_region_rw()
    bundle = tree.build_bundle(spec, targets, assignment)
    output.write_tree(tmp_path / "out", bundle)
    with pytest.raises(ConfigCheckError, match="fallback_scrape_protocol"):
        promtool_check(tmp_path / "out", bundle, agent=True, binary=stack_tool(2, "promtool"))


def test_remote_write_2_is_opt_in_and_needs_line_3() -> None:
    spec, targets, assignment = case_agent_region_rw()
    doc = spec.model_dump()
    doc["remote_write"][0]["protocol"] = "2.0"
    opted = FederationSpec.model_validate(doc)
    writes = render.render_children(opted, targets, assignment)[0].prometheus["remote_write"]
    assert [w.get("protobuf_message") for w in writes] == ["io.prometheus.write.v2.Request", None]
    doc["prometheus"] = {"version": "2.53"}
    with pytest.raises(ValueError, match=r"protocol 2\.0 needs Prometheus 3\.x"):
        FederationSpec.model_validate(doc)


def promtool_check(root: Path, bundle: output.Bundle, *, agent: bool, binary: str) -> int:
    configs = tree.prometheus_configs(bundle)
    return check_all(Promtool(binary), root, configs, agent=agent)


def test_rendering_is_deterministic_across_input_order() -> None:
    spec, targets, assignment = case_file_sd_basic()
    again = Assignment.model_validate_json(assignment.model_dump_json())
    assert tree.build_bundle(spec, targets, assignment) == tree.build_bundle(
        spec, list(reversed(targets)), again
    )


def test_replicas_differ_only_in_replica_label() -> None:
    spec, targets, assignment = case_http_sd_rf2()
    children = {c.child: c for c in render.render_children(spec, targets, assignment)}
    r0, r1 = children["cn-shanghai-1-r0"], children["cn-shanghai-1-r1"]
    assert r0.prometheus["global"]["external_labels"]["replica"] == "0"
    assert r1.prometheus["global"]["external_labels"]["replica"] == "1"
    r1_labels = dict(r1.prometheus["global"]["external_labels"], replica="0")
    assert (
        dict(r1.prometheus, **{"global": dict(r1.prometheus["global"], external_labels=r1_labels)})
        == r0.prometheus
    )


def test_file_sd_groups_carry_target_labels() -> None:
    spec, targets, assignment = case_file_sd_basic()
    child = next(c for c in render.render_children(spec, targets, assignment) if c.child == "cn-beijing-0")
    node_groups = child.file_sd["node"]
    assert node_groups[0] == {
        "targets": ["10.10.0.10:9100"],
        "labels": {"__metrics_path__": "/node/metrics", "node": "bj-n00", "region": "cn-beijing"},
    }
    assert child.targets == 4 and child.load == 8 + 1 + 8 + 1


def test_http_sd_groups_is_the_payload_for_one_shard_and_job() -> None:
    spec, targets, assignment = case_http_sd_rf2()
    groups = render.http_sd_groups(spec, targets, assignment, shard="cn-shanghai-0", job="gpu")
    assert [g["targets"] for g in groups] == [["10.11.0.10:9400"], ["10.11.0.12:9400"]]
    assert json.loads(output.dump_json(groups)) == groups
    url = render.http_sd_url(spec, shard="cn-shanghai-0", job="gpu")
    assert url == "http://gpufed-controller:8080/v1/sd/cn-shanghai-0/gpu"


def test_http_sd_groups_for_an_unknown_shard_is_an_error() -> None:
    spec, targets, assignment = case_http_sd_rf2()
    with pytest.raises(AssignmentError, match="unknown shard 'nope'"):
        render.http_sd_groups(spec, targets, assignment, shard="nope", job="gpu")


def test_agent_mode_has_no_rule_evaluation_and_gets_the_flag() -> None:
    spec, targets, assignment = case_agent_region_rw()
    children = {c.child: c for c in render.render_children(spec, targets, assignment)}
    hz = children["cn-hangzhou-0"]
    assert hz.flags == ["--agent"]  # 3.x, the default prometheus.version
    assert set(hz.prometheus) == {"global", "scrape_configs", "remote_write"}
    assert "evaluation_interval" not in hz.prometheus["global"]
    assert [w["name"] for w in hz.prometheus["remote_write"]] == ["global"]
    assert [w["name"] for w in children["cn-beijing-0"].prometheus["remote_write"]] == [
        "global",
        "beijing-only",
    ]


def test_metric_relabel_rules_keep_then_drop_then_labeldrop() -> None:
    spec, _, _ = case_file_sd_basic()
    gpu, node = spec.jobs
    assert render.metric_relabel_configs(gpu) == [
        {"action": "keep", "source_labels": ["__name__"], "regex": "DCGM_FI_.*|up"},
        {"action": "labeldrop", "regex": "pci_bus_id|uuid"},
    ]
    assert render.metric_relabel_configs(node) == [
        {"action": "drop", "source_labels": ["__name__"], "regex": "node_filesystem_device_error"}
    ]


def test_targets_outside_the_assignment_or_spec_are_refused() -> None:
    spec, targets, assignment = case_file_sd_basic()
    stray = Target(address="10.99.0.1", port=9400, job="gpu", node="x", region="cn-beijing")
    with pytest.raises(AssignmentError, match="not in the assignment"):
        render.render_children(spec, [*targets, stray], assignment)
    unknown_job = Target(address="10.10.0.10", port=9999, job="dcgm", node="x", region="cn-beijing")
    with pytest.raises(AssignmentError, match="job 'dcgm', which the spec does not define"):
        render.render_children(spec, [*targets, unknown_job], assignment)


def test_dumped_yaml_is_sorted_and_unwrapped() -> None:
    text = output.dump_yaml({"b": ["x" * 200], "a": 1}).decode()
    assert text == f"a: 1\nb:\n- {'x' * 200}\n"
    assert yaml.safe_load(text) == {"a": 1, "b": ["x" * 200]}


def test_render_bench_runs_small(promtool: str) -> None:
    from federation.testing.benches.render import run_render_bench

    figures = run_render_bench(children=4, workers=2, promtool=promtool)
    assert figures["children"] == figures["checked"] == 4
    assert figures["targets"] == 4 * 12 * 2
