"""The Kubernetes store's core part, its shards encoded once per shard set: the same bytes
as dumping the state's document, before and after a change that keeps or changes the shards."""

from __future__ import annotations

from federation.controller.base.state import ControllerState, Desired
from federation.controller.stores import kube_parts
from sharder.engine.assigning import assign
from sharder.model.spec import FederationSpec
from tests.controller.harness import fleet

SPEC = FederationSpec.model_validate(
    {"cluster": "c", "regions": [{"name": "r1", "shards": 3}, {"name": "r2", "shards": 2}],
     "sharding": {"replication_factor": 1}, "jobs": [{"name": "gpu"}]}
)  # fmt: skip


def plain(state: ControllerState) -> bytes:
    return kube_parts.core_part(state.model_dump(mode="json"))


def test_the_core_is_the_documents_bytes_with_the_shards_encoded_once() -> None:
    targets = fleet(40, region="r1") + fleet(20, region="r2", start=500)
    assignment = assign(SPEC, targets)
    state = ControllerState(assignment=assignment, desired=Desired(pins={targets[0].identity: "r1-1"}))
    cores = kube_parts.CoreParts()
    assert cores.core(state) == plain(state)
    moved = assignment.model_copy(update={"targets": {**assignment.targets, targets[1].identity: "r1-2"}})
    after = state.model_copy(update={"assignment": moved, "assignment_version": 7})
    assert moved.shards is assignment.shards and cores.core(after) == plain(after)
    fewer = moved.model_copy(update={"shards": {k: v for k, v in moved.shards.items() if k != "r2-1"}})
    resized = after.model_copy(update={"assignment": fewer})
    assert cores.core(resized) == plain(resized) != plain(after)
    assert cores.core(ControllerState()) == plain(ControllerState())
