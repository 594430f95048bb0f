"""The Helm runner's pure parts on the chart's own render: what the kubelet would make of each
pod (args, env, volumes) and what the cluster would serve (Nodes, EndpointSlices, names).
No root needed; the run itself is tests/deploy/test_helm_run.py."""

from __future__ import annotations

from typing import Any

import pytest

from federation.testing.benches import helm as bench
from federation.testing.harnesses.helmrun import cluster
from federation.testing.harnesses.helmrun.pods import PodError, container_env, expand_vars, make_pod

TOKEN = "a-token-0123456789abcdef"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return bench.render(token=TOKEN, region=bench.default_region())


def workload(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_expand_vars_as_the_kubelet_does() -> None:
    env = {"POD_IP": "10.0.0.7"}
    assert expand_vars("http://$(POD_IP):8080", env) == "http://10.0.0.7:8080"
    assert expand_vars("$(MISSING)-$$(POD_IP)", env) == "$(MISSING)-$(POD_IP)"


def test_env_resolves_downward_api_secrets_and_earlier_variables() -> None:
    container = {
        "envFrom": [{"secretRef": {"name": "s"}}],
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "URL", "value": "http://$(NODE):1/$(TOKEN)"},
            {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        ],
    }
    refs = {
        "Secret": {"s": {"kind": "Secret", "data": {"TOKEN": "dG9r"}}},  # base64 "tok"
        "ConfigMap": {"c": {"kind": "ConfigMap", "data": {"k": "v"}}},
    }
    pod = {
        "name": "p",
        "namespace": "ns",
        "ip": "1.2.3.4",
        "node": "n1",
        "host_ip": "5.6.7.8",
        "service_account": "default",
    }
    env = container_env(container, refs=refs, pod=pod, where="x")
    assert env == {"TOKEN": "tok", "NODE": "n1", "URL": "http://n1:1/tok", "K": "v"}
    with pytest.raises(PodError, match=r"x\.env\.BAD: fieldRef 'metadata\.uid'"):
        container_env(
            {"env": [{"name": "BAD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]},
            refs=refs,
            pod=pod,
            where="x",
        )


def test_the_controller_pod_gets_its_rendered_args_token_and_spec_file(objects: list[dict[str, Any]]) -> None:
    deployment = workload(objects, "Deployment", "gpufed-controller")
    pod = make_pod(
        deployment,
        name="gpufed-controller-0",
        node="n1",
        ip="10.213.0.20",
        host_ip="10.213.0.11",
        namespace="monitoring",
        objects=objects,
    )
    (service,) = pod.containers
    assert service.command is not None and service.command[:2] == ("gpufed", "serve")
    assert "--advertise-url=http://10.213.0.20:8080" in service.command  # $(POD_IP) from status.podIP
    assert service.environment["GPUFED_TOKEN"] == TOKEN  # envFrom the rendered Secret
    assert service.environment["POD_NAME"] == "gpufed-controller-0"
    assert "federation.yaml" in pod.volumes["spec"].files
    assert ("spec", "/etc/gpufed", True) in pod.mounts[service.name]
    assert pod.service_account and service.restart == "always"


def test_the_child_pod_runs_its_init_container_first_and_shares_the_config_dir(
    objects: list[dict[str, Any]],
) -> None:
    sts = workload(objects, "StatefulSet", "gpufed-child-cn-beijing")
    pod = make_pod(
        sts,
        name="gpufed-child-cn-beijing-0",
        node="n1",
        ip="10.213.0.21",
        host_ip="10.213.0.11",
        namespace="monitoring",
        objects=objects,
    )
    assert [s.name for s in pod.init] == ["gpufed-child-cn-beijing-0/config-init"]
    assert pod.init[0].restart == "on-failure" and pod.init[0].command == ("sh", "/scripts/config-sync.sh")
    assert pod.volumes["config"].empty and "config-sync.sh" in pod.volumes["scripts"].files
    assert pod.subdomain == "gpufed-child-cn-beijing"
    prometheus = next(s for s in pod.containers if s.name.endswith("/prometheus"))
    assert prometheus.healthcheck is not None and prometheus.healthcheck.test[-1].endswith(":9090/-/ready")


def test_the_cluster_serves_unlabelled_nodes_and_slices_at_the_pod_ips(objects: list[dict[str, Any]]) -> None:
    ds = workload(objects, "DaemonSet", "gpufed-exporter")
    pods = {
        f"gpufed-exporter-n{i}": make_pod(
            ds,
            name=f"gpufed-exporter-n{i}",
            node=f"n{i}",
            ip=f"10.213.0.{30 + i}",
            host_ip=f"10.213.0.{10 + i}",
            namespace="monitoring",
            objects=objects,
        )
        for i in range(2)
    }
    addresses = {name: f"10.213.0.{30 + i}" for i, name in enumerate(pods)}
    served = cluster.api_objects(
        objects, pods, addresses, {"n0": "10.213.0.10", "n1": "10.213.0.11"}, namespace="monitoring"
    )
    nodes = [o for plural, o in served if plural == "nodes"]
    assert len(nodes) == 2 and not [
        n for n in nodes if "topology.kubernetes.io/region" in n["metadata"]["labels"]
    ]
    (slice_,) = [o for plural, o in served if plural == "endpointslices"]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "gpufed-exporter"
    assert slice_["ports"] == [{"name": "metrics", "port": 9400, "protocol": "TCP"}]
    assert {(e["addresses"][0], e["nodeName"]) for e in slice_["endpoints"]} == {
        ("10.213.0.30", "n0"),
        ("10.213.0.31", "n1"),
    }
    names = cluster.service_names(objects, pods, addresses, namespace="monitoring")
    assert names["gpufed-exporter.monitoring.svc"] == "10.213.0.30"
