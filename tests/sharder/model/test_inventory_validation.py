"""Inventory validation: normalised addresses, duplicates by endpoint, one address per node, weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sharder.kernel.errors import InventoryError
from sharder.model import loading
from sharder.model.inventory import Target
from sharder.model.loading import StaticFileSource, TargetIndex, parse_inventory, parse_target
from sharder.model.spec import JobSpec

JOBS = {
    "gpu": JobSpec(name="gpu"),
    "node": JobSpec(name="node"),
    "dcgm": JobSpec(name="dcgm", scheme="https", metrics_path="/dcgm", weight="gpus"),
    "heavy": JobSpec(name="heavy", weight=5),
}


def target(**fields: Any) -> dict[str, Any]:
    base = {"address": "10.0.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r-a"}
    return {**base, **fields}


def error(data: Any, *, jobs: dict[str, JobSpec] | None = JOBS) -> str:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data, source="inv.yaml", jobs=jobs)
    return str(caught.value)


@pytest.mark.parametrize(
    ("address", "canonical", "instance"),
    [
        ("fd00:0:0:0:0:0:0:1", "fd00::1", "[fd00::1]:9400"),
        ("[FD00::1]", "fd00::1", "[fd00::1]:9400"),
        ("GPU-01.DC.Example", "gpu-01.dc.example", "gpu-01.dc.example:9400"),
        ("10.0.0.16", "10.0.0.16", "10.0.0.16:9400"),
    ],
)
def test_addresses_are_normalised_when_a_target_is_built(address: str, canonical: str, instance: str) -> None:
    built = parse_target(target(address=address))
    assert (built.address, built.instance, built.identity) == (canonical, instance, instance)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.1:9400", "address includes a port"),
        ("[fd00::1]:9400", "address includes a port"),
        ("10.0.0.16 ", "whitespace"),
        ("http://10.0.0.1", "not a URL"),
        ("", "address is empty"),
    ],
)
def test_unscrapable_addresses_name_entry_field_and_value(address: str, reason: str) -> None:
    data = {
        "defaults": {"exporters": {"gpu": 9400}},
        "nodes": [{"name": "n1", "address": address, "region": "r-a"}],
    }
    message = error(data)
    assert message.startswith("inv.yaml: field 'nodes[0].address' ")
    assert reason in message and repr(address) in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"address": "fd00::1"}, {"address": "[fd00:0:0:0:0:0:0:1]", "node": "n1"}),
        ({"address": "gpu-1.example"}, {"address": "GPU-1.example.", "node": "n1"}),
        # the job's default path spelled out is still the same endpoint
        ({"job": "dcgm"}, {"job": "dcgm", "metrics_path": "/dcgm", "identity": "other"}),
        # two jobs, one endpoint: both would scrape http://10.0.0.1:9400/metrics
        ({"job": "gpu"}, {"job": "node", "identity": "again"}),
    ],
)
def test_duplicates_by_endpoint_name_both_entries(first: dict[str, Any], second: dict[str, Any]) -> None:
    message = error({"targets": [target(**first), target(**second)]})
    assert "field 'targets[1].address' duplicate target (also at targets[0])" in message


def test_different_scheme_or_path_is_a_different_endpoint() -> None:
    targets = [
        target(job="gpu"),
        target(job="dcgm", identity="10.0.0.1:9400/dcgm"),  # https and /dcgm
        target(job="gpu", metrics_path="/other", identity="10.0.0.1:9400/other"),
    ]
    assert len(parse_inventory({"targets": targets}, source="inv.yaml", jobs=JOBS)) == 3


def test_node_default_port_counts_for_duplicates() -> None:
    data = {
        "defaults": {"exporters": {"gpu": 9400}},
        "nodes": [{"name": "n1", "address": "10.0.0.1", "region": "r-a"}],
        "targets": [{"address": "10.0.0.1", "job": "gpu", "node": "n1", "region": "r-a"}],
    }
    assert "field 'targets[0].address' duplicate target (also at nodes[0])" in error(data)


def test_one_node_name_with_two_addresses_is_an_error() -> None:
    data = {"targets": [target(), target(address="10.0.0.2", port=9100, job="node")]}
    message = error(data)
    assert "field 'targets[1].address'" in message
    assert "node 'n1' has address 10.0.0.1 at targets[0] and 10.0.0.2 here" in message


def test_targets_take_their_port_from_defaults() -> None:
    data = {
        "defaults": {"exporters": {"gpu": 9400}},
        "targets": [{"address": "10.0.0.9", "job": "gpu", "node": "s1", "region": "r-a"}],
    }
    (only,) = parse_inventory(data, source="inv.yaml", jobs=JOBS)
    assert only.instance == "10.0.0.9:9400"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "inv.yaml: expected a mapping at the top level, got a list"),
        ({"nodes": {"a": 1}}, "inv.yaml: field 'nodes' expected a list, got a mapping"),
        ({"nodes": [None]}, "inv.yaml: field 'nodes[0]' expected a mapping, got nothing (null)"),
        ({"nodes": [[1]]}, "inv.yaml: field 'nodes[0]' expected a mapping, got a list"),
        ({"targets": [7]}, "inv.yaml: field 'targets[0]' expected a mapping, got int (value 7)"),
        ({"defaults": [1]}, "inv.yaml: field 'defaults' expected a mapping, got a list"),
        (
            {1: "x", "nodes": []},
            "inv.yaml: field '1' unknown key (known: defaults, nodes, targets) (value 1)",
        ),
        ({"defaults": {"exporter": {}}}, "field 'defaults.exporter' unknown key"),
        (
            {"defaults": {"exporters": {"gpu": 9400}}, "nodes": [{"name": None, "address": "10.0.0.1"}]},
            "field 'nodes[0].name' Input should be a valid string",
        ),
        (
            {"defaults": {"exporters": {"gpu": "many"}}, "nodes": [{"name": "n", "address": "10.0.0.1"}]},
            "field 'nodes[0].exporters' Input should be a valid integer",
        ),
        (
            {"defaults": {"exporters": {5: 9400}}, "nodes": [{"name": "n", "address": "10.0.0.1"}]},
            "field 'nodes[0].exporters' Input should be a valid string (value 5)",
        ),
        (
            {"targets": [target(labels={1: "x"})]},
            "field 'targets[0].labels[1] (key)' Input should be a valid string",
        ),
        ({"targets": [target(node=" n1")]}, "field 'targets[0].node' must not contain control characters"),
        (
            {"targets": [target(metrics_path="metrics")]},
            "field 'targets[0].metrics_path' metrics_path is a URL",
        ),
        (
            {"targets": [target(weight=0)]},
            "field 'targets[0].weight' Input should be greater than or equal to 1",
        ),
    ],
)
def test_wrong_shapes_are_one_error_with_field_and_value(data: Any, expected: str) -> None:
    assert expected in error(data)


def test_huge_values_are_echoed_capped() -> None:
    message = error({"targets": [target(address="x" * 1_000_000)]})
    assert len(message) < 400 and "..." in message


def test_weights_follow_the_job() -> None:
    data = {
        "defaults": {"exporters": {"gpu": 9400, "node": 9100, "heavy": 9500}},
        "nodes": [{"name": "n1", "address": "10.0.0.1", "region": "r-a", "gpus": 8}],
        "targets": [target(address="10.0.0.2", node="n2", job="gpu", gpus=4, weight=3)],
    }
    weights = {(t.node, t.job): t.weight for t in parse_inventory(data, source="inv.yaml", jobs=JOBS)}
    # the GPU exporter weighs its GPUs, the node exporter 1 (not 8 again), an explicit weight wins
    assert weights == {("n1", "gpu"): 8, ("n1", "node"): 1, ("n1", "heavy"): 5, ("n2", "gpu"): 3}


def test_without_a_spec_a_target_weighs_its_gpus() -> None:
    assert Target.model_validate(target(gpus=4, job="node")).weight == 4
    assert parse_target(target(gpus="4", job="node"), jobs=JOBS).weight == 1  # coerced, then weighed


def test_target_index_is_usable_by_registry_sources() -> None:
    index = TargetIndex(source="consul", jobs=JOBS)
    index.add(parse_target(target(), source="consul"), where="services[0]")
    with pytest.raises(InventoryError, match=r"consul: field 'services\[1\].address' duplicate target"):
        index.add(parse_target(target(address="10.0.0.1"), source="consul"), where="services[1]")


def test_endless_or_oversized_files_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "MAX_DOCUMENT_BYTES", 1000)
    with pytest.raises(InventoryError, match="larger than 0 MiB"):
        StaticFileSource(Path("/dev/zero")).list_targets()
    big = tmp_path / "inventory.yaml"
    big.write_text("nodes: []\n" + "#" * 2000)
    with pytest.raises(InventoryError, match=f"{big}: larger than"):
        StaticFileSource(big).list_targets()


def test_the_file_source_frees_entries_as_it_goes_without_changing_results(tmp_path: Path) -> None:
    text = (
        "defaults: {exporters: {gpu: 9400}}\n"
        "nodes: &same\n"
        "  - {name: n1, address: 10.0.0.1, region: r-a}\n"
        "targets: *same\n"
    )
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    # one list aliased as nodes and targets: the entry's own error, not a confusing null
    with pytest.raises(InventoryError) as caught:
        StaticFileSource(path).list_targets()
    assert "field 'targets[0]" in str(caught.value) and "null" not in str(caught.value)
    data = {
        "defaults": {"exporters": {"gpu": 9400, "node": 9100}},
        "nodes": [{"name": f"n{i}", "address": f"10.0.0.{i}", "region": "r-a"} for i in range(1, 5)],
        "targets": [target(address="10.0.1.1", node="s1")],
    }
    kept = parse_inventory(data, source="inv.yaml", jobs=JOBS)
    consumed = parse_inventory(data, source="inv.yaml", jobs=JOBS, consume=True)
    assert consumed == kept and len(kept) == 9
    assert data["nodes"] == [None] * 4 and data["targets"] == [None]
