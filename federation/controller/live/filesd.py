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

from federation.controller.live.sdcache import SdSnapshot
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
            by_job: dict[str, list[str]] = {job: [] for job in names}
            for identity, target in answers.members.items():
                found = by_job.get(target.job)
                if found is not None and assignment.targets.get(identity) == shard:
                    found.append(identity)
            old = self._written.get(shard, {})
            lists = {job: job_list(answers.members, sorted(ids), old.get(job)) for job, ids in by_job.items()}
            self._written[shard] = lists
            for child, _replica in assignment.children(shard):
                for job, written in lists.items():
                    files[f"children/{child}/targets/{job}.json"] = written.content
        for gone in self._written.keys() - assignment.shards.keys():
            del self._written[gone]
        return files


def target_lists(
    *, jobs: Iterable[str], snapshot: SdSnapshot, assignment: Assignment, shards: Iterable[str]
) -> output.Bundle:
    """The lists of ``shards``, every group encoded afresh (:meth:`ListCache.target_lists`)."""
    return ListCache().target_lists(jobs=jobs, snapshot=snapshot, assignment=assignment, shards=shards)
