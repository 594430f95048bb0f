"""KubeStore against the ConfigMap stand-in (federation/testing/standins/kube.py) through the official
client: the races, fencing, the 1 MiB object limit, delta writes and broken objects."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from federation.controller.stores import kube_parts
from federation.controller.stores.kube_objects import ConfigMaps, Head
from federation.controller.stores.kube_store import KubeStore
from federation.controller.stores.store import FencedOut, StoreConflict, StoreError
from federation.testing.standins.kube import FakeKubeAPI, configmap_bytes
from sharder.engine.assigning import assign
from sharder.model.spec import FederationSpec
from tests.controller.ha_helpers import state
from tests.controller.harness import fleet
from tests.controller.store_backends import kube_api, kube_store

SPEC = FederationSpec.model_validate(
    {"cluster": "t", "regions": [{"name": "r1", "shards": 8}], "jobs": [{"name": "gpu"}]}
)


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as running:
        yield running


def configmaps(fake: FakeKubeAPI) -> dict[str, dict[str, Any]]:
    return {name: obj for (plural, _, name), obj in fake.objects.items() if plural == "configmaps"}


def writes(fake: FakeKubeAPI) -> list[str]:
    return [r for r in fake.requests if r.startswith(("POST", "PUT"))]


class Paused(ConfigMaps):
    """Stops a save after it read the head and wrote its parts, before it commits."""

    def __init__(self, *args: Any, gate: threading.Event, reached: threading.Event, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gate, self.reached = gate, reached

    def commit(self, name: str, doc: dict[str, Any], *, head: Head | None, role: str) -> None:
        self.reached.set()
        assert self.gate.wait(10)
        super().commit(name, doc, head=head, role=role)


def paused(fake: FakeKubeAPI) -> tuple[KubeStore, threading.Event, threading.Event]:
    gate, reached = threading.Event(), threading.Event()
    s = kube_store(fake)
    s.maps = Paused(kube_api(fake), namespace="monitoring", prefix="gpufed-state", gate=gate, reached=reached)
    return s, gate, reached


def race(fake: FakeKubeAPI, *, slow_fence: int | None, fast_fence: int | None) -> Any:
    base = kube_store(fake).save(state(), expected_revision=None, fence=slow_fence)
    slow, gate, reached = paused(fake)
    outcome: dict[str, Any] = {}

    def late() -> None:
        try:
            outcome["late"] = slow.save(
                base.model_copy(update={"last_plan": "late"}), expected_revision=1, fence=slow_fence
            )
        except StoreError as exc:
            outcome["late"] = exc

    thread = threading.Thread(target=late)
    thread.start()
    assert reached.wait(10)  # it read revision 1, checked the fence and wrote its parts
    kube_store(fake).save(
        base.model_copy(update={"last_plan": "early"}), expected_revision=1, fence=fast_fence
    )
    gate.set()
    thread.join(10)
    return outcome["late"]


def test_a_concurrent_write_on_the_same_revision_conflicts_and_leaves_no_orphans(fake: FakeKubeAPI) -> None:
    lost = race(fake, slow_fence=None, fast_fence=None)
    assert isinstance(lost, StoreConflict) and lost.found == 2
    loaded = kube_store(fake).load()
    assert loaded is not None and loaded.last_plan == "early"
    head = kube_store(fake).maps.head("gpufed-state")
    assert head is not None
    pieces = {n for n, o in configmaps(fake).items() if o["metadata"]["labels"]["gpufed.io/role"] == "piece"}
    assert pieces == head.objects() | set(head.doc["previous"])  # the loser deleted what it wrote


def test_a_deposed_leaders_write_in_flight_is_fenced_out(fake: FakeKubeAPI) -> None:
    lost = race(fake, slow_fence=5, fast_fence=9)
    assert isinstance(lost, FencedOut)
    loaded = kube_store(fake).load()
    assert loaded is not None and loaded.last_plan == "early" and loaded.revision == 2


def test_a_state_over_1_mib_is_cut_into_objects_under_the_limit(fake: FakeKubeAPI) -> None:
    big = state(120_000)
    raw = big.model_copy(update={"revision": 1}).model_dump_json().encode()
    assert len(raw) > 4 * 1024 * 1024
    kube_store(fake, piece_bytes=256 * 1024).save(big, expected_revision=None)
    stored = configmaps(fake)
    assert len(stored) > 3
    assert max(configmap_bytes(o) for o in stored.values()) <= 256 * 1024 + 4096
    assert kube_store(fake).load() == big.model_copy(update={"revision": 1})


def test_a_piece_over_the_api_limit_is_refused_by_the_api_not_truncated(fake: FakeKubeAPI) -> None:
    import os

    noisy = state(2, last_plan=os.urandom(1600 * 1024).hex())  # 1.6 MiB compressed
    with pytest.raises(StoreError, match=r"422 .*Too long"):
        kube_store(fake, piece_bytes=2 * 1024 * 1024).save(noisy, expected_revision=None)
    assert kube_store(fake).load() is None
    assert not configmaps(fake)  # the pieces written before the refused one were deleted
    saved = kube_store(fake).save(noisy, expected_revision=None)  # 900 KiB pieces fit
    assert kube_store(fake).load() == saved


def test_a_delta_write_touches_only_the_parts_that_changed(fake: FakeKubeAPI) -> None:
    s = kube_store(fake)
    targets = fleet(3 * kube_parts.TARGETS_PER_BUCKET)  # three buckets
    first = assign(SPEC, targets)
    saved = s.save(state().model_copy(update={"assignment": first}), expected_revision=None)
    head = s.maps.head("gpufed-state")
    assert head is not None and head.doc["buckets"] == 3
    before = len(writes(fake))
    grown = assign(SPEC, [*targets, *fleet(1, start=900_000)], previous=first)
    s.save(saved.model_copy(update={"assignment": grown}), expected_revision=1)
    # the core part, the new target's bucket (plus any moved target's) and the head
    assert len(writes(fake)) - before <= 4
    again = kube_store(fake).load()
    assert again is not None and again.assignment == grown


def test_old_objects_are_collected_keeping_the_previous_heads(fake: FakeKubeAPI) -> None:
    s = kube_store(fake)
    saved = s.save(state(), expected_revision=None)
    for n in range(2, 7):
        saved = s.save(saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision)
    head = s.maps.head("gpufed-state")
    assert head is not None
    pieces = {n for n, o in configmaps(fake).items() if o["metadata"]["labels"]["gpufed.io/role"] == "piece"}
    assert pieces == head.objects() | set(head.doc["previous"])
    assert kube_store(fake).load() == saved


def test_the_packed_parts_kept_are_those_of_the_current_heads_only(fake: FakeKubeAPI) -> None:
    """What a save wrote stays cached (a later read needs no GET) only while a head names it:
    before, every save's core part and buckets stayed for the process's life (issue #44)."""
    s = kube_store(fake)
    saved = s.save(state(30), expected_revision=None)
    s.save_sets({"file": fleet(5)})
    for n in range(2, 12):
        saved = s.save(saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision)
    state_head, sets_head = s.maps.head("gpufed-state"), s.maps.head(s.sets_name)
    assert state_head is not None and sets_head is not None
    current = {str(e["digest"]) for head in (state_head, sets_head) for e in head.parts.values()}
    assert set(s.maps._pieces) == current
    assert s.load() == saved


def test_a_corrupt_piece_is_a_clear_error_naming_it(fake: FakeKubeAPI) -> None:
    kube_store(fake).save(state(), expected_revision=None)
    head = kube_store(fake).maps.head("gpufed-state")
    assert head is not None
    (name,) = head.parts["core"]["objects"]
    obj = configmaps(fake)[name]
    fake.apply("configmaps", {**obj, "binaryData": {"data": base64.b64encode(b"\x78\x9c garbage").decode()}})
    with pytest.raises(
        StoreError, match=r"kubernetes://monitoring/gpufed-state: part core of gpufed-state.*digest"
    ):
        kube_store(fake).load()


def test_a_missing_piece_is_a_clear_error(fake: FakeKubeAPI) -> None:
    kube_store(fake).save(state(), expected_revision=None)
    head = kube_store(fake).maps.head("gpufed-state")
    assert head is not None
    (name,) = head.parts["core"]["objects"]
    fake.delete("configmaps", name, "monitoring")
    with pytest.raises(StoreError, match=f"configmap {name} is gone"):
        kube_store(fake).load()


def test_a_head_that_is_not_json_is_a_clear_error(fake: FakeKubeAPI) -> None:
    fake.apply(
        "configmaps",
        {"metadata": {"name": "gpufed-state", "namespace": "monitoring"}, "data": {"head": "{not json"}},
    )
    with pytest.raises(StoreError, match="configmap gpufed-state holds no JSON head"):
        kube_store(fake).load()


def test_a_reader_that_meets_collected_pieces_reads_the_head_again(fake: FakeKubeAPI) -> None:
    writer = kube_store(fake)
    saved = writer.save(state(), expected_revision=None)
    reached, gate = threading.Event(), threading.Event()

    class SlowReader(ConfigMaps):
        first = True

        def get(self, name: str) -> Any:
            if self.first and name != "gpufed-state":
                self.first = False
                reached.set()
                assert gate.wait(10)
            return super().get(name)

    reader = kube_store(fake)
    reader.maps = SlowReader(kube_api(fake), namespace="monitoring", prefix="gpufed-state")
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("state", reader.load()))
    thread.start()
    assert reached.wait(10)  # it holds head revision 1
    for n in range(2, 5):  # revision 1's objects are collected meanwhile
        saved = writer.save(
            saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision
        )
    gate.set()
    thread.join(10)
    assert result["state"] == saved


