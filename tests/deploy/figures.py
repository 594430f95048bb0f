"""Figures for the deployment checks, as JSON: ``.venv/bin/python tests/deploy/figures.py``.

Compose files and services validated by Compose v2 ``config``; chart objects rendered per
``ci/`` values file and validated per Kubernetes version; ``ci/bad/`` files rejected with
their expected message. The tests assert the same things; this only counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deploy_tools import compose_binary, schema_errors  # noqa: E402

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
VERSIONS = ("1.29", "1.33")


def compose_figures(tmp: Path) -> dict[str, dict[str, int]]:
    out = tmp / "out"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "federation.commands.cli",
            "render",
            "--spec",
            "compose/federation.yaml",
            "--inventory",
            "examples/inventory.yaml",
            "--out",
            str(out),
            "--target",
            "compose",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    lines = (out / "compose" / ".env.example").read_text().splitlines()
    env = tmp / "monitoring.env"
    env.write_text(
        "\n".join(
            f"{line}x-0123456789abcdef"
            if line.endswith("=") and not line.startswith("#") and not line.endswith("_FLAGS=")
            else line
            for line in lines
        )
        + f"\nGPUFED_SPEC={ROOT}/compose/federation.yaml\n"
    )
    figures = {}
    for name, env_file, cwd in (
        ("compose/node.yml", "node.env.example", ROOT / "compose"),
        ("out/compose/monitoring.yml", str(env), out / "compose"),
    ):
        base = [str(compose_binary()), "--env-file", env_file, "-f", Path(name).name, "config"]
        quiet = subprocess.run([*base, "--quiet"], cwd=cwd, capture_output=True, check=False)
        done = subprocess.run(
            [*base, "--format", "json"], cwd=cwd, capture_output=True, text=True, check=True
        )
        figures[name] = {
            "config_quiet_rc": quiet.returncode,
            "services": len(json.loads(done.stdout)["services"]),
        }
    return figures


def helm_figures() -> dict[str, object]:
    chart = helm.Chart.load(ROOT / "helm" / "gpufed")
    rendered: dict[str, dict[str, int]] = {}
    for values_file in sorted((ROOT / "helm" / "gpufed" / "ci").glob("*.yaml")):
        out = chart.render(yaml.safe_load(values_file.read_text()), name="gpufed", namespace="monitoring")
        objects = [
            d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
        ]
        row = {"objects": len(objects), "operator_crds": sum(o["kind"] in CRD_KINDS for o in objects)}
        for version in VERSIONS:
            for obj in objects:
                if obj["kind"] not in CRD_KINDS:
                    kubernetes_validate.validate(obj, version, strict=True)
            row[f"validated_strict_{version}"] = row["objects"] - row["operator_crds"]
        rendered[values_file.name] = row
    bad = sorted((ROOT / "helm" / "gpufed" / "ci" / "bad").glob("*.yaml"))
    rejected = alone = 0
    for path in bad:
        text = path.read_text()
        try:
            chart.render(yaml.safe_load(text), name="gpufed", namespace="monitoring")
        except helm.HelmValuesError as exc:
            expected = text.splitlines()[0].removeprefix("# expect: ") in str(exc)
            rejected += expected
            alone += expected and len(schema_errors(str(exc))) == 1
    return {
        "rendered": rendered,
        "bad_files": len(bad),
        "bad_rejected_with_expected_message": rejected,
        "bad_rejected_for_that_reason_only": alone,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        figures = {"compose": compose_figures(Path(tmp)), "helm": helm_figures()}
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
