"""``Reconciler.offer``: a source's change checked and applied in one step, or refused whole."""

from __future__ import annotations

from sharder.engine.sizing import Hysteresis
from sharder.live.offers import EndpointOwned, RegionCapped
from sharder.live.reconcile import Reconciler
from tests.sharder.sources.helpers import FakeClock, make_spec, target


def capped(clock: FakeClock) -> Reconciler:
    """Sized regions of 2 nodes per shard, at most 2 shards: 4 nodes fit a region."""
    return Reconciler(spec=make_spec(targets_per_shard=2), clock=clock, debounce_s=1.0,
                      hysteresis=Hysteresis(max_shards=2))  # fmt: skip


def test_an_endpoint_another_source_serves_is_refused_and_nothing_applied() -> None:
    loop = capped(FakeClock())
    loop.on_change("file", [target(1)])
    twin = target(1, identity="twin")  # the same address and port, another identity
    generation = loop.generation
    refusal = loop.offer("registry", upserted=[target(2), twin], removed=[])
    assert isinstance(refusal, EndpointOwned)
    assert (refusal.source, refusal.identity, refusal.target) == ("file", target(1).identity, twin)
    assert loop.generation == generation and "registry" not in loop.source_counts()


def test_offers_between_two_steps_count_against_the_region_cap() -> None:
    clock = FakeClock()
    loop = capped(clock)
    answers = [loop.offer("registry", upserted=[target(i)], removed=[]) for i in range(6)]
    assert answers[:4] == [None] * 4
    assert all(isinstance(a, RegionCapped) and a.region == "r1" for a in answers[4:])
    assert "--max-shards-per-region=3 would fit" in answers[4].reason  # type: ignore[union-attr]
    assert loop.source_counts() == {"registry": 4}
    clock.advance(1.0)
    step = loop.step()
    assert step is not None and len(step.assignment.targets) == 4
    assert isinstance(loop.offer("registry", upserted=[target(5)], removed=[]), RegionCapped)
    assert loop.offer("registry", upserted=[target(0, gpus=4)], removed=[]) is None  # a known node


def test_a_node_offered_and_withdrawn_frees_its_room_at_a_step_that_places_nothing() -> None:
    clock = FakeClock()
    loop = capped(clock)
    for i in range(3):
        assert loop.offer("registry", upserted=[target(i)], removed=[]) is None
    clock.advance(1.0)
    assert loop.step() is not None
    assert loop.offer("registry", upserted=[target(3)], removed=[]) is None
    assert loop.offer("registry", upserted=[], removed=[target(3).identity]) is None
    assert isinstance(loop.offer("registry", upserted=[target(4), target(5)], removed=[]), RegionCapped)
    clock.advance(1.0)
    assert loop.step() is None  # nothing to place: n3 came and went
    assert loop.offer("registry", upserted=[target(4)], removed=[]) is None


def test_an_offer_wakes_a_waiting_loop_and_a_refresh_does_not() -> None:
    loop = capped(FakeClock())
    seen = loop.generation
    assert loop.offer("registry", upserted=[target(1)], removed=[]) is None
    assert loop.wait_for_change(seen, timeout=0.0)
    seen = loop.generation
    assert loop.offer("registry", upserted=[target(1)], removed=[]) is None  # the same target
    assert not loop.wait_for_change(seen, timeout=0.0)
