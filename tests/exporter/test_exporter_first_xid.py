"""The simulated fleet's early XID (``exporter.simulated.first_xid``): seeded, one per fleet,
exposed within 30 s of the fleet's start, so a demo always has an alert to send (issue 36).

Tested on the schedule and the exposition, with an injected clock; the demo is not run.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from exporter.fleet import FleetApp, fleet_nodes
from exporter.models import XidEvent
from exporter.server import Body
from exporter.settings import ExporterSettings
from exporter.simulated import FIRST_XID_AFTER_S, XID_CODES, ScheduledXid, SimulatedBackend, first_xid

T0 = 1_790_000_000.0
#: The demo promises a message within a minute: the XID must be on /metrics within 30 s.
PROMISE_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def names(count: int) -> list[str]:
    return [node.name for node in fleet_nodes(count, regions=3)]


def test_the_schedule_is_a_function_of_the_seed_alone() -> None:
    picks = []
    for seed in range(200):
        found = first_xid(seed, names(60), 8)
        assert found is not None
        assert found == first_xid(seed, list(reversed(names(60))), 8)  # not the listing order
        assert found.node in names(60) and 0 <= found.gpu < 8 and found.code in XID_CODES
        low, high = FIRST_XID_AFTER_S
        assert low <= found.after_s <= high < PROMISE_S
        picks.append(found)
    # Seeded, not constant: the seed moves it across nodes, GPUs, codes and times.
    assert len({p.node for p in picks}) > 30 and len({p.gpu for p in picks}) == 8
    assert len({p.code for p in picks}) == len(set(XID_CODES)) and len({p.after_s for p in picks}) == 200
    assert first_xid(0, [], 8) is None and first_xid(0, names(3), 0) is None


def test_the_backend_raises_it_once_at_its_time_and_only_on_its_node() -> None:
    clock = Clock()
    plan = ScheduledXid(node="n1", gpu=2, code=79, after_s=12.5)
    mine = SimulatedBackend(4, node="n1", xid_probability=0.0, clock=clock, scheduled_xid=plan)
    other = SimulatedBackend(4, node="n2", xid_probability=0.0, clock=clock, scheduled_xid=plan)
    too_few = SimulatedBackend(2, node="n1", xid_probability=0.0, clock=clock, scheduled_xid=plan)
    clock.now = T0 + 12.4
    assert mine.drain_xid_events() == [] and other.drain_xid_events() == []
    clock.now = T0 + 12.5
    assert mine.drain_xid_events() == [XidEvent(2, 79, T0 + 12.5)]
    clock.now = T0 + 3600
    assert mine.drain_xid_events() == [] and other.drain_xid_events() == []
    assert too_few.drain_xid_events() == []  # it has no GPU 2


Samples = dict[str, dict[tuple[str, str], float]]


def xid_samples(app: FleetApp, node: str) -> Samples:
    """name -> (gpu, err_code) -> value, for the XID families on ``node``'s /metrics."""
    status, _, body = app.routes[node]("/metrics")
    assert status == 200 and isinstance(body, Body)
    text = body.raw
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if "err_code" in sample.labels:
                key = (sample.labels["gpu"], sample.labels["err_code"])
                out.setdefault(sample.name, {})[key] = sample.value
    return out


def run_fleet(*, enabled: bool, seed: int) -> dict[str, Samples]:
    """A 9-node fleet collected every 5 s for its first 30 s; node -> its XID samples."""
    clock = Clock()
    settings = ExporterSettings(backend="simulated", gpus=4, listen="127.0.0.1:0", seed=seed,
                                first_xid=enabled)
    app = FleetApp(settings, fleet_nodes(9, regions=3), clock=clock)
    try:
        for step in range(int(PROMISE_S // settings.collect_interval) + 1):
            clock.now = T0 + step * settings.collect_interval
            for collection in app.collections.values():
                assert collection.collect_once()
        return {node: xid_samples(app, node) for node in app.nodes}
    finally:
        app.stop()


def test_the_fleet_exposes_its_one_early_xid_within_30_s_with_its_event_time() -> None:
    for seed in (0, 1, 7):
        plan = first_xid(seed, names(9), 4)
        assert plan is not None
        seen = run_fleet(enabled=True, seed=seed)
        key = (str(plan.gpu), str(plan.code))
        assert seen[plan.node]["DCGM_FI_DEV_XID_ERRORS"][key] == plan.code
        assert seen[plan.node]["gpufed_gpu_xid_errors_total"][key] == 1
        # The event time, not the collection time: the rule pack's `since` reads it.
        assert seen[plan.node]["gpufed_gpu_xid_last_seen_timestamp_seconds"][key] == T0 + plan.after_s
        quiet = run_fleet(enabled=False, seed=seed)
        seen_at = quiet[plan.node].get("gpufed_gpu_xid_last_seen_timestamp_seconds", {}).get(key)
        assert seen_at != T0 + plan.after_s  # switched off, it is not there
