"""An SD snapshot built from the change (``changed=``) has the bytes of one built in full."""

from __future__ import annotations

import random

import pytest

from federation.controller.live import filesd, sdcache
from federation.controller.live.handover import Handover, reconcile
from sharder.children.render import target_groups
from sharder.engine.assigning import assign
from sharder.engine.incremental import IncrementalAssigner
from sharder.model.spec import FederationSpec
from tests.controller.harness import fleet

SPEC = FederationSpec.model_validate(
    {
        "cluster": "t",
        "regions": [{"name": "r1", "shards": 5}, {"name": "r2", "shards": 2}],
        "jobs": [{"name": "gpu"}],
    }
)


@pytest.mark.parametrize("seed", range(12))
def test_a_delta_build_equals_a_full_build(seed: int) -> None:
    rnd = random.Random(seed)
    current = {t.identity: t for t in fleet(80, region="r1") + fleet(30, region="r2", start=500)}
    engine = IncrementalAssigner(SPEC, list(current.values()), fallback_fraction=float("inf"))
    assignment = engine.assignment
    handovers: list[Handover] = []
    snapshot = sdcache.build(version=1, jobs=["gpu"], assignment=assignment, targets=current)
    for step in range(8):
        gone = set(rnd.sample(sorted(current), rnd.randint(0, 6)))
        new = fleet(rnd.randint(0, 6), region=rnd.choice(["r1", "r2"]), start=1000 + 10 * step + 100 * seed)
        relabel = [i for i in sorted(current) if i not in gone][: rnd.randint(0, 3)]
        for identity in gone:
            del current[identity]
        for identity in relabel:
            current[identity] = current[identity].model_copy(update={"labels": {"step": str(step)}})
        fresh = [t for t in new if t.identity not in current]
        current.update((t.identity, t) for t in fresh)
        before = assignment
        assignment = engine.apply(added=fresh, removed=gone)
        assert engine.touched is not None
        handovers = reconcile(
            before, assignment, handovers, now=float(step), job_of={i: "gpu" for i in current}, max_wait_s=60
        )
        if step % 3 == 2:
            handovers = handovers[1:]  # one finished
        changed = (before, engine.touched | set(relabel))
        args = {"version": step + 2, "jobs": ["gpu"], "assignment": assignment, "targets": current,
                "handovers": handovers}
        delta = sdcache.build(**args, previous=snapshot, changed=changed)  # type: ignore[arg-type]
        full = sdcache.build(**args)  # type: ignore[arg-type]
        assert {s: (a.answer_all(), a.by_job) for s, a in delta.shards.items()} == {
            s: (a.answer_all(), a.by_job) for s, a in full.shards.items()
        }
        assert delta.child_shard == full.child_shard
        # the shards it names as rebuilt are exactly those whose answers are new objects
        compared = {s for s, a in delta.shards.items() if snapshot.shards.get(s) is not a}
        assert delta.rebuilt is not None and set(delta.rebuilt) == compared
        assert filesd.changed_shards(snapshot, delta) == compared
        snapshot = delta
    assert assign(SPEC, list(current.values()), previous=before) == assignment


@pytest.mark.parametrize("seed", range(6))
def test_the_whole_answer_is_every_job_answer_joined_as_one_dump_would_write_it(seed: int) -> None:
    """``whole`` is assembled from the per-job bytes; it must equal dumping the joined groups."""
    rnd = random.Random(seed)
    jobs = ["gpu", "node", "dcgm"][: rnd.randint(1, 3)]
    members = [
        t.model_copy(update={"job": rnd.choice(jobs), "labels": {"k": rnd.choice(["a", "é", '"q"'])}})
        for t in fleet(rnd.randint(0, 40), region="r1", start=seed * 100)
    ]
    by_job = {job: [t for t in members if t.job == job] for job in jobs}
    answers = {job: sdcache._dump(target_groups(ts)) if ts else sdcache.EMPTY
               for job, ts in by_job.items()}  # fmt: skip
    joined = [g for job in sorted(by_job) for g in target_groups(by_job[job])]
    assert sdcache._joined(answers) == (sdcache._dump(joined) if joined else sdcache.EMPTY)
    shard = sdcache._answers({t.identity: t for t in members}, jobs, None)
    assert shard.answer_all() == sdcache._joined(answers)
    several = sum(1 for ts in by_job.values() if ts) > 1
    assert (shard.whole is None) == several  # several jobs: joined when asked, never kept twice


def test_a_shard_answer_joined_from_groups_is_one_dump_of_its_groups_and_reuses_unchanged_ones() -> None:
    """A shard's bytes are joined from its members' encoded groups: exactly the dump of its
    target groups; a rebuild re-encodes only what changed, cutting the rest from the old bytes."""
    members = {t.identity: t for t in fleet(50, region="r1")}
    first = sdcache._answers(members, ["dcgm", "gpu"], None)
    assert first.by_job["gpu"] == sdcache._dump(target_groups(members.values()))
    assert first.by_job["dcgm"] == sdcache.EMPTY and first.whole is first.by_job["gpu"]
    changed = next(iter(members))
    after = {**members, changed: members[changed].model_copy(update={"labels": {"rack": "r9"}})}
    second = sdcache._answers(after, ["dcgm", "gpu"], first)
    assert second.by_job["gpu"] == sdcache._dump(target_groups(after.values()))
    for identity, target in after.items():  # every group where ``order`` says, as one dump
        assert second.group("gpu", identity) == sdcache._dump(target_groups([target]))[1:-1]
    assert second.group("gpu", changed) != first.group("gpu", changed)
    assert second.group("dcgm", changed) is None and second.group("gpu", "nobody") is None
    encoded: list[object] = []
    real = sdcache._group
    try:
        sdcache._group = lambda t: encoded.append(t) or real(t)  # type: ignore[assignment]
        sdcache._answers(after, ["dcgm", "gpu"], second)
    finally:
        sdcache._group = real  # type: ignore[assignment]
    assert encoded == []  # nothing changed since ``second``: every group cut from its bytes


