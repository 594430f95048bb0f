"""ShardGauges: ``/metrics`` cuts the per-shard lines it kept, and the bytes are what two
client_python ``Gauge(["region", "shard"])`` give, in the same order, after every kind of
update (a shard set again keeps its place, a new one comes last, publish replaces all)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.shard_gauges import BLOCK, LOAD, TARGETS, ShardGauges

Rows = list[tuple[str, str, int, int]]


class Reference:
    """The gauges as they were: client_python formats every sample."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        Gauge("before", "A family registered first.", registry=self.registry).set(1)
        self.targets = Gauge(*TARGETS, ["region", "shard"], registry=self.registry)
        self.load = Gauge(*LOAD, ["region", "shard"], registry=self.registry)
        Gauge("after", "A family registered last.", registry=self.registry).set(3)

    def update(self, rows: Rows) -> None:
        for region, shard, targets, load in rows:
            self.targets.labels(region=region, shard=shard).set(targets)
            self.load.labels(region=region, shard=shard).set(load)

    def publish(self, rows: Rows) -> None:
        self.targets.clear()
        self.load.clear()
        self.update(rows)


def kept() -> tuple[CollectorRegistry, ShardGauges]:
    registry = CollectorRegistry()
    Gauge("before", "A family registered first.", registry=registry).set(1)
    gauges = ShardGauges()
    registry.register(gauges)
    Gauge("after", "A family registered last.", registry=registry).set(3)
    return registry, gauges


def test_the_kept_lines_are_client_pythons_bytes_through_every_kind_of_update() -> None:
    reference = Reference()
    registry, gauges = kept()
    odd = 'r\\"x\ny'  # a backslash, a quote and a newline in a label value
    steps: list[tuple[str, Rows]] = [
        ("publish", []),
        ("publish", [("r1", "r1-0", 12, 96), ("r1", "r1-1", 11, 88), ("r2", "r2-0", 3, 24)]),
        ("update", [("r1", "r1-1", 13, 104)]),  # keeps its place
        ("update", [(odd, "s-9", 1, 8), ("r1", "r1-0", 0, 0)]),  # a new one comes last
        ("publish", [("r2", "r2-0", 4, 32), ("r1", "r1-0", 7, 56)]),  # replaces all, in this order
    ]
    for kind, rows in steps:
        getattr(reference, kind)(rows)
        getattr(gauges, kind)(rows)
        expected = generate_latest(reference.registry)
        assert gauges.exposition(registry) == expected
        assert generate_latest(registry) == expected  # collect() gives the same samples
        for region, shard, size, _ in rows:
            assert registry.get_sample_value(TARGETS[0], {"region": region, "shard": shard}) == size


def test_controller_metrics_serves_the_kept_lines() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry=registry)
    metrics.publish_shards([("r1", "r1-0", 5, 40)])
    metrics.update_shards([("r1", "r1-1", 2, 16)])
    text = metrics.exposition()
    assert text == generate_latest(registry)
    assert b'gpufed_controller_targets{region="r1",shard="r1-1"} 2.0\n' in text
    assert b'gpufed_controller_shard_load{region="r1",shard="r1-0"} 40.0\n' in text


def test_lines_kept_in_blocks_are_client_pythons_bytes_when_a_few_blocks_change() -> None:
    """Past one block of shards: a change rejoins the blocks it touched, new shards fill the
    last block and open another, and the bytes stay client_python's after each scrape."""
    reference = Reference()
    registry, gauges = kept()
    many = 2 * BLOCK + 10
    rows: Rows = [(f"r{i % 3}", f"s-{i}", i % 13, i % 7 * 8) for i in range(many)]
    steps: list[tuple[str, Rows]] = [
        ("publish", rows),
        ("update", [(*rows[3][:2], 99, 792), (*rows[2 * BLOCK + 1][:2], 0, 0)]),  # blocks 0 and 2
        ("update", [("r9", f"new-{k}", k, k) for k in range(BLOCK)]),  # fills block 2, opens block 3
        ("update", [(*rows[BLOCK][:2], 5, 40)]),
        ("publish", rows[: BLOCK + 1]),
    ]
    for kind, step in steps:
        getattr(reference, kind)(step)
        getattr(gauges, kind)(step)
        assert gauges.exposition(registry) == generate_latest(reference.registry)
