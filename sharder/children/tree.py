"""The sharder's part of an output tree: child configs, the manifest and the assignment.

Pipeline position: ``sharder.children.render`` produces the child configs as dicts; this module
dumps them through the kernel's ``sharder.kernel.output`` into a bundle (and reads back the
assignment a previous run left), which ``sharder.kernel.output.write_tree`` puts on disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from sharder.children.render import ChildConfig, manifest, render_children
from sharder.engine.assignment import Assignment
from sharder.kernel.errors import AssignmentError, clip
from sharder.kernel.output import ASSIGNMENT_FILE, MANIFEST_FILE, Bundle, dump_json, dump_yaml
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec


def child_files(child: ChildConfig) -> Bundle:
    base = f"children/{child.child}"
    files = {f"{base}/prometheus.yml": dump_yaml(child.prometheus)}
    for job, groups in child.file_sd.items():
        files[f"{base}/targets/{job}.json"] = dump_json(groups)
    return files


def build_bundle(spec: FederationSpec, targets: Iterable[Target], assignment: Assignment) -> Bundle:
    """The sharder's part of an output tree: every child, the manifest and the assignment."""
    children = render_children(spec, targets, assignment)
    bundle: Bundle = {}
    for child in children:
        bundle.update(child_files(child))
    bundle.update(_summary(spec, assignment, children))
    return bundle


def summary_files(spec: FederationSpec, targets: Iterable[Target], assignment: Assignment) -> Bundle:
    """The manifest and the assignment alone, as :func:`build_bundle` writes them: what
    changes with the targets while the children set (so every child's config) does not."""
    return _summary(spec, assignment, render_children(spec, targets, assignment, configs=False))


def _summary(spec: FederationSpec, assignment: Assignment, children: list[ChildConfig]) -> Bundle:
    return {
        MANIFEST_FILE: dump_json(manifest(spec, assignment, children)),
        ASSIGNMENT_FILE: dump_json(assignment.model_dump(mode="json")),
    }


def prometheus_configs(bundle: Bundle) -> list[str]:
    """Relative paths of the child configs in a bundle, for checking."""
    return sorted(p for p in bundle if p.startswith("children/") and p.endswith("/prometheus.yml"))


def read_assignment(out_dir: str | Path) -> Assignment | None:
    """The assignment a previous run left in ``out_dir``; None on a first run."""
    path = Path(out_dir) / ASSIGNMENT_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AssignmentError(f"{path}: cannot read previous assignment: {exc.strerror}") from None
    try:
        return Assignment.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = clip(".".join(str(p) for p in first["loc"]))
        raise AssignmentError(
            f"{path}: not a valid assignment ({where + ': ' if where else ''}{clip(first['msg'])});"
            " delete it to start afresh (the next render then places every target anew)"
        ) from None