@pytest.mark.parametrize("seed", range(8))
def test_a_spliced_answer_is_the_answer_built_afresh(seed: int) -> None:
    """A few members added, dropped, relabelled or moved to another job: the answer spliced
    from the old bytes equals the one encoded afresh, bytes and group offsets alike."""
    rnd = random.Random(seed)
    jobs = ["dcgm", "gpu", "node"]
    pool = [t.model_copy(update={"job": rnd.choice(jobs)}) for t in fleet(200, start=seed * 1000)]
    members = {t.identity: t for t in pool[: rnd.randint(0, 150)]}
    old = sdcache._answers(members, jobs, None)
    for _ in range(6):
        after = dict(members)
        for _ in range(rnd.randint(1, 4)):
            target = rnd.choice(pool)
            kind = rnd.choice(["add", "drop", "relabel", "job"])
            if kind == "drop":
                after.pop(target.identity, None)
            elif kind == "add":
                after[target.identity] = target
            elif kind == "relabel":
                after[target.identity] = target.model_copy(update={"labels": {"k": str(rnd.random())}})
            else:
                after[target.identity] = target.model_copy(update={"job": rnd.choice(jobs)})
        spliced = sdcache._spliced(after, jobs, old)
        fresh = sdcache._answers(after, jobs, None)
        if spliced is None:  # too much changed for a small shard: the full path answers
            assert len(after) < 24  # at most 4 touched: 8 * 4 > len(after) + 8
            spliced = sdcache._answers(after, jobs, old)
        assert (spliced.by_job, spliced.answer_all()) == (fresh.by_job, fresh.answer_all())
        assert {j: (ids, list(at)) for j, (ids, at) in spliced.order.items()} == {
            j: (ids, list(at)) for j, (ids, at) in fresh.order.items()
        }
        members, old = after, spliced


def test_whole_answers_of_several_jobs_are_joined_once_and_only_the_last_few_kept() -> None:
    wholes = sdcache.RecentWholes(keep=2)
    members = [[*fleet(3, start=10 * k), *fleet(2, job="node", start=10 * k)] for k in range(3)]
    shards = [sdcache._answers({t.identity: t for t in ts}, ["gpu", "node"], None) for ts in members]
    assert all(s.whole is None for s in shards)
    first = wholes.joined(shards[0])
    assert first == sdcache._joined(shards[0].by_job) and wholes.joined(shards[0]) is first
    wholes.joined(shards[1])
    wholes.joined(shards[2])  # the oldest goes
    assert wholes.joined(shards[0]) is not first and len(wholes._held) == 2


def test_a_job_the_change_does_not_touch_keeps_its_bytes_and_offsets() -> None:
    """A target added to one job: the other job's answer is the same object (no copy of a
    list the change did not touch), and the spliced job's bytes are the fresh build's."""
    members = {t.identity: t for t in [*fleet(40), *fleet(40, job="node")]}
    old = sdcache._answers(members, ["gpu", "node"], None)
    newcomer = fleet(1, start=900)[0]
    after = {**members, newcomer.identity: newcomer}
    spliced = sdcache._spliced(after, ["gpu", "node"], old, {newcomer.identity})
    assert spliced is not None
    assert spliced.by_job["node"] is old.by_job["node"] and spliced.order["node"] is not None
    assert spliced.order["node"][0] is old.order["node"][0]
    assert spliced.by_job == sdcache._answers(after, ["gpu", "node"], None).by_job
    dropped = {i: t for i, t in members.items() if i != next(iter(sorted(members)))}
    first_gone = sdcache._spliced(dropped, ["gpu", "node"], old, set(members) - set(dropped))
    assert first_gone is not None  # the first group taken out is a change, not "untouched"
    assert first_gone.by_job == sdcache._answers(dropped, ["gpu", "node"], None).by_job


def test_an_identity_registered_again_unchanged_keeps_its_shards_answers() -> None:
    """``changed`` names an identity whose target is equal to the one served (a repeated
    registration): its shard keeps its answers object and is not named as rebuilt, as when
    the whole members dicts were compared."""
    current = {t.identity: t for t in fleet(60, region="r1") + fleet(20, region="r2", start=500)}
    engine = IncrementalAssigner(SPEC, list(current.values()), fallback_fraction=float("inf"))
    assignment = engine.assignment
    snapshot = sdcache.build(version=1, jobs=["gpu"], assignment=assignment, targets=current)
    again = next(iter(current))
    current[again] = current[again].model_copy()  # equal, another object
    relabelled = sorted(current)[-1]
    current[relabelled] = current[relabelled].model_copy(update={"labels": {"k": "v"}})
    delta = sdcache.build(version=2, jobs=["gpu"], assignment=assignment, targets=current, previous=snapshot,
                          changed=(assignment, {again, relabelled}))  # fmt: skip
    same, other = assignment.targets[again], assignment.targets[relabelled]
    assert same != other  # two shards: one unchanged, one relabelled
    assert delta.shards[same] is snapshot.shards[same] and delta.rebuilt == frozenset({other})
