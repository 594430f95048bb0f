"""Rendered files on disk: the one place YAML/JSON is dumped, and the atomic tree swap.

Pipeline position: ``sharder.render`` produces dicts; ``build_bundle`` dumps them into a
*bundle* (relative path -> bytes) and ``write_tree`` puts a whole bundle on disk. Other
packages add files by composing bundles (``{**a, **b}``) before the write. Dumping is
sorted and unwrapped, so the same input gives the same bytes on every run and host.

Layout of an output tree::

    DIR/manifest.json                          children, shards, regions, counts, flags
    DIR/assignment.json                        read back by the next run (sticky shards)
    DIR/children/<child>/prometheus.yml
    DIR/children/<child>/targets/<job>.json    file_sd only
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import ValidationError

from sharder.assignment import Assignment
from sharder.errors import AssignmentError, OutputError, clip
from sharder.inventory import Target
from sharder.render import ChildConfig, manifest, render_children
from sharder.spec import FederationSpec

Bundle = dict[str, bytes]
"""Relative POSIX path -> file content."""

ASSIGNMENT_FILE = "assignment.json"
MANIFEST_FILE = "manifest.json"
# Files whose presence marks a directory as ours, and so safe to replace wholesale.
MARKERS = (ASSIGNMENT_FILE, MANIFEST_FILE)


def dump_yaml(data: Any) -> bytes:
    # A wide line keeps long relabel regexes on one line instead of folded.
    text = yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True, width=4096)
    return text.encode("utf-8")


def dump_json(data: Any) -> bytes:
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


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
    bundle[MANIFEST_FILE] = dump_json(manifest(spec, assignment, children))
    bundle[ASSIGNMENT_FILE] = dump_json(assignment.model_dump(mode="json"))
    return bundle


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


def _safe_relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or not rel.parts or ".." in rel.parts:
        raise OutputError(f"bundle path {path!r} is not a plain relative path")
    return rel


def _check_replaceable(out: Path) -> None:
    """Refuse to replace anything that is not an earlier gpufed output (``--out ~`` must not wipe ~)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(f"{out}: exists and is not a directory")
    if any(out.iterdir()) and not any((out / marker).is_file() for marker in MARKERS):
        raise OutputError(f"{out}: refusing to replace a non-empty directory that gpufed did not write")


def write_tree(
    out_dir: str | Path, bundle: Bundle, *, validate: Callable[[Path], None] | None = None
) -> Path:
    """Replace ``out_dir`` with exactly ``bundle``; on any failure the old tree stays as it was.

    Files are written into a temp dir beside ``out_dir`` (same filesystem, so renames are
    atomic), ``validate(temp_dir)`` runs there, and only then are the dirs swapped. Between
    the two renames ``out_dir`` is briefly absent; readers that need more use the manifest.
    """
    out = Path(out_dir).resolve()
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rels = {path: _safe_relative(path) for path in bundle}
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide configs from a Prometheus user
        for path in sorted(bundle):
            target = staging.joinpath(*rels[path].parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bundle[path])
        if validate is not None:
            validate(staging)
        _swap(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _swap(staging: Path, out: Path) -> None:
    if not out.exists():
        os.rename(staging, out)
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
