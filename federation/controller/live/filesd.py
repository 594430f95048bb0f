"""file_sd target lists of the shards a change touched: the bytes ``gpufed render`` writes.

With file_sd a child reads ``children/<child>/targets/<job>.json`` beside its config. A
registration changes one shard's members, so the controller rewrites that shard's lists
only (``Publisher.publish_lists``, each file swapped in atomically); the children's
``prometheus.yml`` depend on the children set and the spec, not on targets, and are
rendered again only when those change (``publication.config_key``).

The members come from the HTTP SD snapshot (``sdcache``), which a change already rebuilt
for exactly these shards; a target a shard still hands over is served by HTTP SD but not
written to the old shard's file, as the full render does not either.
"""

from __future__ import annotations

from collections.abc import Iterable

from federation.controller.live.sdcache import SdSnapshot
from sharder.children.render import target_groups
from sharder.engine.assignment import Assignment
from sharder.kernel import output
from sharder.model.inventory import Target


def changed_shards(before: SdSnapshot, after: SdSnapshot) -> set[str]:
    """Shards whose members differ between two snapshots (an unchanged shard keeps its object)."""
    return {shard for shard, answers in after.shards.items() if before.shards.get(shard) is not answers}


def target_lists(
    *, jobs: Iterable[str], snapshot: SdSnapshot, assignment: Assignment, shards: Iterable[str]
) -> output.Bundle:
    """``children/<child>/targets/<job>.json`` of every child of ``shards`` (every job, an
    empty list too), as ``sharder.children.tree.build_bundle`` renders them."""
    names = sorted(jobs)
    files: output.Bundle = {}
    for shard in sorted(shards):
        answers = snapshot.shards.get(shard)
        if answers is None or shard not in assignment.shards:
            continue  # a removed shard: the next full render drops its children
        by_job: dict[str, list[Target]] = {job: [] for job in names}
        for identity, target in answers.members.items():
            found = by_job.get(target.job)
            if found is not None and assignment.targets.get(identity) == shard:
                found.append(target)
        lists = {job: output.dump_json(target_groups(found)) for job, found in by_job.items()}
        for child, _replica in assignment.children(shard):
            for job, content in lists.items():
                files[f"children/{child}/targets/{job}.json"] = content
    return files
