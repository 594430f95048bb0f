"""The StateStore contract, one set of tests over SQLite, Consul KV and the Kubernetes API.

What every store promises (``federation.controller.stores.store``): check-and-set on the
revision, fencing by the leadership token, state and audit entry committed together,
last known sets kept, and a restart (a new store object) loading exactly what was saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores.store import Commit, FencedOut, StoreConflict
from tests.controller.ha_helpers import state
from tests.controller.harness import fleet
from tests.controller.store_backends import BACKENDS, Opener, backend, race_writers


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    with backend(request.param, tmp_path) as opener:
        yield opener


def audit(action: str, **detail: Any) -> AuditEntry:
    return AuditEntry(at=1.0, actor="ops", action=action, detail=detail)


def test_an_empty_store_holds_nothing(open_store: Opener) -> None:
    s = open_store()
    assert s.load() is None
    assert s.audit_log() == []
    assert s.load_sets() == {}


def test_a_restart_loads_what_was_saved(open_store: Opener) -> None:
    saved = open_store().save(state(3000, last_plan="p-1"), expected_revision=None)
    assert saved.revision == 1
    loaded = open_store().load()
    assert loaded == saved
    assert loaded is not None and loaded.assignment == saved.assignment


def test_save_is_check_and_set_on_the_revision(open_store: Opener) -> None:
    s = open_store()
    first = s.save(state(), expected_revision=None)
    second = s.save(first.model_copy(update={"assignment_version": 2}), expected_revision=1)
    assert second.revision == 2
    with pytest.raises(StoreConflict) as lost:
        s.save(first.model_copy(update={"assignment_version": 9}), expected_revision=1)
    assert (lost.value.expected, lost.value.found) == (1, 2)
    with pytest.raises(StoreConflict):
        s.save(state(), expected_revision=None)  # "nothing stored yet" is stale too
    assert open_store().load() == second  # another replica sees the winner, not the losers


def test_concurrent_writers_that_retry_lose_no_update(open_store: Opener) -> None:
    open_store().save(ControllerState(), expected_revision=None)
    per_writer, writers = 5, 3
    race_writers(open_store, writers=writers, per_writer=per_writer)
    final = open_store().load()
    assert final is not None
    assert sorted(final.desired.weights) == sorted(
        f"w{i}-{n}" for i in range(writers) for n in range(per_writer)
    )
    assert final.revision == 1 + writers * per_writer


def test_a_write_with_an_older_fence_is_refused(open_store: Opener) -> None:
    s = open_store()
    saved = s.save(state(), expected_revision=None, fence=10)
    saved = s.save(saved, expected_revision=saved.revision, fence=12)
    with pytest.raises(FencedOut):
        s.save(saved.model_copy(update={"last_plan": "stale"}), expected_revision=saved.revision, fence=10)
    loaded = open_store().load()
    assert loaded is not None and loaded.revision == 2 and loaded.last_plan is None


def test_audit_entries_commit_with_their_state_and_page_newest_first(open_store: Opener) -> None:
    s = open_store()
    saved = s.save(state(), expected_revision=None, audit=audit("first"))
    saved = s.save(saved, expected_revision=1)  # a discovery write: no entry
    saved = s.save(saved, expected_revision=2, audit=audit("third", moved=3))
    with pytest.raises(StoreConflict):
        s.save(saved, expected_revision=1, audit=audit("lost"))
    entries = open_store().audit_log()
    assert [e.action for e in entries] == ["third", "first"]
    assert entries[0].detail == {"moved": 3}
    assert [e.action for e in s.audit_log(before_id=entries[0].id)] == ["first"]
    assert [e.action for e in s.audit_log(limit=1)] == ["third"]


def test_last_known_sets_round_trip(open_store: Opener) -> None:
    s = open_store()
    sets = {"file": fleet(30), "registry": fleet(5, region="r2", start=100)}
    s.save_sets(sets)
    by_identity = {name: sorted(targets, key=lambda t: t.identity) for name, targets in sets.items()}
    loaded = open_store().load_sets()
    assert {name: sorted(t, key=lambda t: t.identity) for name, t in loaded.items()} == by_identity
    s.save_sets({"file": fleet(3)})
    assert open_store().load_sets() == {"file": fleet(3)}


def test_set_changes_write_deltas_a_restart_reads(open_store: Opener) -> None:
    """``save_set_changes`` (what every change and every registry deletion writes): only what
    changed, on top of what is stored, read back by another store object."""
    s = open_store()
    base = fleet(3000)  # more than one bucket
    s.save_sets({"file": base[:10], "registry": base[10:]})
    newcomer = fleet(1, start=9000)[0]
    s.save_set_changes({"registry": {newcomer.identity: newcomer, base[10].identity: None}})
    s.save_set_changes({"consul": {base[0].identity: base[0]}})  # a source the store had not seen
    other = open_store()
    sets = {name: sorted(t.identity for t in targets) for name, targets in other.load_sets().items()}
    assert sets["file"] == sorted(t.identity for t in base[:10])
    assert sets["registry"] == sorted([newcomer.identity, *(t.identity for t in base[11:])])
    assert sets["consul"] == [base[0].identity]
    other.save_set_changes({"registry": {newcomer.identity: None}})  # another writer, then this one
    s.save_set_changes({"file": {base[1].identity: None}})
    sets = {name: {t.identity for t in targets} for name, targets in open_store().load_sets().items()}
    assert newcomer.identity not in sets["registry"] and base[1].identity not in sets["file"]


def test_a_deposed_leader_writes_no_set_change(open_store: Opener) -> None:
    s = open_store()
    saved = s.save(state(), expected_revision=None, fence=10)
    s.save_set_changes({"registry": {t.identity: t for t in fleet(3)}}, fence=12)
    s.save(saved, expected_revision=saved.revision, fence=12)
    late = fleet(1, start=500)[0]
    with pytest.raises(FencedOut):
        s.save_set_changes({"registry": {late.identity: late}}, fence=10)
    assert late.identity not in {t.identity for t in open_store().load_sets().get("registry", [])}


def test_a_new_leaders_state_alone_fences_the_old_ones_set_changes(open_store: Opener) -> None:
    s = open_store()
    saved = s.save(state(), expected_revision=None, fence=10)
    s.save_set_changes({"registry": {t.identity: t for t in fleet(3)}}, fence=10)
    s.save(saved, expected_revision=saved.revision, fence=12)  # the new leader wrote no set yet
    with pytest.raises(FencedOut):
        s.save_set_changes({"registry": {fleet(1, start=500)[0].identity: None}}, fence=10)


def test_a_journal_commit_writes_its_sets_only_and_is_fenced(open_store: Opener) -> None:
    """A registry deletion's journal is a ``Commit`` without a state, through the same fenced
    ``apply``: durable for the next store object, the state untouched, refused to a deposed
    leader with nothing written."""
    s = open_store()
    saved = s.save(state(), expected_revision=None, fence=10)
    kept, gone = fleet(2, start=700)
    arrived = {"registry": {kept.identity: kept, gone.identity: gone}}
    assert s.apply(Commit.journal(arrived), fence=10) is None
    assert s.apply(Commit.journal({"registry": {gone.identity: None}}), fence=10) is None
    other = open_store()
    assert {t.identity for t in other.load_sets()["registry"]} == {kept.identity}
    assert other.load() == saved  # the revision did not move
    s.save(saved, expected_revision=saved.revision, fence=12)  # a new leader
    with pytest.raises(FencedOut):
        s.apply(Commit.journal({"registry": {kept.identity: None}}), fence=10)
    assert {t.identity for t in open_store().load_sets()["registry"]} == {kept.identity}
