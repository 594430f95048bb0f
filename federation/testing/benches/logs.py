"""What the logs tier and Grafana provisioning cost per render: ``python -m
federation.testing.benches.logs [--targets N] [--teams T]`` prints JSON.

Times ``pipeline.logs_part`` and ``pipeline.grafana_part`` on the
example spec and inventory, then on ``N`` synthetic GPU targets spread over ``T`` teams and
the spec's regions: the Grafana part scans the targets once for teams and regions and
pins four dashboards per team, so it grows with teams more than with targets. ``cold_ms``
is a first render; ``warm_ms`` (best of ``--repeat``) a render whose teams and regions are
unchanged, which finds the pinned files in ``federation.grafana.render``'s memo.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from federation.grafana import render as grafana_render
from federation.master import pipeline
from sharder.model.inventory import Target

ROOT = Path(__file__).resolve().parents[3]


def _best(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(targets: int, teams: int, repeat: int) -> dict[str, Any]:
    spec, example = pipeline.load_inputs(
        ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml"
    )
    regions = spec.region_names()
    base = next(t for t in example if t.job == "gpu")
    synthetic: list[Target] = [
        base.model_copy(
            update={"node": f"n{i}", "team": f"team{i % teams}", "region": regions[i % len(regions)]}
        )
        for i in range(targets)
    ]
    out: dict[str, Any] = {"targets": targets, "teams": teams}
    for name, part, fleet in (
        ("logs_part_example", pipeline.logs_part, example),
        ("grafana_part_example", pipeline.grafana_part, example),
        ("grafana_part_synthetic", pipeline.grafana_part, synthetic),
    ):
        grafana_render._render.cache_clear()
        start = time.perf_counter()
        bundle = part(spec, fleet, None)  # type: ignore[arg-type]
        cold = time.perf_counter() - start
        out[name] = {
            "cold_ms": round(cold * 1000, 1),
            # again, same teams and regions: Grafana's files come from the memo
            "warm_ms": round(_best(lambda p=part, f=fleet: p(spec, f, None), repeat) * 1000, 1),  # type: ignore[misc]
            "files": len(bundle),
            "kib": sum(map(len, bundle.values())) // 1024,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federation.testing.benches.logs", description=__doc__)
    parser.add_argument("--targets", type=int, default=100_000)
    parser.add_argument("--teams", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.targets, args.teams, args.repeat), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
