"""The reconcile loop with a fake clock: debounce, grace, flapping, merge, hysteresis."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment
from sharder.engine.planning import Plan
from sharder.engine.sizing import Hysteresis
from sharder.engine.targetsets import placement_delta
from sharder.live.reconcile import Reconciler
from sharder.sources.discovery_metrics import DiscoveryMetrics
from sharder.sources.lastknown import LastKnownFile
from tests.sharder.sources.helpers import FakeClock, fleet, make_spec, target


def make(clock: FakeClock, **kw: object) -> tuple[Reconciler, list[tuple[Assignment, Plan]]]:
    seen: list[tuple[Assignment, Plan]] = []
    rec = Reconciler(spec=kw.pop("spec", make_spec()), clock=clock,  # type: ignore[arg-type]
                     on_assignment=lambda a, p: seen.append((a, p)), **kw)  # type: ignore[arg-type]
    return rec, seen


def test_burst_is_debounced_into_one_assignment_equal_to_a_fresh_sticky_one() -> None:
    clock = FakeClock()
    rec, seen = make(clock)
    targets = fleet(1000)
    for burst in range(10):  # 1,000 registrations arriving in bursts of 100 within 0.9 s
        rec.on_change("consul", targets[: (burst + 1) * 100])
        clock.advance(0.09)
        assert rec.tick() is None  # still within the debounce window
    assert rec.next_due() == pytest.approx(0.1)
    clock.advance(0.1)
    result = rec.tick()
    assert result is not None and len(seen) == 1
    fresh = assign(make_spec(), sorted(targets, key=lambda t: (t.region, t.job, t.identity)))
    assert result == fresh and len(fresh.shards) == 100
    assert rec.tick() is None


def test_a_registry_that_never_settles_still_gets_an_assignment_every_window() -> None:
    clock = FakeClock()
    rec, seen = make(clock, debounce_s=1.0)
    for i in range(1, 13):  # a change every 0.5 s for 6 s
        rec.on_change("consul", fleet(i))
        clock.advance(0.5)
        rec.tick()
    assert len(seen) == 6  # one per 1 s window, never postponed
    assert [len(a.targets) for a, _ in seen] == [2, 4, 6, 8, 10, 12]


def test_vanished_target_kept_for_grace_then_removed() -> None:
    clock = FakeClock()
    rec, seen = make(clock, grace_s=120)
    rec.on_change("consul", fleet(20))
    clock.advance(1)
    first = rec.tick()
    assert first is not None
    gone = fleet(20)[5]
    rec.on_change("consul", [t for t in fleet(20) if t != gone])
    clock.advance(1)
    assert rec.tick() is None  # still in its grace period: nothing changes
    assert gone.identity in rec.assignment.targets  # type: ignore[union-attr]
    clock.advance(118)
    assert rec.next_due() == pytest.approx(1.0)
    clock.advance(1)
    after = rec.tick()
    assert after is not None and gone.identity not in after.targets
    assert seen[-1][1].counts.removed == 1 and seen[-1][1].counts.moved == 0


def test_target_flapping_ten_times_in_a_minute_never_changes_shard() -> None:
    clock = FakeClock()
    rec, seen = make(clock)
    targets = fleet(200)
    rec.on_change("consul", targets)
    clock.advance(1)
    rec.tick()
    flapper = targets[17]
    home = rec.assignment.targets[flapper.identity]  # type: ignore[union-attr]
    others = [t for t in targets if t != flapper]
    for _ in range(10):
        rec.on_change("consul", others)
        clock.advance(3)
        rec.tick()
        assert rec.assignment.targets[flapper.identity] == home  # type: ignore[union-attr]
        rec.on_change("consul", targets)
        clock.advance(3)
        rec.tick()
        assert rec.assignment.targets[flapper.identity] == home  # type: ignore[union-attr]
    assert len(seen) == 1  # the flapping never produced a new assignment


def test_merge_precedence_and_errors_keep_last_set() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(registry=registry, wall_clock=lambda: 42.0)
    rec, _ = make(clock, precedence=("file", "consul"), observer=metrics)
    consul_view = target(1, team="from-consul")
    file_view = target(1, team="from-file")
    rec.on_change("consul", [consul_view, target(2)])
    rec.on_change("file", [file_view])
    rec.on_error("consul", "unreachable")
    rec.on_change("consul", [target(3, region="nowhere")])  # skipped: unknown region
    rec.on_change("consul", [consul_view, target(2)])
    clock.advance(1)
    rec.tick()
    by_id = {t.identity: t for t in rec.targets}
    assert by_id[file_view.identity].team == "from-file" and len(by_id) == 2
    text = generate_latest(registry).decode()
    assert 'gpufed_discovery_errors_total{reason="unreachable",source="consul"} 1.0' in text
    assert 'gpufed_discovery_errors_total{reason="unknown_region",source="consul"} 1.0' in text
    assert 'gpufed_discovery_last_success_timestamp_seconds{source="file"} 42.0' in text
    assert 'gpufed_discovery_targets{source="consul"} 2.0' in text


def test_hysteresis_grows_past_margin_and_shrinks_only_after_a_while() -> None:
    clock = FakeClock()
    spec = make_spec(targets_per_shard=10)
    rec, _ = make(clock, spec=spec, grace_s=0,
                  hysteresis=Hysteresis(grow_margin=0.2, shrink_margin=0.25, shrink_after_s=600))

    def settle(n: int) -> int:
        rec.on_change("consul", [target(i) for i in range(n)])
        clock.advance(1)
        rec.tick()
        return sum(1 for s in rec.assignment.shards.values() if s.region == "r1")  # type: ignore[union-attr]

    assert settle(30) == 3
    assert settle(35) == 3  # above 30 but inside the 20% margin
    assert [settle(n) for n in (31, 36, 29, 35, 30)] == [3] * 5  # hovering at a boundary
    assert settle(37) == 4  # past 3 * 10 * 1.2
    assert settle(28) == 4  # below, but not well below (3 shards would be 28/30)
    assert settle(20) == 4  # well below: the shrink timer starts
    clock.advance(599)
    assert rec.tick() is None
    clock.advance(1)
    shrunk = rec.tick()
    assert shrunk is not None
    assert sum(1 for s in shrunk.shards.values() if s.region == "r1") == 3


def test_restart_starts_from_the_persisted_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    store = LastKnownFile(tmp_path / "state" / "last-known.json")
    rec, _ = make(clock, store=store)
    rec.on_change("consul", fleet(50))
    clock.advance(1)
    before = rec.tick()
    assert before is not None
    # restart while the registry is down: nothing but the persisted file
    restarted, _ = make(clock, previous=before)
    restarted.seed(store.load())
    clock.advance(1)
    again = restarted.tick()
    assert again is not None and again.targets == before.targets


def test_label_only_change_reuses_the_placement_and_still_reports() -> None:
    clock = FakeClock()
    rec, seen = make(clock)
    rec.on_change("consul", fleet(40))
    clock.advance(1)
    first = rec.tick()
    moved_rack = [t.model_copy(update={"rack": "b07"}) if i == 3 else t for i, t in enumerate(fleet(40))]
    rec.on_change("consul", moved_rack)
    clock.advance(1)
    second = rec.tick()
    assert second is first and len(seen) == 2 and not seen[-1][1].changed
    assert rec.target_map[moved_rack[3].identity].rack == "b07"
    heavier = [t.model_copy(update={"gpus": 2}) if i == 3 else t for i, t in enumerate(moved_rack)]
    delta = placement_delta(rec.target_map, {t.identity: t for t in heavier})
    assert delta == ([heavier[3]], [heavier[3].identity])


def test_persistence_is_throttled_but_never_lost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    store = LastKnownFile(tmp_path / "last-known.json")
    rec, _ = make(clock, store=store, persist_interval_s=5)
    rec.on_change("consul", fleet(3))
    clock.advance(1)
    rec.tick()
    assert len(store.load()["consul"]) == 3
    rec.on_change("consul", fleet(4))
    clock.advance(1)
    rec.tick()
    assert len(store.load()["consul"]) == 3  # within the interval: not yet written
    assert rec.next_due() == pytest.approx(4)
    clock.advance(4)
    rec.tick()
    assert len(store.load()["consul"]) == 4


def test_incremental_path_equals_a_full_sticky_assignment_at_every_step() -> None:
    import random

    rng = random.Random(7)
    clock = FakeClock()
    spec = make_spec(fixed=6)
    rec, _ = make(clock, spec=spec, grace_s=0)
    pool = fleet(600)
    live = set(range(300))
    rec.on_change("consul", [pool[i] for i in sorted(live)])
    clock.advance(1)
    previous = rec.tick()
    for _ in range(15):
        for _ in range(rng.randrange(1, 6)):
            live.symmetric_difference_update({rng.randrange(600)})
        rec.on_change("consul", [pool[i] for i in sorted(live)])
        clock.advance(1)
        rec.tick()
        clock.advance(0.001)
        rec.tick()  # grace 0: removals fall due now
        current = rec.assignment
        assert current is not None
        if current is not previous:
            expected = assign(spec, rec.targets, previous=previous)
            assert current == expected
        previous = current
    assert rec.engine is not None and rec.engine.fallbacks == 0


def test_a_custom_assign_fn_sees_every_change_even_label_only() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def controller_assign(spec, targets, *, previous, shard_counts):  # type: ignore[no-untyped-def]
        calls.append(len(targets))
        return assign(spec, targets, previous=previous, shard_counts=shard_counts)

    rec, _ = make(clock, assign_fn=controller_assign)
    rec.on_change("consul", fleet(10))
    clock.advance(1)
    rec.tick()
    rec.on_change("consul", [t.model_copy(update={"team": "x"}) for t in fleet(10)])
    clock.advance(1)
    rec.tick()
    assert calls == [10, 10]


def test_overrides_are_data_the_engine_keeps_across_changes() -> None:
    """Pins, drains and weights no longer force a full placement per change: one full
    placement when they change, then every change is incremental and equal to assign()."""
    clock = FakeClock()
    spec = make_spec(fixed=3)
    rec, _seen = make(clock, spec=spec, debounce_s=0.0)
    targets = fleet(60)
    rec.on_change("file", targets)
    first = rec.tick()
    assert first is not None
    pinned = targets[0].identity
    region = targets[0].region
    shard = next(s for s, i in first.shards.items() if i.region == region and s != first.targets[pinned])
    overrides = {
        "pins": {pinned: shard},
        "drained": [f"{targets[1].region}-2"],
        "weights": {targets[2].identity: 9},
    }
    rec.set_overrides(**overrides)  # type: ignore[arg-type]
    expected = assign(spec, targets, previous=first, pins=overrides["pins"],  # type: ignore[arg-type]
                      drained=overrides["drained"], weight_overrides=overrides["weights"])  # type: ignore[arg-type]
    rec.on_change("file", [*targets, target(500, region="r1")])
    second = rec.tick()
    engine = rec.engine
    assert engine is not None and second is not None
    assert second.targets[pinned] == shard and f"{targets[1].region}-2" in second.drained
    current = [*targets, target(500, region="r1")]
    assert second == assign(spec, current, previous=expected, pins=overrides["pins"],  # type: ignore[arg-type]
                            drained=overrides["drained"], weight_overrides=overrides["weights"])  # type: ignore[arg-type]
    for i in range(501, 506):
        current = [*current[1:], target(i, region="r2")]
        rec.on_delta("registry", upserted=[target(i, region="r2")], removed=[])
        rec.on_change("file", current[:-1 - (i - 501)])
        last = rec.assignment
        result = rec.tick()
        assert result is not None and rec.engine is engine  # the same engine: no full placement
        everything = sorted(rec.target_map.values(), key=lambda t: t.identity)
        assert result == assign(spec, everything, previous=last, pins=overrides["pins"],  # type: ignore[arg-type]
                                drained=overrides["drained"], weight_overrides=overrides["weights"])  # type: ignore[arg-type]
    rec.set_overrides(**overrides)  # type: ignore[arg-type]
    assert rec.engine is engine  # the same overrides again change nothing


def test_an_adopted_assignment_seeds_the_engine_without_placing_again() -> None:
    clock = FakeClock()
    spec = make_spec(fixed=2)
    targets = fleet(40)
    stored = assign(spec, targets)
    rec, _ = make(clock, spec=spec, debounce_s=0.0, previous=stored)
    rec.reset(previous=stored, targets={t.identity: t for t in targets})
    rec.on_change("file", [*targets, target(900, region="r1")])
    result = rec.tick()
    assert result is not None and rec.engine is not None
    assert rec.engine.fallbacks == 0
    assert result == assign(spec, [*targets, target(900, region="r1")], previous=stored)


def test_a_waiting_loop_wakes_on_a_push_not_on_a_timer() -> None:
    import threading

    rec, _ = make(FakeClock())
    seen = rec.generation
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(rec.wait_for_change(seen, 30.0)))
    waiter.start()
    rec.on_delta("registry", upserted=[target(1)], removed=[])
    waiter.join(timeout=5)
    assert woke == [True]
    assert rec.wait_for_change(rec.generation, 0.01) is False


def test_node_counts_follow_each_change_as_a_recount_would() -> None:
    """Sizing by targets_per_shard counts distinct nodes; the loop keeps the counts per change."""
    from sharder.engine.targetsets import count_nodes

    clock = FakeClock()
    rec, seen = make(clock, spec=make_spec(targets_per_shard=4), debounce_s=0.0, grace_s=0.0)
    current = fleet(40)
    for step in range(6):
        current = current[3:] + [target(100 + 10 * step + k, region="r1") for k in range(5)]
        moved = current[0].model_copy(update={"node": f"moved-{step}"})
        current = [moved, *current[1:]]
        rec.on_change("file", current)
        rec.tick()
        recount = count_nodes(rec.target_map.values())
        assert {r: sorted(c.items()) for r, c in (rec._nodes or {}).items() if c} == {
            r: sorted(c.items()) for r, c in recount.items()
        }
        previous = seen[-2][0] if len(seen) > 1 else None
        ordered = sorted(current, key=lambda t: t.identity)
        spec = make_spec(targets_per_shard=4)
        assert seen[-1][0] == assign(spec, ordered, previous=previous, shard_counts=rec._sizer.applied)


def test_an_idle_loop_prepares_the_engine_once_so_the_first_change_is_incremental() -> None:
    clock = FakeClock()
    spec = make_spec(fixed=2)
    targets = fleet(30)
    stored = assign(spec, targets)
    rec, _ = make(clock, spec=spec, debounce_s=0.0, previous=stored)
    rec.reset(previous=stored, targets={t.identity: t for t in targets})
    assert rec.prepare() is True and rec.engine is not None
    engine = rec.engine
    assert rec.prepare() is False  # once per assignment
    rec.on_change("file", [*targets, target(900, region="r1")])
    assert rec.tick() is not None and rec.engine is engine and engine.fallbacks == 0


class DeltaStore:
    def __init__(self) -> None:
        self.changes: list[dict[str, dict[str, object]]] = []
        self.whole = 0

    def save(self, sets: object) -> None:
        self.whole += 1

    def save_changes(self, changes: dict[str, dict[str, object]]) -> bool:
        self.changes.append(
            {n: {i: getattr(t, "identity", None) for i, t in c.items()} for n, c in changes.items()}
        )
        return True


def test_a_delta_store_is_given_only_what_changed_since_the_last_save() -> None:
    clock = FakeClock()
    store = DeltaStore()
    rec, _ = make(clock, debounce_s=0.0, grace_s=0.0, store=store, persist_interval_s=0.0)
    rec.seed({"file": fleet(10)})  # from the store itself: nothing to write back
    rec.tick()
    rec.on_change("file", fleet(11))
    rec.on_delta("registry", upserted=[target(500)], removed=[])
    clock.advance(1)
    rec.tick()
    rec.on_delta("registry", upserted=[], removed=[target(500).identity])
    clock.advance(1)
    rec.tick()
    assert store.whole == 0
    new, reg = fleet(11)[10].identity, target(500).identity
    assert store.changes == [{"file": {new: new}, "registry": {reg: reg}}, {"registry": {reg: None}}]


def test_a_dirty_mark_before_any_target_is_not_due_so_the_loop_sleeps() -> None:
    """A start with no stored state marks the reconciler dirty before a source has
    delivered; ``tick`` has nothing to place then, so ``next_due`` must not say "now"
    (the loop spun on it and took the GIL from the thread parsing the inventory)."""
    clock = FakeClock()
    rec, seen = make(clock)
    rec.reset(previous=None, dirty=True)
    clock.advance(60)
    assert rec.next_due() is None
    assert rec.tick() is None
    rec.on_delta("registry", upserted=[target(1)], removed=[])
    assert rec.next_due() == 0.0  # the old mark: the first set is placed at once
    assert rec.tick() is not None and len(seen) == 1
