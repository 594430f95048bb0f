"""A values file for the chart (helm/gpufed) from a sizing, in the chart's own value names. Pure.

Only names ``helm/gpufed/values.schema.json`` has are written: the children's shards per region
and resources, the controller's, the master's (replicas, storage, resources: ingest and the
rule pack), Alertmanager's and the relay's resources (the demo's measured figures: they do not
grow with the fleet), Thanos Receive's resources (what it needs once ``thanos.enabled``) and
its replicas and storage when the model needs it. The result is checked against the schema by
the tests, and the chart's defaults are this file for its stated fleet (a test recomputes them).
"""

from __future__ import annotations

import math
from typing import Any

from federation.sizing.model import ALERTMANAGER, RELAY, Component, Sizing

#: The chart's bound on one region's shards (values.schema.json, children.perRegion).
CHART_MAX_SHARDS = 500


class HelmValuesError(ValueError):
    """The sizing does not fit what the chart accepts."""


def _resources(c: Component) -> dict[str, Any]:
    return {
        "requests": {"cpu": f"{round(c.cpu_request * 1000)}m", "memory": f"{c.memory_request_mib}Mi"},
        "limits": {"memory": f"{c.memory_limit_mib}Mi"},
    }


def helm_values(sizing: Sizing) -> dict[str, Any]:
    by_name = {c.name: c for c in sizing.components}
    too_many = {r: n for r, n in sizing.shards_per_region.items() if n > CHART_MAX_SHARDS}
    if too_many:
        raise HelmValuesError(
            f"children.perRegion: the chart takes at most {CHART_MAX_SHARDS} shards a region, this fleet"
            f" needs {too_many}; raise sharding.targets_per_shard or add regions"
        )
    master = by_name["master-prometheus"]
    values: dict[str, Any] = {
        "children": {
            "perRegion": dict(sorted(sizing.shards_per_region.items())),
            "resources": _resources(by_name["child-prometheus"]),
        },
        "controller": {"resources": _resources(by_name["controller"])},
        "master": {
            "replicas": master.count,
            "storage": f"{max(1, math.ceil(master.disk_gib))}Gi",
            "resources": _resources(master),
        },
    }
    # Written whether or not the spec alerts: the chart turns them on with alertmanager.enabled.
    for fixed, key in ((ALERTMANAGER, "alertmanager"), (RELAY, "dingtalk")):
        values[key] = {"resources": _resources(by_name.get(fixed.name, fixed))}
    if sizing.receive_if_enabled is not None:
        receive: dict[str, Any] = {"resources": _resources(sizing.receive_if_enabled)}
        if "thanos-receive" in by_name:
            needed = by_name["thanos-receive"]
            receive |= {"replicas": needed.count, "storage": f"{max(1, math.ceil(needed.disk_gib))}Gi"}
        values["thanos"] = {"receive": receive}
    return values
