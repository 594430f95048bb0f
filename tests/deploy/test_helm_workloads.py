"""Every workload the chart renders runs with requests, probes and, when replicated, a
PodDisruptionBudget (issue #39 item 2), for every CI values file; and each component's
resources and placement values reach its pods (the schema accepts them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm import CHART, CI_FILES, render, values

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}
#: ports a container serves HTTP on (gRPC, gossip and memberlist ports are not probed)
HTTP_PORTS = {"http", "metrics"}


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def pod(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    return dict(spec if workload["kind"] == "Pod" else spec["template"]["spec"])


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_every_container_has_requests_and_every_http_server_probes(
    chart: helm.Chart, values_file: Path
) -> None:
    objects = render(chart, values(values_file))
    assert workloads(objects)
    for workload in [*workloads(objects), *[o for o in objects if o["kind"] == "Pod"]]:  # + helm test pod
        spec = pod(workload)
        where = f"{workload['kind']} {workload['metadata']['name']}"
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            requests = (container.get("resources") or {}).get("requests") or {}
            assert {"cpu", "memory"} <= requests.keys(), f"{where}/{container['name']}: no requests"
        for container in spec["containers"]:
            ports = {p["name"] for p in container.get("ports", [])}
            if not ports & HTTP_PORTS:
                continue
            for probe in ("readinessProbe", "livenessProbe"):
                assert probe in container, f"{where}/{container['name']}: no {probe}"


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_every_replicated_workload_has_a_disruption_budget(chart: helm.Chart, values_file: Path) -> None:
    objects = render(chart, values(values_file))
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    for workload in workloads(objects):
        if workload["kind"] == "DaemonSet" or int(workload["spec"].get("replicas", 1)) < 2:
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, f"{workload['kind']} {workload['metadata']['name']}: {len(covering)} PDBs"


def test_our_servers_are_probed_on_readyz_and_healthz(chart: helm.Chart) -> None:
    objects = render(chart, values(CHART / "ci" / "full-values.yaml"))
    for workload in workloads(objects):
        for container in pod(workload)["containers"]:
            if container.get("command", [""])[0] not in ("gpufed", "gpufed-exporter", "gpufed-dingtalk"):
                continue
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", container["name"]
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", container["name"]


PLACEMENT = {
    "resources": {"requests": {"cpu": "1", "memory": "3Gi"}, "limits": {"memory": "6Gi"}},
    "nodeSelector": {"pool": "monitoring"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "monitoring", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["monitoring"]}]}]}}},
    "priorityClassName": "monitoring-high",
}
#: values path -> (workload name suffix, container)
COMPONENTS = {
    ("master",): ("-master", "prometheus"),
    ("alertmanager",): ("-alertmanager", "alertmanager"),
    ("dingtalk",): ("-dingtalk", "relay"),
    ("thanos", "receive"): ("-thanos-receive", "receive"),
    ("thanos", "query"): ("-thanos-query", "query"),
    ("thanos", "store"): ("-thanos-store", "store"),
    ("thanos", "compactor"): ("-thanos-compactor", "compactor"),
    ("controller",): ("-controller", "controller"),
    ("children",): ("-child-cn-beijing", "prometheus"),
}


def test_each_components_resources_and_placement_reach_its_pods(chart: helm.Chart) -> None:
    base = values(CHART / "ci" / "full-values.yaml")
    objstore = {"config": {"type": "FILESYSTEM", "config": {"directory": "/d"}}}
    base["thanos"] = {**base.get("thanos", {}), "enabled": True, "objstore": objstore}
    for path in COMPONENTS:
        node = base
        for key in path:
            node = node.setdefault(key, {})
        node.update(PLACEMENT)
    objects = render(chart, base)
    for path, (suffix, name) in COMPONENTS.items():
        (workload,) = [w for w in workloads(objects) if w["metadata"]["name"].endswith(suffix)]
        spec = pod(workload)
        (container,) = [c for c in spec["containers"] if c["name"] == name]
        assert container["resources"] == PLACEMENT["resources"], path
        for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
            assert spec[key] == PLACEMENT[key], (path, key)


def test_the_defaults_size_the_master_for_the_stated_fleet() -> None:
    """The master's default resources come from `gpufed size` for the chart's stated 100-node
    fleet (tests/federation/test_sizing.py compares every sized value); here: they are set, and
    the limit stands above the request (the model's 1.5x, rounded to 64 MiB)."""
    master = yaml.safe_load((CHART / "values.yaml").read_text())["master"]
    request = int(master["resources"]["requests"]["memory"].removesuffix("Mi"))
    limit = int(master["resources"]["limits"]["memory"].removesuffix("Mi"))
    assert request >= 64 and limit > request, master["resources"]


def test_children_retention_reaches_the_agents_flag(chart: helm.Chart) -> None:
    """children.retention was read by no template; the agent keeps its WAL that long at most
    (--storage.agent.retention.max-time, in both Prometheus lines' --help)."""
    base = values(CHART / "ci" / "default-values.yaml")
    base["children"] = {**base.get("children", {}), "retention": "90m"}
    objects = render(chart, base)
    (child,) = [w for w in workloads(objects) if w["metadata"]["name"].endswith("-child-cn-beijing")]
    (agent,) = [c for c in pod(child)["containers"] if c["name"] == "prometheus"]
    assert "--storage.agent.retention.max-time=90m" in agent["args"]
