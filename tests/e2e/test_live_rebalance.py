"""Issue 13, end to end on one running demo: first samples, and a REST rebalance with no gap.

One ``DemoStack`` for the module (24 simulated nodes over 3 regions, one child per shard,
5 s scrapes and HTTP SD refresh): real agent-mode children remote-writing into a real
master. Replication factor 1 on purpose: no twin fills in for a child, so a gap at the
master would show.

*First samples.* From the moment the controller is ready (``/readyz`` 200 with every
node in its assignment) to each node's first sample at the master (the sample's own
timestamp, the child's scrape time), the bound asserted is two scrape intervals plus one
SD refresh interval (15 s): a child reads its list when it starts or at its next refresh
(<= 1 refresh; the demo starts the children right after readiness), Prometheus hands
discovered targets to its scrape loops at most every 5 s (its discovery throttle, <= 1
interval here) and the first scrape lands within one interval (its offset).

*Rebalance.* A shard is added to region-0 over REST with make-before-break; then the
controller is restarted with ``--no-handover`` (the anchor behaviour of Prometheus
Operator and the OpenTelemetry allocator; the restart itself must move nothing) and a
shard is added to region-1. For every moved target, ``up`` and one GPU series are read
back raw at the master over the whole window and deduplicated as a dashboard reads them
(``max without (shard, replica)``: the union of the copies' samples,
``federation.demo.gaps``). Asserted: make-before-break leaves no gap longer than one
scrape interval (plus 1 s for scheduling jitter on a loaded 2-core machine; one missed
scrape would show as two intervals), and in both modes each moved target ends up
scraped by exactly its new shard's children (their own ``/api/v1/targets``). How much
the old and the new child overlapped (old shard's last sample minus new shard's first,
per target) is printed for both modes: with make-before-break the protocol guarantees
no gap, not a positive overlap, and an immediate move may overlap by luck (the old
child lets go only at its next SD refresh), so neither is asserted. The
immediate move's gap is printed and recorded, not asserted: it depends on where the
SD refreshes and scrape offsets fall.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import require_tool, wait_for

from federation.demo import gaps, plan, rebalance, report
from federation.demo.plan import Layout
from federation.demo.stack import DemoOptions, DemoStack
from sharder.kernel.models import parse_duration

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
LAYOUT = Layout(nodes=24)
JITTER_S = 1.0


class ReadyWatch:
    """Notes the first moment the controller is ready with every node assigned (its own thread)."""

    def __init__(self, base: str, *, nodes: int) -> None:
        self.base, self.nodes = base, nodes
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ready-watch")

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while self.at is None and not self._stop.wait(0.1):
                try:
                    ready = client.get(f"{self.base}/readyz").status_code == 200
                    targets = client.get(f"{self.base}/v1/status").json()["targets"] if ready else 0
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
                if ready and targets >= self.nodes:
                    self.at = time.time()


@dataclass
class Live:
    stack: DemoStack
    ready_at: float
    interval: float
    sd_refresh: float


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    data: Path = tmp_path_factory.mktemp("live-rebalance") / "demo"
    lines: list[str] = []
    stack = DemoStack(DemoOptions(layout=LAYOUT, data_dir=data), say=lines.append, show_messages=False)
    try:
        with ReadyWatch(stack.controller_url, nodes=LAYOUT.nodes) as watch:
            stack.start()
        assert watch.at is not None, "\n".join(lines)
        assert stack.spec is not None
        yield Live(stack=stack, ready_at=watch.at, interval=rebalance.scrape_interval_s(stack),
                   sd_refresh=parse_duration(stack.spec.children.http_sd_refresh_interval))
    finally:
        summary = stack.finish(duration=None)
    assert summary["leftover_processes"] == 0, summary


def test_every_node_reaches_the_master_within_two_intervals_and_a_refresh_of_readyz(live: Live) -> None:
    stack = live.stack
    expected = {name: LAYOUT.nodes_in(i) for i, name in enumerate(LAYOUT.region_names())}
    # Per region, deduplicated as the demo's summary counts them: every node of the fleet.
    wait_for(lambda: report.master_figures(stack.http, stack.master_url).up_by_region == expected or None,
             timeout=60, interval=0.5, what=f"up at the master by region == {expected}")

    fleet = sorted(e["node"] for e in plan.fleet_entries(LAYOUT, port=stack.ports.fleet))
    start, end = live.ready_at - 2 * live.interval, time.time()
    matrix = gaps.raw_matrix(stack.http, stack.master_url, f'up{{job="{plan.JOB}"}}', start=start, end=end)
    first = {row["metric"]["node"]: min(float(t) for t, _ in row["values"]) for row in matrix}
    assert sorted(first) == fleet
    by_region: dict[str, int] = {}
    for row in matrix:
        by_region[row["metric"]["region"]] = by_region.get(row["metric"]["region"], 0) + 1
    assert by_region == expected

    lags = {node: round(stamp - live.ready_at, 2) for node, stamp in first.items()}
    bound = 2 * live.interval + live.sd_refresh
    print(f"first sample after readyz: max {max(lags.values())} s, bound {bound} s; {json.dumps(lags)}")
    assert max(lags.values()) <= bound, lags


def test_rebalance_make_before_break_has_no_gap_and_immediate_move_is_recorded(
    live: Live, record_property: pytest.RecordProperty
) -> None:
    stack, interval = live.stack, live.interval

    handover = rebalance.add_shard(stack, region="region-0", mode="make-before-break")
    assert handover.added_shards == ["region-0-1"]
    assert handover.moved and all(m["to_shard"] == "region-0-1" for m in handover.moved.values())
    assert handover.scraped_by == handover.expected_children  # only the new shard's child now
    assert all(children == ["region-0-1"] for children in handover.scraped_by.values())
    assert set(handover.gaps) == {m["node"] for m in handover.moved.values()}
    # Make-before-break was what ran: every moved target was in hand-over right after the
    # rebalance (kept on its old shard), and none is with --no-handover below.
    assert handover.in_handover == len(handover.moved)

    restart = rebalance.restart_controller(stack, handover=False)
    assert restart["same_assignment"], restart
    assert restart["moves_after_restart"] == 0, restart

    immediate = rebalance.add_shard(stack, region="region-1", mode="immediate")
    assert immediate.added_shards == ["region-1-1"]
    assert immediate.moved and immediate.in_handover == 0
    assert immediate.scraped_by == immediate.expected_children
    assert all(children == ["region-1-1"] for children in immediate.scraped_by.values())
    assert set(immediate.gaps) == {m["node"] for m in immediate.moved.values()}

    figures = {
        "scrape_interval_s": interval,
        "handover_max_gap_s": handover.max_gap_s,
        "immediate_max_gap_s": immediate.max_gap_s,
        "moved": {"handover": len(handover.moved), "immediate": len(immediate.moved)},
        "handover_overlap_s": handover.overlap_s,
        "immediate_overlap_s": immediate.overlap_s,
        "handover_gaps": {n: max(g["max_gap_s"] for g in per.values()) for n, per in handover.gaps.items()},
        "immediate_gaps": {n: max(g["max_gap_s"] for g in per.values()) for n, per in immediate.gaps.items()},
        "controller_restart": restart,
    }
    print("rebalance gaps:", json.dumps(figures, sort_keys=True))
    record_property("rebalance_gaps", json.dumps(figures, sort_keys=True))
    assert handover.max_gap_s <= interval + JITTER_S, figures
