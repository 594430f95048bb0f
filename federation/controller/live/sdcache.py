"""HTTP SD answers, built once per assignment version so a request only picks bytes.

``/v1/sd/{child}/{job}`` serves the targets of the child's shard for one job;
``/v1/sd/{child}`` all jobs at once. Replicas of a shard serve the same bytes (they
differ only in external labels). A shard that still hands targets over serves those
too (``handover.outgoing``). A shard whose members did not change keeps its bytes from
the previous build, so a new version after one registration costs one shard's JSON; and
that shard's JSON is joined from its members' groups, each unchanged one cut from the
bytes served before (``ShardAnswers.order``: where each group starts), encoding only the
targets that are new or changed.
"""

from __future__ import annotations

import json
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from federation.controller.base.state import Handover
from federation.controller.live import handover
from federation.controller.live.splice import HTTP_SD, splice
from sharder.engine.assignment import Assignment
from sharder.kernel import secrets
from sharder.model.inventory import Target

EMPTY = b"[]"


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _dump(groups: list[dict[str, object]]) -> bytes:
    return _ENCODER.encode(groups).encode()


def _group(target: Target) -> bytes:
    """One target's group as ``_dump(target_groups([target]))`` writes it, without the brackets."""
    labels = secrets.mask_labels(target.target_labels(), secrets.MASK)  # HTTP SD is served open
    return _ENCODER.encode({"targets": [target.instance], "labels": labels}).encode()


def _joined(by_job: Mapping[str, bytes]) -> bytes:
    """Every job's groups in one array, job by job: the same bytes as dumping the joined
    list, without encoding each group twice."""
    answers = [answer for _job, answer in sorted(by_job.items()) if answer != EMPTY]
    if len(answers) == 1:  # one job (the common shard): the same bytes, not a copy of them
        return answers[0]
    inner = [answer[1:-1] for answer in answers]
    return b"[" + b",".join(inner) + b"]" if inner else EMPTY


def _kept_whole(by_job: Mapping[str, bytes]) -> bytes | None:
    """The whole answer when it is one job's bytes (kept: no copy); None when it joins
    several (joined when asked, the last few kept: ``RecentWholes``; children ask per job,
    and a copy of every shard's answers is 130 MiB at a million targets)."""
    answers = [answer for answer in by_job.values() if answer != EMPTY]
    return answers[0] if len(answers) == 1 else (EMPTY if not answers else None)


class RecentWholes:
    """The whole answers of the last few shards asked for one (``/v1/sd/<child>`` without a
    job): a client polling one shard gets the same bytes without a join per request, and
    the process never holds a second copy of every shard's answers."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._held: OrderedDict[int, tuple[ShardAnswers, bytes]] = OrderedDict()

    def joined(self, answers: ShardAnswers) -> bytes:
        with self._lock:
            found = self._held.get(id(answers))
            if found is not None and found[0] is answers:
                self._held.move_to_end(id(answers))
                return found[1]
        whole = _joined(answers.by_job)
        with self._lock:
            self._held[id(answers)] = (answers, whole)
            while len(self._held) > self.keep:
                self._held.popitem(last=False)
        return whole


_WHOLES = RecentWholes()


@dataclass(frozen=True)
class ShardAnswers:
    members: dict[str, Target]
    """identity -> target of every member: equal dicts mean equal bytes (the identity
    check inside dict comparison makes an unchanged shard cheap to compare)."""
    by_job: dict[str, bytes]
    whole: bytes | None
    """Every job's answer in one (``_joined``); None: joined when asked (:meth:`answer_all`)."""
    order: dict[str, tuple[list[str], array[int]]] = field(default_factory=dict)
    """job -> (its identities in order, where each one's group starts in ``by_job[job]``, and
    the offset of the closing bracket): the next build cuts an unchanged target's bytes from
    there (12 bytes a target, not a copy of its group)."""
    over: tuple[dict[str, Target], frozenset[str]] | None = None
    """(the members dict these answers were built over, every identity that may differ from
    it), when built from the previous answers of the shard: what the file_sd lists splice
    (``filesd.ListCache``) instead of a pass over every member. None: not known."""

    def answer_all(self) -> bytes:
        return self.whole if self.whole is not None else _WHOLES.joined(self)

    def group(self, job: str, identity: str) -> bytes | None:
        """``identity``'s encoded group in this job's answer, None when it has none."""
        found = self.order.get(job)
        if found is None:
            return None
        ids, starts = found
        k = bisect_left(ids, identity)
        if k == len(ids) or ids[k] != identity:
            return None
        return self.by_job[job][starts[k] : starts[k + 1] - 1]


