"""file_sd target lists of the shards a change touched: the bytes ``gpufed render`` writes.

With file_sd a child reads ``children/<child>/targets/<job>.json`` beside its config. A
registration changes one shard's members, so the controller rewrites that shard's lists
only (``Publisher.publish_lists``, each file swapped in atomically); the children's
``prometheus.yml`` depend on the children set and the spec, not on targets, and are
rendered again only when those change (``publication.config_key``).

The members come from the HTTP SD snapshot (``sdcache``), which a change already rebuilt
for exactly these shards; a target a shard still hands over is served by HTTP SD but not
written to the old shard's file, as the full render does not either.

A list is ``sharder.kernel.output.dump_json(target_groups(...))`` byte for byte, built from one
encoded group per target (:func:`file_group`). :class:`ListCache` keeps, per shard and
job, the bytes it wrote last and where each group starts in them: a shard written again
re-encodes only its new or changed targets (a shard of 8,000 targets gains one), the rest
are cut from those bytes (12 bytes a target besides the file itself).
"""

from __future__ import annotations

import json
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

from federation.controller.live.sdcache import SdSnapshot, ShardAnswers
from federation.controller.live.splice import FILE_SD, splice
from sharder.engine.assignment import Assignment
from sharder.kernel import output
from sharder.model.inventory import Target

_string = json.encoder.encode_basestring  # type: ignore[attr-defined]  # ensure_ascii=False, as dump_json
EMPTY = b"[]\n"


def changed_shards(before: SdSnapshot, after: SdSnapshot) -> set[str]:
    """Shards whose members differ between two snapshots (an unchanged shard keeps its object);
    ``after.rebuilt`` when ``after`` was built over ``before`` (``sdcache.build``'s delta)."""
    if after.rebuilt is not None and after.built_over == id(before):
        return set(after.rebuilt)
    return {shard for shard, answers in after.shards.items() if before.shards.get(shard) is not answers}


def file_group(target: Target) -> bytes:
    """``target``'s group as ``dump_json`` writes it inside the list (indented one level),
    without the separator: ``dump_json(target_groups(ts))`` is ``[\\n`` + these joined by
    ``,\\n`` + ``\\n]\\n``."""
    labels = target.target_labels()
    items = sorted(labels.items())
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items):  # not the usual shape
        text = json.dumps({"targets": [target.instance], "labels": labels}, sort_keys=True, indent=2,
                          ensure_ascii=False)  # fmt: skip
        return "\n".join("  " + line for line in text.split("\n")).encode()
    body = ",\n".join(f"      {_string(k)}: {_string(v)}" for k, v in items)
    shown = "{\n" + body + "\n    }" if items else "{}"
    instance = _string(target.instance)
    return f'  {{\n    "labels": {shown},\n    "targets": [\n      {instance}\n    ]\n  }}'.encode()


@dataclass(frozen=True)
class JobList:
    """One job's list of a shard as written: its bytes, its identities in order, and where
    each one's group starts (plus the end, two bytes past the last group)."""

    members: dict[str, Target]
    content: bytes
    ids: list[str]
    starts: array[int]

    def group(self, identity: str, target: Target) -> bytes | None:
        """The bytes of ``identity``'s group when it was written for this very ``target``."""
        if self.members.get(identity) is not target:
            return None
        k = bisect_left(self.ids, identity)
        if k == len(self.ids) or self.ids[k] != identity:
            return None
        return self.content[self.starts[k] : self.starts[k + 1] - 2]


def job_list(members: dict[str, Target], ids: list[str], old: JobList | None) -> JobList:
    """The list of ``ids`` (sorted) of ``members``; a target ``old`` wrote keeps its bytes."""
    if not ids:
        return JobList(members=members, content=EMPTY, ids=[], starts=array("I"))
    parts: list[bytes] = []
    starts, at = array("I"), 2
    for identity in ids:
        target = members[identity]
        group = old.group(identity, target) if old is not None else None
        parts.append(file_group(target) if group is None else group)
        starts.append(at)
        at += len(parts[-1]) + 2
    starts.append(at)
    return JobList(members=members, content=b"[\n" + b",\n".join(parts) + b"\n]\n", ids=ids, starts=starts)


def read_list(members: dict[str, Target], content: bytes, ids: list[str]) -> JobList | None:
    """A list as :func:`job_list` writes it (``ids`` sorted), read back with where each
    group starts: a group is indented two spaces, so ``\\n  },\\n`` ends one and only one
    (a label value cannot hold a raw newline: JSON escapes it). None when the groups do not
    count as ``ids``, or the first or last is not its target's."""
    if not ids:
        return (
            JobList(members=members, content=EMPTY, ids=[], starts=array("I")) if content == EMPTY else None
        )
    if not (content.startswith(b"[\n  {") and content.endswith(b"\n  }\n]\n")):
        return None
    starts, at, last = array("I"), 2, len(ids) - 1
    for k in range(len(ids)):
        starts.append(at)
        found = content.find(b"\n  },\n", at)
        if (found < 0) != (k == last):
            return None
        at = found + 6 if k < last else len(content) - 1
    starts.append(at)
    written = JobList(members=members, content=content, ids=ids, starts=starts)
    for k in (0, last):
        target = members.get(ids[k])
        group = written.content[starts[k] : starts[k + 1] - 2]
        if target is None or _string(target.instance).encode() not in group:
            return None
    return written


