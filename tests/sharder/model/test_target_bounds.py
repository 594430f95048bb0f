"""Per-target bounds and one endpoint per target (issue 21, items 3 and 4), in the one
validation every path shares (``parse_target``) and the one endpoint key (``sharder.model.endpoints``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharder.kernel.errors import InventoryError
from sharder.live.reconcile import Reconciler
from sharder.model import loading
from sharder.model.addresses import normalise_host, normalise_identity
from sharder.model.endpoints import EndpointIndex, cross_source_duplicates, endpoint_of
from sharder.model.inventory import Target
from sharder.model.loading import parse_inventory, parse_target
from sharder.model.spec import FederationSpec, JobSpec, RegionSpec

JOBS = {"gpu": JobSpec(name="gpu"), "node": JobSpec(name="node")}


def raw(**fields: Any) -> dict[str, Any]:
    base = {"address": "10.0.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r1"}
    return {**base, **fields}


def refused(data: Any) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        parse_target(data, where="targets[0]", source="registry", jobs=JOBS)
    return caught.value


@pytest.mark.parametrize("field", ["gpus", "port", "weight"])
@pytest.mark.parametrize("value", [True, False])
def test_booleans_are_not_integers(field: str, value: bool) -> None:
    error = refused(raw(**{field: value}))
    assert error.field == f"targets[0].{field}" and "boolean" in str(error)


def test_a_node_exporter_port_may_not_be_a_boolean() -> None:
    with pytest.raises(InventoryError, match="boolean") as caught:
        parse_inventory(
            {"nodes": [{"name": "n1", "address": "10.0.0.1", "region": "r1", "exporters": {"gpu": True}}]},
            source="inv.yaml",
        )
    assert caught.value.field == "nodes[0].exporters"


def test_label_count_value_length_and_total_size_are_bounded() -> None:
    many = {f"l{i}": "v" for i in range(loading.MAX_LABELS + 1)}
    error = refused(raw(labels=many))
    assert error.field == "targets[0].labels" and f"at most {loading.MAX_LABELS}" in str(error)

    long_value = "x" * (loading.MAX_LABEL_VALUE + 1)
    error = refused(raw(labels={"owner": long_value}))
    assert error.field == "targets[0].labels.owner" and str(loading.MAX_LABEL_VALUE + 1) in str(error)
    assert long_value not in str(error)  # the size is named, the megabyte is not echoed

    wide = {f"l{i}": "y" * 200 for i in range(60)}  # each within bounds, together too much
    error = refused(raw(labels=wide))
    assert "characters of text in one target" in str(error)

    at_limit = {f"l{i}": "z" * 100 for i in range(loading.MAX_LABELS)}
    assert len(parse_target(raw(labels=at_limit), jobs=JOBS).labels) == loading.MAX_LABELS


@given(st.integers(min_value=0, max_value=loading.MAX_LABEL_VALUE * 2))
def test_label_value_bound_is_exact(length: int) -> None:
    data = raw(labels={"a": "v" * length})
    if length <= loading.MAX_LABEL_VALUE:
        assert parse_target(data, jobs=JOBS).labels["a"] == "v" * length
    else:
        with pytest.raises(InventoryError, match="label values have at most"):
            parse_target(data, jobs=JOBS)


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("::ffff:10.10.0.10", "10.10.0.10"),
        ("[::FFFF:10.10.0.10]", "10.10.0.10"),
        ("::ffff:a0a:a", "10.10.0.10"),
        ("GPU-01.Example.", "gpu-01.example"),
    ],
)
def test_one_host_has_one_spelling(spelling: str, canonical: str) -> None:
    assert normalise_host(spelling) == canonical


@pytest.mark.parametrize(
    ("identity", "canonical"),
    [
        ("GPU-01.Example:9400", "gpu-01.example:9400"),
        ("[::ffff:10.0.0.1]:9400", "10.0.0.1:9400"),
        ("[FD00::1]:9400", "[fd00::1]:9400"),
        ("gpu/Node-1", "gpu/Node-1"),  # a name, not an endpoint: kept as given
        ("host:99999", "host:99999"),
    ],
)
def test_host_port_identities_are_normalised_like_hosts(identity: str, canonical: str) -> None:
    assert normalise_identity(identity) == canonical
    assert parse_target(raw(identity=identity), jobs=JOBS).identity == canonical


def test_the_inventory_refuses_a_mapped_ipv6_twin() -> None:
    with pytest.raises(InventoryError, match="duplicate target"):
        parse_inventory(
            {"targets": [raw(), raw(address="::ffff:10.0.0.1", node="n2")]}, source="inv.yaml", jobs=JOBS
        )


def test_endpoint_index_tracks_owners() -> None:
    index = EndpointIndex(JOBS)
    a = parse_target(raw(), jobs=JOBS)
    b = parse_target(raw(identity="other", node="n1"), jobs=JOBS)
    assert index.add(a) is None
    assert index.add(b) == a.identity
    index.discard(a.identity)
    assert index.add(b) is None and index.owner(endpoint_of(b, JOBS)) == "other"


def test_cross_source_duplicates_keep_the_earlier_source() -> None:
    file_index, registry_index = EndpointIndex(JOBS), EndpointIndex(JOBS)
    kept = parse_target(raw(), jobs=JOBS)
    twin = parse_target(raw(address="::ffff:10.0.0.1", identity="reg-1"), jobs=JOBS)
    file_index.add(kept)
    registry_index.add(twin)
    merged = {kept.identity: kept, twin.identity: twin}
    found = cross_source_duplicates([("file", file_index), ("registry", registry_index)], merged)
    assert [(d.identity, d.source, d.kept, d.kept_source) for d in found] == [
        ("reg-1", "registry", "10.0.0.1:9400", "file")
    ]


def spec() -> FederationSpec:
    return FederationSpec(cluster="c1", regions=[RegionSpec(name="r1", shards=2)], jobs=list(JOBS.values()))


def test_the_merge_serves_one_target_per_endpoint_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    loop = Reconciler(spec=spec(), debounce_s=0.0, grace_s=0.0, precedence=("file", "registry"))
    inventory = [Target.model_validate(raw())]
    loop.on_change("file", inventory)
    twin = parse_target(raw(address="::ffff:10.0.0.1", identity="reg-1", node="n9"), jobs=JOBS)
    other = parse_target(raw(address="10.0.0.2", identity="reg-2", node="n2"), jobs=JOBS)
    with caplog.at_level(logging.WARNING):
        loop.on_delta("registry", upserted=[twin, other], removed=[])
        assignment = loop.tick()
    assert assignment is not None
    assert set(assignment.targets) == {"10.0.0.1:9400", "reg-2"}
    assert "left out target=reg-1 reason=duplicate_endpoint" in caplog.text
    assert "kept=10.0.0.1:9400 kept_source=file" in caplog.text
    assert loop.endpoint_owner(twin, excluding="registry") == ("file", "10.0.0.1:9400")
    assert loop.endpoint_owner(other, excluding="registry") is None
