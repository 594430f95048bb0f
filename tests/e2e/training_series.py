"""Realistic exposition for the training and distributed dashboards, served on loopback.

One cluster as kube-state-metrics v2, dcgm-exporter (with pod attribution; its default
per-GPU NVLink fields), gpufed's per-link ``nvlink`` family (link state), the Kubeflow
training-operator and an ElasticQuota custom-resource-state
config would expose it: a PyTorchJob ``llama-ft`` (2 pods x 4 GPUs on gpu-node-1, GPU 6 a
straggler at 30% against 95%), a running batch Job ``eval-nightly`` (1 GPU on gpu-node-2),
a Pending PyTorchJob ``bert-pt`` (4 GPUs requested, no node), a completed and a failed
Job, a notebook ``nb-share`` on ACK GPU sharing (``aliyun.com/gpu-mem`` 12 GiB on
gpu-node-3), quotas in ``training``. Counters grow with time so rates are non-zero.

Nodes, as kube-state-metrics v2 writes them (docs/metrics/cluster/node-metrics.md and
workload/pod-metrics.md): ``kube_node_info`` (``internal_ip`` among its labels),
``kube_node_role``, ``kube_node_status_condition{condition, status}``,
``kube_node_status_capacity``/``_allocatable{resource, unit}`` and ``kube_pod_info``.
gpu-node-1 and -2 are exclusive (8 x ``nvidia_com_gpu``), gpu-node-3 shares its GPUs
(``aliyun_com_gpu_mem``: 4 x 80 GiB) and is NotReady; cpu-node-1 has no GPU and a role.
"""

from __future__ import annotations

import time

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer

NS = "training"
# pod -> (owner kind, owner name, node, phase, GPUs requested)
PODS = {
    "llama-ft-master-0": ("PyTorchJob", "llama-ft", "gpu-node-1", "Running", 4),
    "llama-ft-worker-0": ("PyTorchJob", "llama-ft", "gpu-node-1", "Running", 4),
    "eval-nightly-x7k2p": ("Job", "eval-nightly", "gpu-node-2", "Running", 1),
    "bert-pt-worker-0": ("PyTorchJob", "bert-pt", "", "Pending", 4),
    "data-prep-q9s8d": ("Job", "data-prep", "gpu-node-2", "Succeeded", 0),
    "broken-m2n4b": ("Job", "broken", "gpu-node-2", "Failed", 1),
    "nb-share-0": ("Notebook", "nb-share", "gpu-node-3", "Running", 0),
}
# pod -> ACK GPU sharing request (aliyun.com/gpu-mem, GiB)
GPU_MEM = {"nb-share-0": 12}
# node -> (internal IP, role or "", Ready, resource -> capacity)
NODES = {
    "gpu-node-1": ("10.0.1.11", "", True, {"nvidia_com_gpu": 8, "cpu": 96}),
    "gpu-node-2": ("10.0.1.12", "", True, {"nvidia_com_gpu": 8, "cpu": 96}),
    "gpu-node-3": ("10.0.1.13", "", False,
                   {"aliyun_com_gpu_mem": 320, "aliyun_com_gpu_count": 4, "cpu": 64}),
    "cpu-node-1": ("10.0.1.21", "control-plane", True, {"cpu": 16}),
}
# (node, gpu) -> pod holding it
GPUS = {("gpu-node-1", g): ("llama-ft-master-0" if g < 4 else "llama-ft-worker-0") for g in range(8)}
GPUS[("gpu-node-2", 0)] = "eval-nightly-x7k2p"
GPUS[("gpu-node-2", 1)] = ""
GPUS[("gpu-node-3", 0)] = "nb-share-0"
STRAGGLER = ("gpu-node-1", 6)
LINK_DOWN = ("gpu-node-1", 5, 3)


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _condition(condition: str, holds: int) -> int:
    """kube-state-metrics' condition gauges: 1 on the label matching the state."""
    return int((condition == "true" and bool(holds)) or (condition == "false" and not holds))