def splice_list(
    was: JobList, members: dict[str, Target], keep: dict[str, Target], touched: list[str]
) -> JobList:
    """:func:`job_list` of the members ``was`` listed, with every identity in ``touched``
    (sorted) taken out and those in ``keep`` put in (encoded afresh): ``was``'s runs of
    unchanged groups are cut as they are."""
    def group(identity: str) -> bytes | None:
        now = keep.get(identity)
        return None if now is None else file_group(now)

    spliced = splice(was.ids, was.starts, was.content, touched, group, FILE_SD)
    if spliced is None:
        return JobList(members=members, content=EMPTY, ids=[], starts=array("I"))
    ids, starts, content = spliced
    return JobList(members=members, content=content, ids=ids, starts=starts)


class ListCache:
    """shard -> job -> the list written last (what :meth:`target_lists` reuses)."""

    def __init__(self) -> None:
        self._written: dict[str, dict[str, JobList]] = {}
        self._lock = threading.Lock()  # the worker and the config thread may both write lists

    def target_lists(
        self, *, jobs: Iterable[str], snapshot: SdSnapshot, assignment: Assignment, shards: Iterable[str]
    ) -> output.Bundle:
        """``children/<child>/targets/<job>.json`` of every child of ``shards`` (every job,
        an empty list too), as ``sharder.children.tree.build_bundle`` renders them."""
        with self._lock:
            return self._target_lists(sorted(jobs), snapshot, assignment, shards)

    def _target_lists(
        self, names: list[str], snapshot: SdSnapshot, assignment: Assignment, shards: Iterable[str]
    ) -> output.Bundle:
        files: output.Bundle = {}
        for shard in sorted(shards):
            answers = snapshot.shards.get(shard)
            if answers is None or shard not in assignment.shards:
                self._written.pop(shard, None)
                continue  # a removed shard: the next full render drops its children
            old = self._written.get(shard, {})
            lists = self._spliced(names, shard, answers, assignment, old)
            if lists is None:
                lists = self._whole(names, shard, answers, assignment, old)
            self._written[shard] = lists
            for child, _replica in assignment.children(shard):
                for job, written in lists.items():
                    files[f"children/{child}/targets/{job}.json"] = written.content
        if len(self._written) > len(assignment.shards):
            for gone in self._written.keys() - assignment.shards.keys():
                del self._written[gone]
        return files

    @staticmethod
    def _whole(
        names: list[str], shard: str, answers: ShardAnswers, assignment: Assignment, old: dict[str, JobList]
    ) -> dict[str, JobList]:
        """Every member looked at (a pass over the shard); unchanged targets keep their bytes."""
        by_job: dict[str, list[str]] = {job: [] for job in names}
        for identity, target in answers.members.items():
            found = by_job.get(target.job)
            if found is not None and assignment.targets.get(identity) == shard:
                found.append(identity)
        return {job: job_list(answers.members, sorted(ids), old.get(job)) for job, ids in by_job.items()}

    @staticmethod
    def _spliced(
        names: list[str], shard: str, answers: ShardAnswers, assignment: Assignment, old: dict[str, JobList]
    ) -> dict[str, JobList] | None:
        """The lists when ``answers`` says which members may differ from those ``old`` was
        written for: old runs of groups cut as they are, the changed ones put in their
        places (the cost of the change, not of a shard of 25,000 targets). None otherwise."""
        over = answers.over
        if over is None or set(old) != set(names) or any(w.members is not over[0] for w in old.values()):
            return None
        touched = over[1]
        if len(touched) * 8 > len(answers.members) + 8:
            return None
        members = answers.members
        lists: dict[str, JobList] = {}
        for job in names:
            was = old[job]
            keep = {
                i: t for i in touched
                if (t := members.get(i)) is not None and t.job == job and assignment.targets.get(i) == shard
            }  # fmt: skip
            lists[job] = splice_list(was, members, keep, sorted(touched))
        return lists

    def seed(
        self, *, files: output.Bundle, jobs: Iterable[str], snapshot: SdSnapshot, assignment: Assignment
    ) -> int:
        """Take the lists a full render just wrote (``files``, the bundle of ``assignment``,
        which ``snapshot`` serves) as the lists written last, so the first change to a shard
        after a render cuts that render's bytes instead of encoding the shard again. A list
        whose groups do not count as its members is left out (encoded when next written).
        How many lists were taken."""
        if snapshot.assignment is not assignment:
            return 0
        names = sorted(jobs)
        by_shard: dict[str, dict[str, list[str]]] = {}
        for identity, shard in assignment.targets.items():
            answers = snapshot.shards.get(shard)
            target = answers.members.get(identity) if answers is not None else None
            if target is not None:
                by_shard.setdefault(shard, {}).setdefault(target.job, []).append(identity)
        taken: dict[str, dict[str, JobList]] = {}
        for shard, answers in snapshot.shards.items():
            if shard not in assignment.shards:
                continue
            child = assignment.children(shard)[0][0]
            lists: dict[str, JobList] = {}
            for job in names:
                content = files.get(f"children/{child}/targets/{job}.json")
                ids = sorted(by_shard.get(shard, {}).get(job, ()))
                written = None if content is None else read_list(answers.members, content, ids)
                if written is None:
                    break
                lists[job] = written
            else:
                taken[shard] = lists
        with self._lock:
            self._written = taken
        return sum(len(lists) for lists in taken.values())


def target_lists(
    *, jobs: Iterable[str], snapshot: SdSnapshot, assignment: Assignment, shards: Iterable[str]
) -> output.Bundle:
    """The lists of ``shards``, every group encoded afresh (:meth:`ListCache.target_lists`)."""
    return ListCache().target_lists(jobs=jobs, snapshot=snapshot, assignment=assignment, shards=shards)
