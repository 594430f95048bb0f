"""Render and plan as plain functions: what ``gpufed render``/``plan`` and the controller call.

Pipeline: load spec + inventory -> lock the output -> read the previous
``assignment.json`` (sticky; ``sharder.previous``) -> ``sharder.assign`` -> refuse a mass
removal -> bundle (relative path -> bytes, composed from ``BUNDLE_PARTS``) -> write into a
staging dir -> ``promtool check config`` every child there -> swap -> unlock.
A failed check or bad input leaves the existing output tree untouched.

More bundles (Alertmanager, Thanos) join by adding a ``BundlePart`` to the tuple or by
passing ``parts=``; the sharder never imports them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alertmanager.amtool import ConfigTool
from alertmanager.render import ALERTMANAGER_FILE, render_alerting_bundle
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder import assign as assigning
from sharder import output
from sharder import plan as planning
from sharder import previous as previous_state
from sharder.assignment import Assignment
from sharder.errors import OutputError
from sharder.inventory import Target
from sharder.loading import StaticFileSource
from sharder.lock import output_lock
from sharder.promtool import ConfigChecker, check_all

BundlePart = Callable[[GpufedSpec, list[Target], Assignment], output.Bundle]


def sharder_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    return output.build_bundle(spec, targets, assignment)


def alerting_part(spec: GpufedSpec, targets: list[Target], assignment: Assignment) -> output.Bundle:
    """``alertmanager/`` files (config, HA flags, relay robots) when the spec has alerting."""
    del targets, assignment  # routing depends on the spec's regions, not on placement
    if spec.alerting is None:
        return {}
    return render_alerting_bundle(spec.alerting, cluster=spec.cluster, regions=spec.region_names())


BUNDLE_PARTS: tuple[BundlePart, ...] = (sharder_part, alerting_part)


@dataclass(frozen=True)
class RenderResult:
    out: Path
    assignment: Assignment
    previous: Assignment | None
    manifest: dict[str, Any]
    checked: int
    """Child configs promtool accepted; 0 when checking was skipped."""
    alerting_checked: bool = False
    """amtool accepted ``alertmanager/alertmanager.yml``."""


def load_inputs(spec_path: str | Path, inventory_path: str | Path) -> tuple[GpufedSpec, list[Target]]:
    spec = load_gpufed_spec(spec_path)
    jobs = {job.name: job for job in spec.jobs}
    return spec, StaticFileSource(inventory_path, jobs=jobs).list_targets()


def build_bundle(
    spec: GpufedSpec,
    targets: list[Target],
    assignment: Assignment,
    *,
    parts: Sequence[BundlePart] = BUNDLE_PARTS,
) -> output.Bundle:
    """Merge every part's files; two parts writing one path is a bug, not a merge."""
    bundle: output.Bundle = {}
    for part in parts:
        files = part(spec, targets, assignment)
        clash = sorted(bundle.keys() & files.keys())
        if clash:
            raise OutputError(f"two bundle parts write {clash[0]}")
        bundle.update(files)
    return bundle


def render(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    out: str | Path,
    checker: ConfigChecker | None,
    alert_checker: ConfigTool | None = None,
    allow_algorithm_change: bool = False,
    allow_mass_removal: bool = False,
    parts: Sequence[BundlePart] = BUNDLE_PARTS,
    workers: int = 8,
    lock_timeout: float = 0.0,
    warn: previous_state.Warn | None = None,
) -> RenderResult:
    """Assign (sticky to ``out``), render, check every child config, then swap ``out``.

    Holds ``out``'s lock throughout (waiting up to ``lock_timeout`` seconds for another
    run); refuses to drop more than ``spec.sharding.max_removal_share`` of the previous
    targets unless ``allow_mass_removal``. ``warn`` gets one line per repaired oddity.
    """
    with output_lock(out, timeout=lock_timeout):
        return _render_locked(
            spec,
            targets,
            out=Path(out),
            checker=checker,
            alert_checker=alert_checker,
            allow_algorithm_change=allow_algorithm_change,
            allow_mass_removal=allow_mass_removal,
            parts=parts,
            workers=workers,
            warn=warn,
        )


def _render_locked(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    out: Path,
    checker: ConfigChecker | None,
    alert_checker: ConfigTool | None,
    allow_algorithm_change: bool,
    allow_mass_removal: bool,
    parts: Sequence[BundlePart],
    workers: int,
    warn: previous_state.Warn | None,
) -> RenderResult:
    previous = previous_state.load_previous(out, cluster=spec.cluster, warn=warn or _quiet)
    assignment = assigning.assign(
        spec, targets, previous=previous, allow_algorithm_change=allow_algorithm_change
    )
    previous_state.check_removal(
        previous, assignment, max_share=spec.sharding.max_removal_share, allow=allow_mass_removal
    )
    bundle = build_bundle(spec, targets, assignment, parts=parts)
    configs = output.prometheus_configs(bundle)
    checked = 0
    alerting_checked = False

    def validate(root: Path) -> None:
        nonlocal checked, alerting_checked
        if checker is not None:
            checked = check_all(checker, root, configs, agent=spec.children.agent_mode, workers=workers)
        if alert_checker is not None and ALERTMANAGER_FILE in bundle:
            alert_checker.check_config(root / ALERTMANAGER_FILE)
            alerting_checked = True

    written = output.write_tree(out, bundle, validate=validate)
    manifest = json.loads(bundle[output.MANIFEST_FILE])
    return RenderResult(
        out=written,
        assignment=assignment,
        previous=previous,
        manifest=manifest,
        checked=checked,
        alerting_checked=alerting_checked,
    )


def _quiet(message: str) -> None:
    del message


def plan(
    spec: GpufedSpec,
    targets: list[Target],
    *,
    previous_dir: str | Path,
    allow_algorithm_change: bool = False,
    warn: previous_state.Warn | None = None,
) -> planning.Plan:
    """What a render into ``previous_dir`` would change; writes nothing."""
    previous = previous_state.load_previous(previous_dir, cluster=spec.cluster, warn=warn or _quiet)
    current = assigning.assign(
        spec, targets, previous=previous, allow_algorithm_change=allow_algorithm_change
    )
    return planning.diff(previous, current)


def summary(result: RenderResult) -> dict[str, Any]:
    """Machine summary of a render: totals and per-region load spread."""
    assignment = result.assignment
    counts = planning.diff(result.previous, assignment).counts
    load = assignment.load()
    sizes = Counter(assignment.targets.values())
    regions: dict[str, dict[str, Any]] = {}
    for shard, info in sorted(assignment.shards.items()):
        row = regions.setdefault(info.region, {"shards": 0, "targets": 0, "load": 0, "max_load": 0})
        row["shards"] += 1
        row["targets"] += sizes[shard]
        row["load"] += load[shard]
        row["max_load"] = max(row["max_load"], load[shard])
    for row in regions.values():
        row["mean_load"] = round(row["load"] / row["shards"], 2)
        row["children"] = row["shards"] * assignment.replication_factor
    return {
        "out": str(result.out),
        "children": len(result.manifest["children"]),
        "shards": len(assignment.shards),
        "targets": len(assignment.targets),
        "checked": result.checked,
        "alerting_checked": result.alerting_checked,
        "moved": counts.moved,
        "added": counts.added,
        "removed": counts.removed,
        "first_run": result.previous is None,
        "regions": regions,
    }