def exposition(elapsed: float) -> str:
    lines: list[str] = []
    add = lines.append
    for pod, (kind, owner, node, phase, gpus) in PODS.items():
        ids = {"namespace": NS, "pod": pod, "uid": pod}
        owner_labels = _labels(**ids, owner_kind=kind, owner_name=owner, owner_is_controller="true")
        add(f"kube_pod_owner{owner_labels} 1")
        for each in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            add(f"kube_pod_status_phase{_labels(**ids, phase=each)} {int(each == phase)}")
        add(f"kube_pod_start_time{_labels(**ids)} {time.time() - 3600:.0f}")
        info = {**ids, "host_ip": NODES[node][0] if node else "", "pod_ip": "", "node": node,
                "created_by_kind": kind, "created_by_name": owner, "priority_class": "",
                "host_network": "false"}
        add(f"kube_pod_info{_labels(**info)} 1")
        if gpus:
            request = _labels(**ids, container="main", node=node, resource="nvidia_com_gpu", unit="integer")
            add(f"kube_pod_container_resource_requests{request} {gpus}")
        if pod in GPU_MEM:
            request = _labels(**ids, container="main", node=node, resource="aliyun_com_gpu_mem",
                              unit="integer")
            add(f"kube_pod_container_resource_requests{request} {GPU_MEM[pod]}")
    jobs = (("eval-nightly", 0, 0, 1), ("data-prep", 1, 0, 0), ("broken", 0, 1, 0))
    for job, complete, failed, active in jobs:
        for condition in ("true", "false", "unknown"):
            at = _labels(namespace=NS, job_name=job, condition=condition)
            add(f"kube_job_complete{at} {_condition(condition, complete)}")
            add(f"kube_job_failed{at} {_condition(condition, failed)}")
        add(f"kube_job_status_active{_labels(namespace=NS, job_name=job)} {active}")
    for node, (ip, role, ready, resources) in NODES.items():
        info = {"node": node, "kernel_version": "5.10.134", "os_image": "Alibaba Cloud Linux 3",
                "container_runtime_version": "containerd://1.6.28", "kubelet_version": "v1.30.1",
                "kubeproxy_version": "deprecated", "pod_cidr": "", "provider_id": "", "system_uuid": node,
                "internal_ip": ip}
        add(f"kube_node_info{_labels(**info)} 1")
        if role:
            add(f"kube_node_role{_labels(node=node, role=role)} 1")
        for status in ("true", "false", "unknown"):
            add(f"kube_node_status_condition{_labels(node=node, condition='Ready', status=status)} "
                f"{_condition(status, int(ready))}")
        for resource, amount in resources.items():
            unit = "core" if resource == "cpu" else "integer"
            for kind in ("capacity", "allocatable"):
                add(f"kube_node_status_{kind}{_labels(node=node, resource=resource, unit=unit)} {amount}")
    quota = {"requests.cpu": (64, 41), "requests.memory": (512 * 2**30, 300 * 2**30),
             "requests.nvidia.com/gpu": (16, 9), "requests.aliyun.com/gpu-mem": (320, 80),
             "requests.aliyun.com/gpu": (4, 1)}
    for resource, (hard, used) in quota.items():
        for kind, value in (("hard", hard), ("used", used)):
            at = _labels(namespace=NS, resourcequota="gpu-quota", resource=resource, type=kind)
            add(f"kube_resourcequota{at} {value}")
    elastic = (("min", {"cpu": 32, "nvidia.com/gpu": 8}), ("max", {"cpu": 96, "nvidia.com/gpu": 24}),
               ("used", {"cpu": 41, "nvidia.com/gpu": 9}))
    for kind, values in elastic:
        for resource, value in values.items():
            add(f"kube_customresource_elasticquota_{kind}" + _labels(
                customresource_group="scheduling.x-k8s.io", customresource_kind="ElasticQuota",
                customresource_version="v1alpha1", namespace=NS, name="training",
                resource=resource) + f" {value}")
    for what, total in (("created", 12), ("successful", 7), ("failed", 2), ("restarted", 3)):
        add(f"training_operator_jobs_{what}_total{_labels(job_namespace=NS, framework='pytorch')} "
            f"{total + elapsed / 10:.3f}")
    for (node, gpu), pod in GPUS.items():
        who = {"namespace": NS, "pod": pod, "container": "main"} if pod else {}
        base = {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "Hostname": node,
                "modelName": "NVIDIA H100 80GB HBM3", **who}
        util = 30 if (node, gpu) == STRAGGLER else 95 if pod else 0
        add(f"DCGM_FI_DEV_GPU_UTIL{_labels(**base)} {util}")
        add(f"DCGM_FI_DEV_FB_USED{_labels(**base)} {60000 if pod else 0}")
        add(f"DCGM_FI_DEV_FB_FREE{_labels(**base)} {21559 if pod else 81559}")
        if node != "gpu-node-1":
            continue
        # 4 links per GPU at 2 GB/s TX, 1.9 GB/s RX; GPU 5's links each see 1 CRC error/s of
        # each kind, 0.5 replays/s and 0.25 recoveries/s (whole counts)
        add(f"DCGM_FI_PROF_NVLINK_TX_BYTES{_labels(**base)} {4 * 2e9:.0f}")
        add(f"DCGM_FI_PROF_NVLINK_RX_BYTES{_labels(**base)} {4 * 1.9e9:.0f}")
        add(f"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{_labels(**base)} {4 * 3.9e9 * elapsed / 1024:.0f}")
        bad = 4 * elapsed * (gpu == 5)
        add(f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{_labels(**base)} {bad:.0f}")
        add(f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{_labels(**base)} {bad:.0f}")
        add(f"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{_labels(**base)} {bad / 2:.0f}")
        add(f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{_labels(**base)} {bad / 4:.0f}")
        for link in range(4):
            at = {**base, "link": str(link)}
            add(f"gpufed_nvlink_link_up{_labels(**at)} {int((node, gpu, link) != LINK_DOWN)}")
    return "\n".join(lines) + "\n"


class SeriesServer:
    """``GET /metrics`` answers ``exposition(seconds since start)``; a context manager."""

    def __init__(self) -> None:
        started = time.monotonic()

        class Handler(LoopbackHandler):
            def do_GET(self) -> None:
                body = exposition(time.monotonic() - started)
                self.reply(200, body, content_type="text/plain; version=0.0.4")

        self.server = LoopbackHTTPServer(Handler, name="training-series")
        self.port = self.server.port

    def __enter__(self) -> SeriesServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
