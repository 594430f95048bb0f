"""A tick looks only at the identities sources named since the last one; it must agree with
looking at every source again (the full merge), whatever the sources push and whenever."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sharder.live.reconcile import Reconciler
from tests.sharder.sources.helpers import FakeClock, make_spec, target

SOURCES = ("file", "consul", "registry")
"""Two whole-set sources and one delta source, so precedence and grace both matter."""

operation = st.one_of(
    st.tuples(
        st.just("set"), st.sampled_from(SOURCES[:2]), st.sets(st.integers(0, 5), max_size=8),
        st.sampled_from(["r1", "r2"]),
    ),
    st.tuples(st.just("put"), st.integers(0, 5), st.sampled_from(["r1", "r2"]), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("alias"), st.integers(0, 5), st.booleans()),  # a second identity, same endpoint
    st.tuples(st.just("wait"), st.sampled_from([0.5, 1.0, 30.0, 121.0])),
)


def _pair() -> tuple[FakeClock, Reconciler, Reconciler]:
    clock = FakeClock()
    kw = dict(spec=make_spec(), clock=clock, debounce_s=1.0, grace_s=120.0, precedence=SOURCES)
    return clock, Reconciler(**kw), Reconciler(**kw)  # type: ignore[arg-type]


def _push(rec: Reconciler, op: tuple[Any, ...]) -> None:
    if op[0] == "set":
        _, source, ids, region = op
        rec.on_change(source, [target(i, region=region) for i in sorted(ids)])
    elif op[0] == "put":
        _, i, region, gpus = op
        rec.on_delta("registry", upserted=[target(i, region=region, gpus=gpus)], removed=[])
    elif op[0] == "delete":
        rec.on_delta("registry", upserted=[], removed=[target(op[1]).identity, f"alias-{op[1]}"])
    elif op[0] == "alias":  # the registry names an endpoint the other sources may also serve
        _, i, present = op
        alias = target(i, identity=f"alias-{i}")
        if present:
            rec.on_delta("registry", upserted=[alias], removed=[])
        else:
            rec.on_delta("registry", upserted=[], removed=[alias.identity])


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, min_size=1, max_size=25))
@example([("set", "file", {1}, "r1"), ("wait", 1.0), ("set", "file", set(), "r1"), ("wait", 1.0),
          ("wait", 121.0)])  # a grace period ends while no source names the target
@example([("set", "file", {1}, "r1"), ("alias", 1, True), ("wait", 1.0), ("set", "file", set(), "r1"),
          ("wait", 1.0)])  # the endpoint's owner leaves: the alias it kept out comes in
@example([("put", 1, "r1", 1), ("wait", 1.0), ("delete", 1), ("wait", 1.0), ("put", 1, "r2", 2),
          ("wait", 30.0)])  # back within its grace, in another region
def test_a_tick_over_the_named_identities_equals_a_full_merge(ops: list[tuple[Any, ...]]) -> None:
    clock, named, full = _pair()
    for op in ops:
        for rec in (named, full):
            _push(rec, op)
        if op[0] == "wait":
            clock.advance(float(op[1]))  # type: ignore[arg-type]
        full.sources.look_at_everything()  # the reference looks at every source each tick
        a, b = named.tick(), full.tick()
        assert (a is None) == (b is None)
        assert dict(named.target_map) == dict(full.target_map)
        assert named.grace_remaining() == full.grace_remaining()
        left_out = [{(d.identity, d.source) for d in rec.sources.duplicates} for rec in (named, full)]
        assert left_out[0] == left_out[1]  # the same identities reported as left out
        if named.assignment is not None or full.assignment is not None:
            assert named.assignment is not None and full.assignment is not None
            assert named.assignment.targets == full.assignment.targets


def test_the_target_map_is_shared_read_only_and_replaced_not_mutated() -> None:
    clock, rec, _ = _pair()
    rec.on_change("file", [target(1), target(2)])
    clock.advance(1)
    rec.tick()
    before = rec.target_map
    rec.on_delta("registry", upserted=[target(3)], removed=[])
    clock.advance(1)
    rec.tick()
    assert sorted(before) == [target(1).identity, target(2).identity]  # the old view is unchanged
    assert len(rec.target_map) == 3
