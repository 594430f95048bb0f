"""federation.master.query.max_concurrency reaches the chart's master Prometheus as
--query.max-concurrency (rendered by the Helm v4 SDK), and only when set."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import yaml
from conftest import ROOT

CHART = ROOT / "helm" / "gpufed"


def master_args(values: dict[str, Any]) -> list[str]:
    out = helm.Chart.load(CHART).render(values, name="gpufed", namespace="monitoring")
    for path, text in sorted(out.items()):
        for doc in yaml.safe_load_all(text) if path.endswith(".yaml") else []:
            if doc and doc["kind"] == "StatefulSet" and doc["metadata"]["name"].endswith("-master"):
                return list(doc["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError("no master StatefulSet")


def test_set_renders_the_flag() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    base = {"controller": {"token": {"value": "ci-token-0123456789abcdef"}}}
    assert not any(a.startswith("--query.max-concurrency") for a in master_args(base))
    spec = {**defaults["federation"], "master": {"query": {"max_concurrency": 48}}}
    assert "--query.max-concurrency=48" in master_args({**base, "federation": spec})
