"""The previous run's state, read defensively, and what a new run may do to it.

Pipeline position: before ``sharder.engine.assigning`` (:func:`load_previous` gives the sticky
previous assignment) and after it (:func:`check_removal` refuses a change that would stop
scraping a large part of the fleet at once). Pure apart from reading two files.

``assignment.json`` is our own file, but it sits on disk where people and tools edit it.
So: a file that is not JSON or has wrong types is an ``AssignmentError`` telling the user
to delete it (guessing would silently reshuffle the fleet); entries that contradict each
other (a target on a shard the file does not list, a weight below 1) are dropped with a
warning, and those targets are placed afresh; a tree rendered for another cluster (its
``manifest.json`` says so) is refused, since replacing it would wipe that cluster's configs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sharder.children import tree
from sharder.engine.assignment import Assignment
from sharder.kernel import output
from sharder.kernel.errors import MassRemovalError, OutputError, preview

Warn = Callable[[str], None]


def _ignore(message: str) -> None:
    del message


def load_previous(out_dir: str | Path, *, cluster: str, warn: Warn = _ignore) -> Assignment | None:
    """The previous assignment in ``out_dir`` made consistent, or None on a first run."""
    out = Path(out_dir)
    _check_cluster(out, cluster=cluster)
    previous = tree.read_assignment(out)
    if previous is None:
        return None
    path = out / output.ASSIGNMENT_FILE
    stray = {i: s for i, s in previous.targets.items() if s not in previous.shards}
    if stray:
        first = min(stray)
        warn(
            f"{path}: {len(stray)} targets point at shards the file does not list (first"
            f" {preview(first)} -> {preview(stray[first])}); placing them afresh"
        )
    bad_weights = {i for i, w in previous.weights.items() if w < 1}
    if bad_weights:
        warn(f"{path}: {len(bad_weights)} weights below 1 (first {preview(min(bad_weights))}); ignoring them")
    if not stray and not bad_weights:
        return previous
    targets = {i: s for i, s in previous.targets.items() if i not in stray}
    weights = {i: w for i, w in previous.weights.items() if i in targets and i not in bad_weights}
    return previous.model_copy(update={"targets": targets, "weights": weights})


def _check_cluster(out: Path, *, cluster: str) -> None:
    try:
        manifest = json.loads((out / output.MANIFEST_FILE).read_bytes())
    except (OSError, ValueError):
        return  # no manifest (or not ours to judge): the assignment check still applies
    found = manifest.get("cluster") if isinstance(manifest, dict) else None
    if isinstance(found, str) and found != cluster:
        raise OutputError(
            f"{out}: holds the configs of cluster {preview(found)}, but the spec is for cluster"
            f" {preview(cluster)}; render into another --out (or delete {out} first)"
        )


def check_removal(previous: Assignment | None, current: Assignment, *, max_share: float, allow: bool) -> None:
    """Refuse dropping more than ``max_share`` of the previous targets unless ``allow``.

    Emptying a populated tree is always over the bound (with ``max_share`` below 1):
    an empty or truncated inventory must not silently stop every child scraping.
    """
    if allow or previous is None or not previous.targets:
        return
    removed = sum(1 for identity in previous.targets if identity not in current.targets)
    before = len(previous.targets)
    if removed == 0 or (removed / before <= max_share and (current.targets or max_share >= 1)):
        return
    raise MassRemovalError(
        f"this change removes {removed} of {before} targets ({removed / before:.0%}; at most"
        f" {max_share:.0%} at once, set by sharding.max_removal_share) and would stop scraping them;"
        " check the inventory, or pass --allow-mass-removal if this is intended"
    )
