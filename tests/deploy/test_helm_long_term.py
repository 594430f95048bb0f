"""The chart passes ``federation.master.long_term`` to the controller, whose master remote-writes there.

No template names the long-term store: the spec the chart gives ``gpufed serve`` carries it,
and the master's ``remote_write`` is rendered from that spec like every other master field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from federation.master.render import render_master_config
from federation.spec import GpufedSpec
from sharder.model.loading import parse_model

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpufed"
VM_URL = "http://vmsingle.monitoring.svc:8428/api/v1/write"


def controller_spec(values: dict[str, Any]) -> GpufedSpec:
    out = helm.Chart.load(CHART).render(values, name="gpufed", namespace="monitoring")
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] == "ConfigMap" and "federation.yaml" in doc.get("data", {}):
                return parse_model(GpufedSpec, yaml.safe_load(doc["data"]["federation.yaml"]), source=path)
    raise AssertionError("no ConfigMap carries federation.yaml")


def test_long_term_value_reaches_the_masters_remote_write() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["controller"]["token"]["value"] = "t" * 40
    values["federation"]["master"] = {"long_term": {"kind": "victoriametrics", "url": VM_URL}}
    spec = controller_spec(values)
    assert spec.master is not None and spec.master.replicas == 2  # the chart's own master values kept
    (write,) = render_master_config(spec)["remote_write"]
    assert write == {
        "name": "victoriametrics",
        "url": VM_URL,
        "queue_config": {"capacity": 50000, "max_shards": 100},
    }
