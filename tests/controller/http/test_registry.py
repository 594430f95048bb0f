"""The built-in registry offers each change to the reconcile loop: taken at once, placed together."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from sharder.engine.sizing import Hysteresis
from sharder.live.offers import Refusal
from sharder.live.reconcile import Reconciler
from sharder.model.inventory import Target
from sharder.model.spec import JobSpec
from sharder.sources.registry import BuiltinRegistry
from tests.controller.harness import build
from tests.sharder.sources.helpers import FakeClock, make_spec

JOBS = {"gpu": JobSpec(name="gpu")}


class RecordingLoop(Reconciler):
    """The real loop, recording each offer it took as (upserted, removed) identities."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(spec=make_spec(), clock=clock, debounce_s=1.0, hysteresis=Hysteresis(max_shards=100))
        self.deltas: list[tuple[list[str], list[str]]] = []

    def offer(self, source: str, *, upserted: Sequence[Target], removed: Sequence[str]) -> Refusal | None:
        generation = self.generation
        refusal = super().offer(source, upserted=upserted, removed=removed)
        if refusal is None and self.generation != generation:  # something changed
            self.deltas.append((sorted(t.identity for t in upserted), sorted(removed)))
        return refusal


def entry(i: int) -> dict[str, object]:
    return {
        "address": f"10.0.{i // 250}.{i % 250 + 1}",
        "port": 9400,
        "job": "gpu",
        "node": f"n{i}",
        "region": "r1",
        "gpus": 8,
    }


def test_a_burst_of_registrations_is_in_the_loop_at_once_and_placed_in_one_step() -> None:
    clock = FakeClock()
    loop = RecordingLoop(clock)
    registry = BuiltinRegistry(loop=loop, jobs=JOBS)
    for i in range(500):
        registry.put(f"10.0.{i // 250}.{i % 250 + 1}:9400", entry(i))
        assert loop.source_counts()["registry"] == i + 1  # taken on the caller's thread, no push later
    assert loop.step() is None  # within the debounce window: nothing placed yet
    clock.advance(1.0)
    step = loop.step()
    assert step is not None and len(step.assignment.targets) == 500  # the burst, as one step
    assert loop.step() is None


def test_changes_are_offered_as_deltas_and_an_unchanged_put_only_refreshes() -> None:
    now = [0.0]
    loop = RecordingLoop(FakeClock())
    registry = BuiltinRegistry(loop=loop, jobs=JOBS, ttl_s=10, clock=lambda: now[0])
    registry.put("10.0.0.1:9400", entry(0))
    registry.put("10.0.0.2:9400", entry(1))
    now[0] = 8.0
    registry.put("10.0.0.1:9400", entry(0))  # the same entry: a refresh, nothing changes
    assert loop.deltas == [(["10.0.0.1:9400"], []), (["10.0.0.2:9400"], [])]
    now[0] = 12.0
    assert registry.expire() == 1  # the refreshed one lives on
    assert loop.deltas[-1] == ([], ["10.0.0.2:9400"])
    assert registry.expire() == 0
    registry.put("10.0.0.1:9400", {**entry(0), "gpus": 4})
    assert loop.deltas[-1] == (["10.0.0.1:9400"], [])
    assert registry.delete("10.0.0.1:9400")
    assert loop.deltas[-1] == ([], ["10.0.0.1:9400"])
    assert loop.source_counts()["registry"] == 0 and registry.targets() == []


def test_expiry_reads_only_what_expires_in_the_order_entries_were_last_refreshed() -> None:
    now = [0.0]
    loop = RecordingLoop(FakeClock())
    registry = BuiltinRegistry(loop=loop, jobs=JOBS, ttl_s=10, clock=lambda: now[0])
    for i in range(4):
        now[0] = float(i)
        registry.put(f"10.0.0.{i + 1}:9400", entry(i))
    now[0] = 5.0
    registry.put("10.0.0.1:9400", entry(0))  # refreshed: now the last to expire
    now[0] = 12.5  # 10.0.0.2 (1 s + 10) and 10.0.0.3 (2 s + 10) are past their TTL
    assert registry.expire() == 2
    assert sorted(t.identity for t in registry.targets()) == ["10.0.0.1:9400", "10.0.0.4:9400"]
    now[0] = 15.0
    assert registry.expire() == 2 and registry.targets() == []


def test_a_refused_offer_stores_nothing(tmp_path: Path) -> None:
    """The loop refuses (another source serves the endpoint): the registry keeps nothing of it."""
    harness = build(tmp_path)
    harness.feed([Target.model_validate({**entry(0), "node": "file-node"})], source="file")

    async def call() -> int:
        async with harness.client() as client:
            answer = await client.put("/v1/registry/targets/10.0.0.9:9400", json={**entry(0), "identity":
                                      "10.0.0.9:9400", "address": "10.0.0.1"}, headers=harness.auth())
            return answer.status_code

    assert asyncio.run(call()) == 409
    assert harness.controller.registry.targets() == []
    assert "registry" not in harness.controller.reconciler.source_counts()


def test_an_unchanged_refresh_keeps_the_registry_healthy(tmp_path: Path) -> None:
    """Health is "being fed", not "changed": the route beats the heart on every accepted write,
    so a stable fleet that re-registers without changing anything stays fresh."""
    harness = build(tmp_path)
    discovery = harness.controller.discovery
    path = "/v1/registry/targets/10.0.0.1:9400"

    async def run() -> None:
        async with harness.client() as client:
            assert (await client.put(path, json=entry(0), headers=harness.auth())).status_code == 201
            discovery.last_success.labels(source="registry").set(0.0)  # as if fed long ago
            stale = discovery.staleness("registry")
            assert stale is not None and stale > 300
            generation = harness.controller.reconciler.generation
            again = await client.put(path, json=entry(0), headers=harness.auth())
            assert again.status_code == 200
            assert harness.controller.reconciler.generation == generation  # nothing changed
            fresh = discovery.staleness("registry")
            assert fresh is not None and fresh < stale
            discovery.last_success.labels(source="registry").set(0.0)
            batch = await client.post(
                "/v1/registry/batch", json={"put": [{**entry(0), "identity": "10.0.0.1:9400"}]},
                headers=harness.auth(),
            )
            assert batch.status_code == 200
            after = discovery.staleness("registry")
            assert after is not None and after < stale

    asyncio.run(run())
