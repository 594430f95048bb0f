"""Rendered files on disk: the one place YAML/JSON is dumped, and the atomic tree swap.

Part of the shared kernel: every renderer returns dicts, dumps them here into a *bundle*
(relative path -> bytes), and ``write_tree`` puts a whole bundle on disk. Packages add
files by composing bundles (``{**a, **b}``) before the write; the sharder's own part is
``sharder.children.tree.build_bundle``. Dumping is sorted and unwrapped, so the same input
gives the same bytes on every run and host.

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
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from sharder.kernel.errors import OutputError

Bundle = dict[str, bytes]
"""Relative POSIX path -> file content."""

ASSIGNMENT_FILE = "assignment.json"
MANIFEST_FILE = "manifest.json"
# Files whose presence marks a directory as ours, and so safe to replace wholesale.
MARKERS = (ASSIGNMENT_FILE, MANIFEST_FILE)


#: How every YAML file is dumped; a wide line keeps long relabel regexes on one line.
_YAML_STYLE: dict[str, Any] = {"sort_keys": True, "default_flow_style": False, "allow_unicode": True,
                               "width": 4096}
#: Characters both emitters write alike (printable ASCII, tab, newline).
_PLAIN_CHARS = frozenset(map(chr, range(0x20, 0x7F))) | {"\t", "\n"}
_CSafeDumper: Any = getattr(yaml, "CSafeDumper", None)  # None: PyYAML built without libyaml


def dump_yaml(data: Any) -> bytes:
    """``data`` as YAML, the same bytes whichever emitter writes them.

    libyaml's emitter (``CSafeDumper``) is about 4x faster than PyYAML's and writes the same
    bytes for a mapping whose strings are printable ASCII (tab and newline too) and whose keys
    are not empty; it differs on other characters (U+0085, emoji) and on empty keys.
    Rendered configs are nearly always such mappings (a start-up at 1M targets writes 27,782
    child configs), so those go to libyaml and anything else to PyYAML's own emitter.
    ``tests/sharder/kernel/test_dump_yaml.py`` holds the two to the same bytes.
    """
    if _CSafeDumper is not None and isinstance(data, dict) and _plain(data):
        text = yaml.dump(data, Dumper=_CSafeDumper, **_YAML_STYLE)
    else:
        text = yaml.safe_dump(data, **_YAML_STYLE)
    return text.encode("utf-8")


def _plain(data: Any) -> bool:
    """Every string in ``data`` made of ``_PLAIN_CHARS`` and every mapping key a non-empty one."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not _PLAIN_CHARS.issuperset(item):
                return False
        elif isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str) or not key or not _PLAIN_CHARS.issuperset(key):
                    return False
                stack.append(value)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def dump_json(data: Any) -> bytes:
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


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
