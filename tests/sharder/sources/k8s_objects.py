"""Kubernetes objects as the API server returns them, for the discovery tests."""

from __future__ import annotations

from typing import Any

MANAGER = "endpointslice-controller.k8s.io"


def node(name: str, *, region: str = "r1", zone: str = "z1", gpus: str | None = "8") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/region": region,
              "topology.kubernetes.io/zone": zone}
    allocatable = {"cpu": "96", "memory": "1Ti"} | ({"nvidia.com/gpu": gpus} if gpus is not None else {})
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def endpoint(ip: str, node_name: str, *, ready: bool | None = True) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready, "serving": ready, "terminating": False}
    return {"addresses": [ip], "conditions": conditions, "nodeName": node_name,
            "targetRef": {"kind": "Pod", "namespace": "monitoring", "name": f"exporter-{node_name}"}}


def endpoint_slice(name: str, endpoints: list[dict[str, Any]], *, service: str = "gpufed-exporter",
                   port: int = 9400) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "monitoring",
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": MANAGER}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}]}


def pod(name: str, ip: str, node_name: str, *, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "monitoring",
                         "labels": {"app.kubernetes.io/name": "gpufed-exporter"}},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "exporter", "ports": [{"name": "metrics", "containerPort": 9400}]}]},
            "status": {"podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
