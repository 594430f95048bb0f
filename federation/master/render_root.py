"""The render root: the directory ``gpufed render --target compose`` writes its tree into.

Every compose service mounts the *parent* of the rendered tree at ``/gpufed`` (read-only):
``write_tree`` swaps the tree by rename, which a bind mount of the tree itself would not
follow. So that parent is visible to 20-odd containers, and it must hold nothing but
rendered trees: no env file, no spec with secrets, no source checkout. This check runs
before a compose render writes anything and refuses a parent holding anything else.

Allowed in the root: rendered trees (directories with ``manifest.json``) and what
``write_tree`` and the output lock leave beside a tree (``.<tree>.new-*``, ``.<tree>.old-*``,
``.<tree>.lock``).
"""

from __future__ import annotations

import re
from pathlib import Path

from sharder.kernel.errors import OutputError
from sharder.kernel.output import MANIFEST_FILE

_SIDECAR = re.compile(r"^\..+\.(new-.+|old-.+|lock)$")


def foreign_entries(root: Path, *, out_name: str) -> list[str]:
    """Names in ``root`` that are neither rendered trees nor a render's own staging files."""
    if not root.is_dir():
        return []
    foreign = []
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if _SIDECAR.match(entry.name):
            continue
        if entry.name == out_name and entry.is_dir() and not any(entry.iterdir()):
            continue  # an empty directory made for the first render
        if entry.is_dir() and not entry.is_symlink() and (entry / MANIFEST_FILE).is_file():
            continue
        foreign.append(entry.name)
    return foreign


def check_render_root(out: str | Path) -> None:
    """Refuse a compose render whose ``--out`` parent holds anything but rendered trees."""
    path = Path(out).absolute()
    foreign = foreign_entries(path.parent, out_name=path.name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(
            f"--out {out}: its parent {path.parent} is mounted into every compose service, so it may hold"
            f" only rendered trees, but it holds {shown}; render into a directory of its own, e.g."
            f" --out /srv/gpufed/render/current"
        )
