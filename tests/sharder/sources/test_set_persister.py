"""``SetPersister``: a delta store gets its rows in chunks, a whole-set store every set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sharder.live.persisting import SetPersister
from sharder.model.inventory import Target
from tests.sharder.sources.helpers import target


class DeltaStore:
    def __init__(self, *, takes_changes: bool = True) -> None:
        self.takes_changes = takes_changes
        self.rows: dict[tuple[str, str], Target] = {}
        self.writes: list[int] = []
        self.wholes = 0

    def save(self, sets: Mapping[str, Sequence[Target]]) -> None:
        self.wholes += 1
        self.rows = {(name, t.identity): t for name, found in sets.items() for t in found}

    def save_changes(self, changes: Mapping[str, Mapping[str, Target | None]]) -> bool:
        if not self.takes_changes:
            return False
        self.writes.append(sum(len(found) for found in changes.values()))
        for name, found in changes.items():
            for identity, t in found.items():
                if t is None:
                    self.rows.pop((name, identity), None)
                else:
                    self.rows[(name, identity)] = t
        return True


def drain(persister: SetPersister, sets: dict[str, dict[str, Target]], *, start: float) -> float:
    """Write whenever due, as the loop would; returns the clock after the last write."""
    now = start
    while persister.next_at() is not None:
        now = max(now, persister.next_at() or now)
        assert persister.wants(now)
        changes = persister.take(now, sets)
        persister.write(changes, lambda: {n: list(m.values()) for n, m in sets.items()})
    return now


def test_a_large_first_save_goes_in_chunks_a_gap_apart_and_ends_equal() -> None:
    store = DeltaStore()
    persister = SetPersister(store, interval_s=5.0, chunk=4, gap_s=0.2)
    sets = {"file": {t.identity: t for t in (target(i) for i in range(10))}, "registry": {}}
    persister.note("file").update(sets["file"])
    persister.due = True
    end = drain(persister, sets, start=100.0)
    assert store.writes == [4, 4, 2]
    assert end == 100.4  # two gaps, not two intervals
    assert {k[1] for k in store.rows} == set(sets["file"])
    # A change after the backlog waits for the interval again.
    gone = next(iter(sets["file"]))
    del sets["file"][gone]
    persister.note("file").add(gone)
    persister.due = True
    assert persister.next_at() == 105.4
    drain(persister, sets, start=105.4)
    assert (("file", gone) not in store.rows) and store.writes[-1] == 1


def test_a_store_that_takes_only_whole_sets_gets_one_whole_write_per_backlog() -> None:
    store = DeltaStore(takes_changes=False)
    persister = SetPersister(store, interval_s=5.0, chunk=4, gap_s=0.2)
    sets = {"file": {t.identity: t for t in (target(i) for i in range(10))}}
    persister.note("file").update(sets["file"])
    persister.due = True
    drain(persister, sets, start=0.0)
    assert store.wholes == 2  # the first chunk learnt the store wants whole sets; then the rest at once
    assert {k[1] for k in store.rows} == set(sets["file"])