def test_the_audit_log_is_bounded_and_pages_back(fake: FakeKubeAPI) -> None:
    s = kube_store(fake, audit_keep=32)
    saved = s.save(state(), expected_revision=None, audit=kube_audit("n1"))
    for n in range(2, 101):
        saved = s.save(saved, expected_revision=saved.revision, audit=kube_audit(f"n{n}"))
    pages = [n for n in configmaps(fake) if n.startswith("gpufed-state-audit-")]
    assert len(pages) <= 32 // 16 + 4
    assert [e.action for e in s.audit_log(limit=3)] == ["n100", "n99", "n98"]
    assert [e.id for e in s.audit_log(limit=2, before_id=80)] == [79, 78]


def kube_audit(action: str) -> Any:
    from federation.controller.base.state import AuditEntry

    return AuditEntry(at=1.0, actor="ops", action=action)


def test_an_unchanged_set_is_not_rewritten(fake: FakeKubeAPI) -> None:
    s = kube_store(fake)
    sets = {"file": fleet(30)}
    s.save_sets(sets)
    before = len(writes(fake))
    s.save_sets({"file": list(reversed(sets["file"]))})
    assert len(writes(fake)) == before


def test_replicas_share_their_sd_fetch_times(fake: FakeKubeAPI) -> None:
    kube_store(fake).note_fetches("gpufed-controller-0", {"r1-0": 10.0, "r1-1": 5.0})
    kube_store(fake).note_fetches("gpufed-controller-1", {"r1-1": 7.0})
    kube_store(fake).note_fetches("gpufed-controller-1", {"r1-1": 8.0})
    assert kube_store(fake).fetches(forget_after_s=1e12) == {"r1-0": 10.0, "r1-1": 8.0}


