"""Write the sizing tables into the docs from `gpufed size`'s model (issue 40).

    python scripts/sizing_tables.py          # exit 1 and name the documents that drifted
    python scripts/sizing_tables.py --write  # rewrite the blocks

helm/gpufed/README.md (`chart`): the chart's `federation` with the fixed shards dropped, as
its README tells a bigger fleet to do. docs/sizing.md (`seed`): examples/federation.yaml next
to seed 002's table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from federation.sizing import tables
from federation.sizing.costs import load_costs
from federation.spec import GpufedSpec, load_gpufed_spec

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpufed"
DOCS = ROOT / "docs" / "sizing.md"
EXAMPLE = ROOT / "examples" / "federation.yaml"


def chart_spec() -> GpufedSpec:
    raw = yaml.safe_load((CHART / "values.yaml").read_text())["federation"]
    for region in raw["regions"]:
        region.pop("shards", None)
    return GpufedSpec.model_validate(raw)


def wanted() -> dict[Path, tuple[str, str]]:
    costs = load_costs()
    return {
        CHART / "README.md": ("chart", tables.chart_table(chart_spec(), costs)),
        DOCS: ("seed", tables.seed_table(load_gpufed_spec(EXAMPLE), costs)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks")
    args = parser.parse_args()
    drifted = []
    for path, (name, table) in wanted().items():
        text = path.read_text()
        if tables.block(text, name) == table:
            continue
        if args.write:
            path.write_text(tables.replace_block(text, name, table))
        else:
            drifted.append(f"{path.relative_to(ROOT)} ({name})")
    if drifted:
        print("sizing tables drifted: " + ", ".join(drifted) + "; run with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
