"""``StateDocuments`` writes the state row byte for byte as ``without_placements`` dumps it,
with the shards encoded once per shard set (issue #44: the row was a dump of every shard)."""

from __future__ import annotations

from federation.controller.base.state import ControllerState, Desired, Handover
from federation.controller.stores.store import StateDocuments, without_placements
from sharder.engine.assignment import Assignment, ShardInfo


def _assignment(shards: int, *, drained: list[str] | None = None, rf: int = 1) -> Assignment:
    infos = {f"r1-{i}": ShardInfo(region="r1", index=i) for i in range(shards)}
    targets = {f"10.0.0.{i}:9400": f"r1-{i % shards}" for i in range(1, 9)}
    return Assignment(algorithm="bounded-ring", algorithm_version=2, replication_factor=rf, shards=infos,
                      targets=targets, weights=dict.fromkeys(targets, 8), drained=drained or [])  # fmt: skip


def test_the_document_is_the_dump_of_the_state_without_placements() -> None:
    documents = StateDocuments()
    first = _assignment(4)
    handover = Handover(identity="10.0.0.1:9400", job="gpu", from_shard="r1-0", to_shard="r1-1",
                        started_at=1.0, deadline=9.0)  # fmt: skip
    states = [
        ControllerState(),
        ControllerState(revision=3, assignment=first, assignment_version=2),
        # the same shards' dict with other targets: the held part is reused, and still right
        ControllerState(revision=4, assignment=first.model_copy(update={"targets": {}}), handovers=[handover],
                        desired=Desired(pins={"assignment": "r1-0"}, drained=["r1-3"])),
        ControllerState(revision=5, assignment=first.model_copy(update={"drained": ["r1-3"]})),
        ControllerState(revision=6, assignment=first.model_copy(update={"replication_factor": 2})),
        ControllerState(revision=7, assignment=_assignment(6), last_plan="abc"),
    ]
    for state in states:
        assert documents.json(state) == without_placements(state).model_dump_json()
