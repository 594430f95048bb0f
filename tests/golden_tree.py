"""Golden trees under ``tests/golden/<case>/``: the one check the renderers' tests share.

``GPUFED_REGEN_GOLDEN=1`` writes the rendered files over the tree (review the diff);
without it a mismatch fails and nothing is written. A case's ``spec.yaml`` is its input,
not part of the tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
REGEN = os.environ.get("GPUFED_REGEN_GOLDEN") == "1"


def golden_files(case: Path) -> dict[str, bytes]:
    """Every file of the tree (its spec.yaml left out), by path relative to ``case``."""
    return {
        p.relative_to(case).as_posix(): p.read_bytes()
        for p in sorted(case.rglob("*"))
        if p.is_file() and p.name != "spec.yaml"
    }


def check_golden_tree(case: Path, bundle: Mapping[str, bytes]) -> None:
    """``bundle`` is the tree at ``case``, file for file (written first with the flag)."""
    if REGEN:
        for rel, data in bundle.items():
            (case / rel).parent.mkdir(parents=True, exist_ok=True)
            (case / rel).write_bytes(data)
    assert golden_files(case) == dict(bundle), (
        "rendered output differs; regenerate with GPUFED_REGEN_GOLDEN=1 and review the diff"
    )
