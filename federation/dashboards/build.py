"""Render every dashboard to JSON and write or check the committed files.

``render_all()`` is pure (file name -> bytes); ``main`` is the thin edge:
``python -m federation.dashboards.build --write`` regenerates the files,
``--check`` (the default) exits 1 naming every file that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from federation.dashboards import DASHBOARDS_DIR
from federation.dashboards.distributed import distributed_dashboard
from federation.dashboards.gpu import cluster_dashboard, node_dashboard
from federation.dashboards.grafana import Dashboard, render_dashboard
from federation.dashboards.health import federation_dashboard
from federation.dashboards.host import host_dashboard
from federation.dashboards.training import training_dashboard
from federation.dashboards.workloads import pod_dashboard, quota_dashboard

DEFINITIONS: tuple[Callable[[], Dashboard], ...] = (
    cluster_dashboard,
    node_dashboard,
    host_dashboard,
    pod_dashboard,
    quota_dashboard,
    federation_dashboard,
    training_dashboard,
    distributed_dashboard,
)


def dump(model: dict[str, Any]) -> bytes:
    """Sorted keys, two-space indent, trailing newline: byte-stable across runs."""
    return (json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def render_all() -> dict[str, bytes]:
    """``<uid>.json`` -> JSON bytes for every dashboard; uids must be unique."""
    out: dict[str, bytes] = {}
    for define in DEFINITIONS:
        dashboard = define()
        name = f"{dashboard.uid}.json"
        if name in out:
            raise ValueError(f"two dashboards have uid {dashboard.uid!r}")
        out[name] = dump(render_dashboard(dashboard))
    return out


def differences(directory: Path, rendered: dict[str, bytes]) -> list[str]:
    """File names that are missing, stale, or no longer generated."""
    on_disk = {path.name for path in directory.glob("*.json")}
    stale = [name for name, data in rendered.items()
             if name not in on_disk or (directory / name).read_bytes() != data]
    return sorted(stale + sorted(on_disk - set(rendered)))


def write(directory: Path, rendered: dict[str, bytes]) -> None:
    for name in sorted({path.name for path in directory.glob("*.json")} - set(rendered)):
        (directory / name).unlink()
    for name, data in rendered.items():
        (directory / name).write_bytes(data)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federation.dashboards.build", description=__doc__)
    parser.add_argument("--write", action="store_true", help="regenerate the committed JSON files")
    parser.add_argument("--dir", type=Path, default=DASHBOARDS_DIR, help="directory (default: the package's)")
    args = parser.parse_args(argv)
    rendered = render_all()
    if args.write:
        write(args.dir, rendered)
        print(f"wrote {len(rendered)} dashboards to {args.dir}")
        return 0
    stale = differences(args.dir, rendered)
    for name in stale:
        print(f"differs from the generator: {args.dir / name}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
