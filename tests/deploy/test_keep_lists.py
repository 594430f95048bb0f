"""Every series a shipped rule or dashboard reads survives the keep list of the job that
scrapes it (issue #39 item 5: ``hami.keepMetrics`` dropped ``QuotaUsed``, so the quota
dashboard's "HAMi quota used" panel was blank on every Helm install).

The metric names are derived from the rule pack (``federation/rules/*.yml``) and the
dashboards (``federation/dashboards/*.json`` and the chart's copies), each mapped to the job
that produces it by the producer table below, then checked against that job's
``keep_metrics``/``drop_metrics`` in every shipped spec and every chart values file (the
chart's spec rendered, HAMi switched on for ``values.yaml`` since its keep list is a
default there) that scrapes the job. Recording rules (names with ``:``) and gpufed's own
meta-monitoring series are produced by no scrape job with a keep list and are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm import CHART, CI_FILES, find, render, values

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "federation" / "rules").glob("*.yml"))
DASHBOARDS = sorted((ROOT / "federation" / "dashboards").glob("*.json")) + sorted(
    (CHART / "dashboards").glob("*.json"))
SPEC_FILES = [ROOT / "examples" / "federation.yaml", ROOT / "compose" / "federation.yaml",
              ROOT / "federation" / "demo" / "default-spec.yaml"]
TOKEN = {"controller": {"token": {"value": "a-token-0123456789abcdef"}}}

#: metric name (full match) -> the job that produces it. HAMi v2.10: the scheduler exports
#: allocations and quotas, the device-plugin monitor host and container usage.
#: v2.9+ names (cmd/scheduler/metrics.go, cmd/vGPUmonitor/metrics.go) before the legacy ones.
PRODUCERS: list[tuple[str, str]] = [
    (r"hami_(gpu|node|vgpu_memory_allocated|vgpu_core|resource_quota)_.*", "hami-scheduler"),
    (r"hami_(vgpu_memory_(used|limit|context|module|buffer)|container|mig)_.*", "hami-device-plugin"),
    # hami_host_*: gpufed-exporter's HAMi family
    (r"DCGM_FI_.*|gpufed_(gpu|nvlink|exporter)_.*|hami_.*", "gpu"),
    (r"node_.*", "node"),
    (r"GPUDevice.*|vGPUPods.*|vGPUMemoryAllocated|vGPUCore.*|QuotaUsed", "hami-scheduler"),
    (r"HostGPU.*|HostCore.*|vGPU_device_.*|Device_.*", "hami-device-plugin"),
    (r"kube_.*", "kube-state-metrics"),
    (r"training_operator_.*", "training-operator"),
    (r"scheduler_.*", "kube-scheduler"),
]
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan", "atan2", "start", "end", "le", "true", "false"}
NAME = re.compile(r"(?<![\w:$.])([A-Za-z_][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', "", expr)  # string literals
    text = re.sub(r"\{[^{}]*\}", "", text)                                      # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)                                      # ranges, subqueries
    text = re.sub(r"\$\{?\w+\}?", "", text)                                     # $var, ${var}
    text = re.sub(r"\b\d[\w.]*", "", text)                                      # numbers, durations
    return {n for n in NAME.findall(text) if n not in KEYWORDS}


def test_metric_names_are_read_like_promql() -> None:
    expr = ('sum by (node) (max by (node, gpu) (hami_host_gpu_memory_used_bytes{region=~"$region"})) '
            '/ on (node) group_left(team) rate(DCGM_FI_DEV_XID_ERRORS[5m]) > bool 0 or vector(1) '
            'and label_replace(up, "node", "$1", "Hostname", "(.+)") unless gpufed:x:y offset 5m')
    assert metric_names(expr) == {"hami_host_gpu_memory_used_bytes", "DCGM_FI_DEV_XID_ERRORS", "up",
                                  "gpufed:x:y"}


def exprs() -> Iterator[tuple[str, str]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                yield f"{path.name}:{rule.get('record') or rule.get('alert')}", rule["expr"]
    for path in DASHBOARDS:
        yield from panel_exprs(json.loads(path.read_text()), f"{path.name}:")


def panel_exprs(node: Any, title: str) -> Iterator[tuple[str, str]]:
    """(file:panel title, query) of every target and templating query in a dashboard."""
    if isinstance(node, dict):
        here = f"{title.split(':')[0]}:{node['title']}" if "title" in node else title
        for key, value in node.items():
            if key in ("expr", "query") and isinstance(value, str):
                yield here, value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield here, value["query"]
            else:
                yield from panel_exprs(value, here)
    elif isinstance(node, list):
        for item in node:
            yield from panel_exprs(item, title)


def producer(name: str) -> str | None:
    return next((job for pattern, job in PRODUCERS if re.fullmatch(pattern, name)), None)


@pytest.fixture(scope="module")
def read_by_job() -> dict[str, dict[str, set[str]]]:
    """job -> metric name -> where it is read."""
    found: dict[str, dict[str, set[str]]] = {}
    for where, expr in exprs():
        for name in metric_names(expr):
            job = producer(name)
            if job is not None and ":" not in name:
                found.setdefault(job, {}).setdefault(name, set()).add(where)
    return found


def test_the_derivation_finds_every_jobs_series(read_by_job: dict[str, dict[str, set[str]]]) -> None:
    # not a no-op: the producers' series are read somewhere, both spellings of HAMi's quota by
    # the record the quota dashboard reads
    # (node-exporter's are read through up{job="node"} and records only)
    assert set(read_by_job) >= {"gpu", "hami-scheduler", "hami-device-plugin", "kube-state-metrics",
                                "training-operator", "kube-scheduler"}
    for name in ("QuotaUsed", "hami_resource_quota_used"):
        assert "hami.yml:gpufed:hami_resource_quota_used" in read_by_job["hami-scheduler"][name]
    assert len(read_by_job["gpu"]) >= 20


def shipped_jobs() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(file, its spec's jobs) for every shipped spec and chart values file."""
    for path in SPEC_FILES:
        yield str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())["jobs"]
    chart = helm.Chart.load(CHART)
    cases = [("helm/gpufed/values.yaml (hami.enabled)", {**TOKEN, "hami": {"enabled": True}})]
    cases += [(str(p.relative_to(ROOT)), values(p)) for p in CI_FILES]
    for name, given in cases:
        spec = yaml.safe_load(find(render(chart, given), "ConfigMap", "-spec")["data"]["federation.yaml"])
        yield name, spec["jobs"]


def survives(name: str, job: dict[str, Any]) -> bool:
    """Prometheus' keep then drop on __name__ (regexes fully anchored)."""
    keep = job.get("keep_metrics") or []
    if keep and not any(re.fullmatch(k, name) for k in keep):
        return False
    return not any(re.fullmatch(d, name) for d in job.get("drop_metrics") or [])


@pytest.mark.parametrize(("where", "jobs"), list(shipped_jobs()),
                         ids=lambda v: v.split("/")[-1] if isinstance(v, str) else "")
def test_every_series_read_survives_its_jobs_keep_list(
    where: str, jobs: list[dict[str, Any]], read_by_job: dict[str, dict[str, set[str]]]
) -> None:
    dropped = [f"{job['name']} drops {name} (read by {sorted(read_by_job[job['name']][name])[0]})"
               for job in jobs for name in sorted(read_by_job.get(job["name"], {}))
               if not survives(name, job)]
    assert not dropped, f"{where}: " + "; ".join(dropped)
