"""HTTP SD answers, built once per assignment version so a request only picks bytes.

``/v1/sd/{child}/{job}`` serves the targets of the child's shard for one job;
``/v1/sd/{child}`` all jobs at once. Replicas of a shard serve the same bytes (they
differ only in external labels). A shard that still hands targets over serves those
too (``handover.outgoing``). A shard whose members did not change keeps its bytes from
the previous build, so a new version after one registration costs one shard's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from federation.controller import handover as handing
from federation.controller.state import Handover
from sharder.assignment import Assignment
from sharder.inventory import Target
from sharder.render import target_groups

EMPTY = b"[]"


def _dump(groups: list[dict[str, object]]) -> bytes:
    return json.dumps(groups, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class ShardAnswers:
    members: dict[str, Target]
    """identity -> target of every member: equal dicts mean equal bytes (the identity
    check inside dict comparison makes an unchanged shard cheap to compare)."""
    by_job: dict[str, bytes]
    whole: bytes


@dataclass(frozen=True)
class SdSnapshot:
    version: int
    shards: dict[str, ShardAnswers] = field(default_factory=dict)
    child_shard: dict[str, str] = field(default_factory=dict)
    """child id (and shard id) -> shard."""

    def answer(self, child: str, job: str | None = None) -> bytes | None:
        """The bytes for a child (or shard) and optional job; None when unknown."""
        shard = self.child_shard.get(child)
        if shard is None:
            return None
        answers = self.shards[shard]
        if job is None:
            return answers.whole
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
) -> SdSnapshot:
    jobs = sorted(jobs)
    members: dict[str, dict[str, Target]] = {shard: {} for shard in assignment.shards}
    for identity, shard in assignment.targets.items():
        target = targets.get(identity)
        if target is not None:
            members[shard][identity] = target
    for shard, identities in handing.outgoing(handovers).items():
        bucket = members.setdefault(shard, {})
        bucket.update((i, targets[i]) for i in sorted(identities) if i in targets)
    shards: dict[str, ShardAnswers] = {}
    child_shard: dict[str, str] = {}
    for shard, key in members.items():
        old = previous.shards.get(shard) if previous is not None else None
        if old is not None and old.members == key:
            shards[shard] = old
        else:
            by_job: dict[str, list[Target]] = {job: [] for job in jobs}
            for target in key.values():
                by_job.setdefault(target.job, []).append(target)
            groups = {job: target_groups(ts) for job, ts in by_job.items()}
            whole = [g for job in sorted(groups) for g in groups[job]]
            shards[shard] = ShardAnswers(
                members=key,
                by_job={job: _dump(g) if g else EMPTY for job, g in groups.items()},
                whole=_dump(whole) if whole else EMPTY,
            )
        child_shard[shard] = shard
        info = assignment.shards.get(shard)
        if info is not None:
            for child, _replica in assignment.children(shard):
                child_shard[child] = shard
        else:  # a removed shard still handing over: its children keep their old names
            for k in range(assignment.replication_factor):
                child_shard[f"{shard}-r{k}" if assignment.replication_factor > 1 else shard] = shard
    return SdSnapshot(version=version, shards=shards, child_shard=child_shard)
