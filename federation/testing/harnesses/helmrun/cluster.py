"""What the cluster knows of the run (pure): the API objects the stand-in serves and Service names.

``api_objects``: the rendered ConfigMaps, a Node per node name (Ready, GPUs allocatable,
the GPU-node label DaemonSets select on, and **no** region label), a running Pod per pod,
and an EndpointSlice per rendered Service with a selector (the endpoint controller's job):
ready endpoints at the pod IPs, with the pod's node and a ``targetRef``.
``service_names``: what cluster DNS would answer, for the hosts files.
"""

from __future__ import annotations

from typing import Any

from federation.testing.harnesses.helmrun.pods import Pod

GPUS_PER_NODE = "8"
NODE_LABELS = {"nvidia.com/gpu.present": "true"}


def _selected(pod: Pod, selector: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= pod.template_labels.items()


def _target_port(service_port: dict[str, Any], pod: Pod) -> int | None:
    target = service_port.get("targetPort", service_port["port"])
    return int(target) if isinstance(target, int) else pod.ports.get(str(target))


def node_object(name: str, address: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **NODE_LABELS}},
        "status": {
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "allocatable": {"nvidia.com/gpu": GPUS_PER_NODE, "cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_object(pod: Pod, address: str, namespace: str) -> dict[str, Any]:
    return {
        "metadata": {"name": pod.name, "namespace": namespace, "labels": pod.template_labels},
        "spec": {
            "nodeName": pod.node,
            "hostNetwork": pod.host_network,
            "containers": [
                {
                    "name": c.name.split("/", 1)[1],
                    "ports": [{"name": n, "containerPort": p} for n, p in sorted(pod.ports.items())],
                }
                for c in pod.containers
            ],
        },
        "status": {"phase": "Running", "podIP": address, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def endpoint_slice(
    service: dict[str, Any], pods: list[Pod], addresses: dict[str, str], namespace: str
) -> dict[str, Any]:
    name = service["metadata"]["name"]
    ports = []
    for port in service["spec"].get("ports") or []:
        number = next((n for n in (_target_port(port, p) for p in pods) if n is not None), None)
        if number is not None:
            ports.append(
                {"name": port.get("name", ""), "port": number, "protocol": port.get("protocol", "TCP")}
            )
    return {
        "metadata": {
            "name": f"{name}-run",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "gpufed-run",
            },
        },
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [
            {
                "addresses": [addresses[p.name]],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": p.node,
                "targetRef": {"kind": "Pod", "name": p.name, "namespace": namespace},
            }
            for p in pods
        ],
    }


def api_objects(
    objects: list[dict[str, Any]],
    pods: dict[str, Pod],
    addresses: dict[str, str],
    nodes: dict[str, str],
    *,
    namespace: str,
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) pairs for the stand-in, in the order they are applied."""
    out: list[tuple[str, dict[str, Any]]] = [("nodes", node_object(n, a)) for n, a in sorted(nodes.items())]
    for obj in objects:
        if obj.get("kind") == "ConfigMap":
            meta = {**obj["metadata"], "namespace": obj["metadata"].get("namespace", namespace)}
            out.append(("configmaps", {**obj, "metadata": meta}))
    out += [("pods", pod_object(p, addresses[p.name], namespace)) for _, p in sorted(pods.items())]
    for service in (o for o in objects if o.get("kind") == "Service"):
        selected = [p for _, p in sorted(pods.items()) if _selected(p, service["spec"].get("selector") or {})]
        if selected:
            out.append(("endpointslices", endpoint_slice(service, selected, addresses, namespace)))
    return out


def service_names(
    objects: list[dict[str, Any]], pods: dict[str, Pod], addresses: dict[str, str], *, namespace: str
) -> dict[str, str]:
    """Name -> address as cluster DNS would answer (one address per name: a hosts file's limit)."""
    names: dict[str, str] = {}
    for pod in pods.values():
        names[pod.name] = addresses[pod.name]
        if pod.subdomain:
            for suffix in (f".{namespace}.svc", f".{namespace}.svc.cluster.local"):
                names[f"{pod.name}.{pod.subdomain}{suffix}"] = addresses[pod.name]
    for service in (o for o in objects if o.get("kind") == "Service"):
        selected = [p for _, p in sorted(pods.items()) if _selected(p, service["spec"].get("selector") or {})]
        if not selected:
            continue
        name = service["metadata"]["name"]
        for full in (
            name,
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
        ):
            names[full] = addresses[selected[0].name]
    return names
