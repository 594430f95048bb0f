"""Make-before-break: hand-over bookkeeping (pure) and what the SD answers show during one."""

from __future__ import annotations

from pathlib import Path

from federation.controller.base.changing import ChangeRequest
from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import Handover
from federation.controller.live import handover
from sharder.engine.assignment import Assignment, ShardInfo
from tests.controller.harness import build, fleet


def assignment(targets: dict[str, str]) -> Assignment:
    shards = {s: ShardInfo(region="r1", index=int(s[-1])) for s in ("r1-0", "r1-1", "r1-2")}
    return Assignment(algorithm="bounded-ring", algorithm_version=2, shards=shards, targets=targets)


def window(job: str) -> float:
    return 30.0


def never(shard: str) -> float | None:
    return None


def test_a_move_starts_a_handover_and_a_second_move_keeps_the_first_source() -> None:
    a = assignment({"x": "r1-0", "y": "r1-1"})
    b = assignment({"x": "r1-1", "y": "r1-1"})
    started = handover.reconcile(a, b, [], now=100.0, job_of={"x": "gpu"}, max_wait_s=30.0)
    assert started == [
        Handover(
            identity="x", job="gpu", from_shard="r1-0", to_shard="r1-1", started_at=100.0, deadline=130.0
        )
    ]
    c = assignment({"x": "r1-2", "y": "r1-1"})
    moved_again = handover.reconcile(b, c, started, now=110.0, job_of={"x": "gpu"}, max_wait_s=30.0)
    assert [(h.from_shard, h.to_shard, h.started_at) for h in moved_again] == [("r1-0", "r1-2", 110.0)]
    back = handover.reconcile(c, a, moved_again, now=120.0, job_of={}, max_wait_s=30.0)
    assert back == []  # back on the shard that never stopped scraping it
    gone = handover.reconcile(b, assignment({"y": "r1-1"}), started, now=120.0, job_of={}, max_wait_s=30.0)
    assert gone == []


def test_settle_ends_by_proof_or_by_window() -> None:
    h = Handover(identity="x", job="gpu", from_shard="r1-0", to_shard="r1-1", started_at=0.0, deadline=600.0)
    offered = h.model_copy(update={"offered_at": 5.0})

    def at(seconds: float) -> float:
        return seconds

    def fetched_at_5(shard: str) -> float | None:
        return 5.0

    # the new shard's child has not fetched its targets yet: no proof counts, no window runs
    assert handover.settle([h], now=100.0, scraped=lambda _: True, fetched=never, window_s=window) == (
        [h],
        [],
    )
    assert handover.settle([h], now=10.0, scraped=lambda _: False, fetched=fetched_at_5, window_s=window) == (
        [offered],
        [],
    )
    assert handover.settle([h], now=10.0, scraped=lambda _: True, fetched=fetched_at_5, window_s=window) == (
        [],
        [(offered, "scraped")],
    )
    assert handover.settle([offered], now=at(35.0), scraped=None, fetched=never, window_s=window) == (
        [],
        [(offered, "window")],
    )
    assert handover.settle([h], now=600.0, scraped=None, fetched=never, window_s=window) == (
        [],
        [(h, "timeout")],
    )


def test_old_shard_keeps_serving_a_moved_target_until_the_handover_ends(tmp_path: Path) -> None:
    clock = [1000.0]
    h = build(tmp_path, options=ControllerOptions(debounce_s=0.0, grace_s=0.0, handover_window_s=60.0))
    h.controller._wall = h.controller.route._wall = h.controller.children._wall = lambda: clock[0]
    h.feed(fleet(8))
    ctl = h.controller
    planned = ctl.plan(
        __import__("federation.controller.base.changing", fromlist=["x"]).ChangeRequest(add_shard=["r1"])
    )
    result = ctl.apply(planned.version, actor="test")
    assert result.plan is not None and result.plan.moves
    move = result.plan.moves[0]
    instance = next(t.instance for t in fleet(8) if t.identity == move.identity)

    def served(shard: str) -> bool:
        body = ctl.publication.sd.answer(shard, "gpu")
        assert body is not None
        return instance in body.decode()

    assert served(move.to_shard) and served(move.from_shard)  # both scrape during the overlap
    assert len(ctl.state.handovers) == len(result.plan.moves)
    clock[0] += 30
    assert ctl.settle() == 0 and served(move.from_shard)  # its child has not asked yet
    ctl.children.note_fetch(move.to_shard)
    clock[0] += 59
    assert ctl.settle() == 0 and served(move.from_shard)
    clock[0] += 2
    assert ctl.settle() == len(result.plan.moves)
    assert served(move.to_shard) and not served(move.from_shard)
    assert ctl.state.handovers == []


def test_without_handover_a_move_is_immediate(tmp_path: Path) -> None:
    h = build(tmp_path, options=ControllerOptions(debounce_s=0.0, grace_s=0.0, handover=False))
    h.feed(fleet(8))
    result = h.controller.apply(h.controller.plan(ChangeRequest(add_shard=["r1"])).version, actor="t")
    assert result.plan is not None and result.plan.moves and h.controller.state.handovers == []
    move = result.plan.moves[0]
    body = h.controller.publication.sd.answer(move.from_shard, "gpu")
    assert body is not None and move.identity not in body.decode()


def test_prometheus_scrape_times_parse_with_nanoseconds_and_zones() -> None:
    from federation.controller.live.probe import parse_time

    assert parse_time("2026-11-24T04:05:01.123456789Z") == 1795493101.123456
    assert parse_time("2017-01-17T15:07:44.723715405+01:00") == 1484662064.723715
    assert parse_time("0001-01-01T00:00:00Z") == 0.0
    assert parse_time(None) == 0.0


def test_only_children_whose_config_changed_are_reloaded() -> None:
    from federation.controller.live.publish import changed_children

    before = {"children/a/prometheus.yml": b"1", "children/b/prometheus.yml": b"1", "manifest.json": b"x"}
    after = {
        "children/a/prometheus.yml": b"2",
        "children/b/prometheus.yml": b"1",
        "children/c/prometheus.yml": b"1",
        "manifest.json": b"y",
    }
    assert changed_children(before, after) == ["a"]