@dataclass(frozen=True)
class SdSnapshot:
    version: int
    shards: dict[str, ShardAnswers] = field(default_factory=dict)
    child_shard: dict[str, str] = field(default_factory=dict)
    """child id (and shard id) -> shard."""
    assignment: Assignment | None = None
    """What it was built from (the base the next build's ``changed`` is relative to)."""
    handovers: tuple[Handover, ...] = ()
    rebuilt: frozenset[str] | None = None
    """The shards whose answers are new against the ``previous`` it was built over (None:
    not known, compare them): what the metrics and file_sd lists rewrite, found without a
    pass over every shard."""
    built_over: int = 0
    """``id`` of that ``previous`` (not a reference: snapshots must not chain)."""

    def answer(self, child: str, job: str | None = None) -> bytes | None:
        """The bytes for a child (or shard) and optional job; None when unknown."""
        shard = self.child_shard.get(child)
        if shard is None:
            return None
        answers = self.shards[shard]
        if job is None:
            return answers.answer_all()
        return answers.by_job.get(job)

    def targets_of(self, child: str) -> int:
        shard = self.child_shard.get(child)
        return len(self.shards[shard].members) if shard is not None else 0


def build(
    *,
    version: int,
    jobs: Iterable[str],
    assignment: Assignment,
    targets: Mapping[str, Target],
    handovers: Iterable[Handover] = (),
    previous: SdSnapshot | None = None,
    changed: tuple[Assignment, Collection[str]] | None = None,
) -> SdSnapshot:
    """The snapshot for ``assignment``. ``changed``: the assignment ``previous`` was built
    from and the identities that may differ since (placement or fields); then only the
    shards they touch are looked at, so one registration costs one shard, not the fleet."""
    jobs = sorted(jobs)
    handing_over = tuple(handovers)
    touched: dict[str, set[str]] = {}
    if changed is not None and previous is not None and previous.assignment is changed[0]:
        rebuilt = _members_after(previous, assignment, targets, handing_over, set(changed[1]), touched)
        if rebuilt is not None:  # the same shard set: the rest is the previous snapshot's
            kept = dict(previous.shards)  # one copy at C speed, not a pass per shard
            renewed = set()
            for shard, key in rebuilt.items():
                was = kept[shard]
                differ = touched.get(shard)
                if not _same_members(was.members, key, differ):
                    made = _answers(key, jobs, was, differ)
                    if differ is not None:
                        made = replace(made, over=(was.members, frozenset(differ)))
                    kept[shard] = made
                    renewed.add(shard)
            return SdSnapshot(version=version, shards=kept, child_shard=previous.child_shard,
                              assignment=assignment, handovers=handing_over,
                              rebuilt=frozenset(renewed), built_over=id(previous))  # fmt: skip
    members: dict[str, dict[str, Target]] = {shard: {} for shard in assignment.shards}
    for identity, shard in assignment.targets.items():
        target = targets.get(identity)
        if target is not None:
            members[shard][identity] = target
    for shard, identities in handover.outgoing(handing_over).items():
        bucket = members.setdefault(shard, {})
        bucket.update((i, targets[i]) for i in sorted(identities) if i in targets)
    shards: dict[str, ShardAnswers] = {}
    child_shard: dict[str, str] = {}
    for shard, key in members.items():
        old = previous.shards.get(shard) if previous is not None else None
        if old is not None and (old.members is key or old.members == key):
            shards[shard] = old
        else:
            shards[shard] = _answers(key, jobs, old, touched.get(shard))
        child_shard[shard] = shard
        info = assignment.shards.get(shard)
        if info is not None:
            for child, _replica in assignment.children(shard):
                child_shard[child] = shard
        else:  # a removed shard still handing over: its children keep their old names
            for k in range(assignment.replication_factor):
                child_shard[f"{shard}-r{k}" if assignment.replication_factor > 1 else shard] = shard
    return SdSnapshot(
        version=version,
        shards=shards,
        child_shard=child_shard,
        assignment=assignment,
        handovers=handing_over,
    )


def _same_members(was: dict[str, Target], now: dict[str, Target], differ: set[str] | None) -> bool:
    """``was == now``; with ``differ`` (every identity in which they may differ: the rest are
    the same objects) only those are compared, not a shard of 80,000 members."""
    if was is now:
        return True
    if differ is None:
        return was == now
    missing = object()
    return len(was) == len(now) and all(was.get(i, missing) == now.get(i, missing) for i in differ)