def test_a_bad_prefix_or_namespace_is_refused_naming_the_flag(fake: FakeKubeAPI) -> None:
    with pytest.raises(StoreError, match=r"--store-prefix: .*'Gpufed_State'"):
        kube_store(fake, prefix="Gpufed_State")
    with pytest.raises(StoreError, match="--store-namespace"):
        KubeStore(kube_api(fake), namespace="not a namespace")


def test_an_unreachable_api_is_a_store_error_naming_the_store() -> None:
    with FakeKubeAPI() as gone:
        api = kube_api(gone)
    with pytest.raises(StoreError, match="kubernetes://monitoring/gpufed-state: read configmap gpufed-state"):
        KubeStore(api, namespace="monitoring").load()


def test_parts_round_trip_a_state_document() -> None:
    doc = state(50).model_dump(mode="json")
    parts, members = kube_parts.split_state(doc, buckets=4)
    assert sorted(i for bucket in members for i in bucket) == sorted(doc["assignment"]["targets"])
    assert all(bucket == sorted(bucket) for bucket in members)
    assert sorted(parts) == ["core", "targets-0", "targets-1", "targets-2", "targets-3"]
    assert kube_parts.join_state(parts) == doc


def test_the_changed_hint_cuts_only_the_touched_buckets_into_the_same_bytes(fake: FakeKubeAPI) -> None:
    targets = fleet(9 * kube_parts.TARGETS_PER_BUCKET // 4)  # three buckets
    first = assign(SPEC, targets)
    grown = assign(SPEC, [*targets, *fleet(3, start=900_000)], previous=first)
    touched = {i for i in {*first.targets, *grown.targets} if first.targets.get(i) != grown.targets.get(i)}
    heads = []
    for prefix, hint in (("plain", False), ("hinted", True)):
        s = kube_store(fake, prefix=prefix)
        saved = s.save(state().model_copy(update={"assignment": first}), expected_revision=None)
        before = len(writes(fake))
        s.save(saved.model_copy(update={"assignment": grown}), expected_revision=1,
               changed=(first, touched) if hint else None)  # fmt: skip
        # the core, the touched buckets, the head and the revision marker (store_guard)
        assert len(writes(fake)) - before <= 3 + len({kube_parts.bucket_of(i, 3) for i in touched})
        head = s.maps.head(prefix)
        assert head is not None
        heads.append({name: entry["digest"] for name, entry in head.parts.items()})
        loaded = kube_store(fake, prefix=prefix).load()
        assert loaded is not None and loaded.assignment == grown
        written = s._written  # each bucket's identities: sorted, the assignment's own strings
        assert written is not None and written.members == kube_parts.bucket_members(grown.targets, 3)
        own = {id(i) for i in grown.targets} | {id(i) for i in first.targets}
        assert all(id(i) in own for bucket in written.members for i in bucket)
    assert heads[0] == heads[1]
    # a hint whose base is not what the store last wrote is not trusted: the whole state is cut
    s = kube_store(fake, prefix="hinted")
    current = s.load()
    assert current is not None
    s.save(current.model_copy(update={"assignment": first}), expected_revision=2, changed=(grown, set()))
    again = kube_store(fake, prefix="hinted").load()
    assert again is not None and again.assignment == first
