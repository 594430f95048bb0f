"""``planning.summarize`` (what the controller's loop keeps) agrees with ``planning.diff``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine import planning
from sharder.engine.assigning import assign
from sharder.engine.incremental import IncrementalAssigner
from tests.sharder.sources.helpers import fleet, make_spec


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(0, 60),
    removed=st.sets(st.integers(0, 59), max_size=20),
    added=st.integers(0, 30),
    fixed=st.sampled_from([None, 3, 7]),
)
def test_summary_counts_and_shards_equal_the_full_plan(
    start: int, removed: set[int], added: int, fixed: int | None
) -> None:
    spec = make_spec(targets_per_shard=5, fixed=fixed)
    before = fleet(start)
    old = assign(spec, before) if before else None
    after = [t for i, t in enumerate(before) if i not in removed] + fleet(added, start=1000)
    if not after:
        return
    new = assign(spec, after, previous=old) if old is not None else assign(spec, after)
    for previous in (None, old):
        full, summary = planning.diff(previous, new), planning.summarize(previous, new)
        assert summary.counts == full.counts
        assert (summary.added_shards, summary.removed_shards) == (full.added_shards, full.removed_shards)


def test_summary_with_the_engines_touched_set_equals_the_full_plan() -> None:
    spec = make_spec(targets_per_shard=5, fixed=4)  # a fixed shard count: the change stays incremental
    engine = IncrementalAssigner(spec, fleet(40), fallback_fraction=float("inf"))
    old = engine.assignment
    engine.apply(added=fleet(3, start=500), removed=[t.identity for t in fleet(2)])
    new = engine.assignment
    assert engine.touched is not None
    touched = set(engine.touched)
    full = planning.diff(old, new)
    summary = planning.summarize(old, new, only=touched)
    assert summary.counts == full.counts and summary.counts.added == 3 and summary.counts.removed == 2