def _answers(
    members: dict[str, Target], jobs: list[str], old: ShardAnswers | None, touched: set[str] | None = None
) -> ShardAnswers:
    """A shard's answers: ``_dump(target_groups(...))`` per job, byte for byte, joined from
    encoded groups; a member whose target is the one ``old`` served keeps its bytes.
    ``touched``: every identity whose group may differ from ``old``'s (None: compared here)."""
    if old is not None:
        spliced = _spliced(members, jobs, old, touched)
        if spliced is not None:
            return spliced
    was = old.members if old is not None else {}
    by_job: dict[str, list[str]] = {job: [] for job in jobs}
    for identity, target in members.items():
        found = by_job.get(target.job)
        if found is not None:  # an undefined job: left out, named by the config render
            found.append(identity)
    answers: dict[str, bytes] = {}
    order: dict[str, tuple[list[str], array[int]]] = {}
    for job, ids in by_job.items():
        if not ids:
            answers[job] = EMPTY
            continue
        ids.sort()
        parts: list[bytes] = []
        starts, at = array("I"), 1
        for identity in ids:
            target = members[identity]
            group = old.group(job, identity) if old is not None and was.get(identity) is target else None
            parts.append(_group(target) if group is None else group)
            starts.append(at)
            at += len(parts[-1]) + 1
        starts.append(at)
        answers[job] = b"[" + b",".join(parts) + b"]"
        order[job] = (ids, starts)
    return ShardAnswers(members=members, by_job=answers, whole=_kept_whole(answers), order=order)


def _spliced(
    members: dict[str, Target], jobs: list[str], old: ShardAnswers, touched: set[str] | None = None
) -> ShardAnswers | None:
    """:func:`_answers` when few members differ from ``old``'s: each job's bytes are
    ``old``'s runs of unchanged groups (one slice a run) with the new or changed groups
    put in their places, so a shard of 80,000 targets gaining one is a few slices, not
    80,000. None when ``old`` cannot say where its groups are, or too much changed."""
    if touched is None:
        was = old.members
        touched = {i for i, t in members.items() if was.get(i) is not t}
        touched.update(was.keys() - members.keys())
    if len(touched) * 8 > len(members) + 8:
        return None
    answers: dict[str, bytes] = {}
    order: dict[str, tuple[list[str], array[int]]] = {}
    in_order = sorted(touched)
    for job in jobs:
        before = old.by_job.get(job, EMPTY)
        ids, starts = old.order.get(job, ([], array("I", [1])))
        if before != EMPTY and job not in old.order:
            return None

        def group(identity: str, job: str = job) -> bytes | None:
            now = members.get(identity)
            return _group(now) if now is not None and now.job == job else None

        spliced = splice(ids, starts, before, in_order, group, HTTP_SD)
        if spliced is None:
            answers[job] = EMPTY
            continue
        new_ids, new_starts, answers[job] = spliced
        order[job] = (new_ids, new_starts)
    return ShardAnswers(members=members, by_job=answers, whole=_kept_whole(answers), order=order)


def _members_after(
    previous: SdSnapshot,
    assignment: Assignment,
    targets: Mapping[str, Target],
    handovers: tuple[Handover, ...],
    changed: set[str],
    touched: dict[str, set[str]],
) -> dict[str, dict[str, Target]] | None:
    """Members of the shards ``changed`` touches (the others keep ``previous``'s); None when
    the shard set changed (then everything is rebuilt). ``touched`` gets, per rebuilt shard,
    every identity whose group may differ (what ``_spliced`` re-encodes)."""
    base = previous.assignment
    if base is None or base.replication_factor != assignment.replication_factor:
        return None
    if not (base.shards is assignment.shards or base.shards.keys() == assignment.shards.keys()):
        return None  # the incremental engine keeps the shards' dict: no pass over it then
    if len(previous.shards) != len(base.shards):  # built from ``base``: it holds them all, and no other
        return None
    was_out, now_out = handover.outgoing(previous.handovers), handover.outgoing(handovers)
    if any(shard not in assignment.shards for shard in now_out):
        return None  # a removed shard still hands over
    affected = {s for i in changed for s in (base.targets.get(i), assignment.targets.get(i)) if s is not None}
    affected.update(h.from_shard for h in (*previous.handovers, *handovers) if h.identity in changed)
    if previous.handovers != handovers:  # only the shards whose outgoing set changed
        affected.update(s for s in was_out.keys() | now_out.keys() if was_out.get(s) != now_out.get(s))
    members: dict[str, dict[str, Target]] = {}
    for shard in affected:
        answers = previous.shards.get(shard)
        if answers is None:
            return None
        leaving, arriving = was_out.get(shard, set()), now_out.get(shard, set())
        bucket = dict(answers.members)
        for identity in (*changed, *leaving):
            bucket.pop(identity, None)
        for identity in changed:
            if assignment.targets.get(identity) == shard and identity in targets:
                bucket[identity] = targets[identity]
        bucket.update((i, targets[i]) for i in sorted(arriving) if i in targets)
        members[shard] = bucket
        touched[shard] = changed | leaving | arriving
    return members
