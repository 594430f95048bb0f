"""Shared bits for the discovery tests: a small spec, targets, a fake clock, a recording sink."""

from __future__ import annotations

from collections.abc import Iterable

from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

REGIONS = ("r1", "r2")


def make_spec(*, targets_per_shard: int = 10, fixed: int | None = None) -> FederationSpec:
    return FederationSpec.model_validate({
        "cluster": "test",
        "regions": [{"name": r, "shards": fixed} for r in REGIONS],
        "sharding": {"targets_per_shard": targets_per_shard},
        "jobs": [{"name": "gpu"}],
    })


def target(i: int, *, region: str = "r1", gpus: int = 8, **extra: object) -> Target:
    return Target.model_validate({
        "address": f"10.0.{i // 250}.{i % 250 + 1}", "port": 9400, "job": "gpu", "node": f"n{i}",
        "region": region, "gpus": gpus, **extra,
    })


def fleet(n: int, *, start: int = 0) -> list[Target]:
    return [target(i, region=REGIONS[i % 2]) for i in range(start, start + n)]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSink:
    def __init__(self) -> None:
        self.changes: list[tuple[str, list[Target], str | None]] = []
        self.errors: list[tuple[str, str]] = []

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None:
        self.changes.append((source, list(targets), version))

    def on_error(self, source: str, reason: str) -> None:
        self.errors.append((source, reason))
