"""HAMi-format exposition for the dashboard e2e, served on loopback as one scrape target.

What a HAMi v2.10 install sends by default (Project-HAMi/HAMi v2.10.0, commit 4707fb02,
``cmd/scheduler/metrics.go`` and ``cmd/vGPUmonitor/metrics.go``): the v2.9+ names
(``hami_vgpu_memory_*``, ``hami_gpu_*``, ``hami_resource_quota_used``, ...) for every
container, GPU and quota, so each HAMi panel must return data on them. The first container,
GPU 0 and the ``training`` quota are also sent under the legacy names with the same values,
as ``--legacy-metrics`` adds them: the rule pack's ``gpufed:hami_*`` records must count them
once (``LEGACY_TOO``). The target carries ``node``, so HAMi's own ``node`` label arrives as
``exported_node``, as from a pod-discovered HAMi scheduler. Also the kube-scheduler inside
HAMi's scheduler pod (profile ``hami-scheduler``, the chart's schedulerName):
``scheduler_framework_extension_point_duration_seconds`` (histogram, labels
extension_point/status/profile, buckets 0.1 ms x 2^0..11) and
``scheduler_schedule_attempts_total{result, profile}``. The vGPU containers are the
attributed node's pods (namespace ``training``, pod ``llm-pretrain-0``); counters grow with
time so rates are non-zero.
"""

from __future__ import annotations

import time

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer

NODE = "gpu-region-0-attributed"
CONTAINERS = (("training", "llm-pretrain-0", "main", 0), ("training", "llm-pretrain-0", "main", 1),
              ("inference", "chat-api-0", "server", 4))
GIB = 2**30
BUCKETS = [0.0001 * 2**k for k in range(12)]
QUOTA_USED = {"training": 80 * GIB, "inference": 40 * GIB}
#: sent under both spellings: container 0, GPU 0 and the training quota
LEGACY_TOO = {"container": CONTAINERS[0], "gpu": 0, "quota": "training"}
STEP = "scheduler_framework_extension_point_duration_seconds"
#: extension point -> (attempts per second, seconds each)
STEPS = {"Filter": (4.0, 0.0015), "Score": (4.0, 0.0004), "Bind": (2.0, 0.012)}


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(elapsed: float) -> str:
    lines: list[str] = []
    add = lines.append
    held: dict[tuple[str, str, str], int] = {}
    for n, (namespace, pod, container, gpu) in enumerate(CONTAINERS):
        uuid = f"GPU-{NODE}-{gpu}"
        vdevice = held[namespace, pod, container] = held.get((namespace, pod, container), -1) + 1
        ids = {"namespace": namespace, "pod": pod, "container": container, "vdevice_index": str(vdevice),
               "device_uuid": uuid}
        add(f"hami_vgpu_memory_used_bytes{_labels(**ids)} {30 * GIB}")
        add(f"hami_vgpu_memory_limit_bytes{_labels(**ids)} {40 * GIB}")
        add(f"hami_container_last_kernel_elapsed_seconds{_labels(**ids)} {int(5 + elapsed) % 60}")
        alloc = {"namespace": namespace, "node": NODE, "pod": pod, "container_index": "0",
                 "device_uuid": uuid}
        add(f"hami_vgpu_memory_allocated_bytes{_labels(**alloc)} {40 * GIB}")
        if n == 0:
            old = {"podnamespace": namespace, "podname": pod, "ctrname": container, "vdeviceid": "0",
                   "deviceuuid": uuid}
            add(f"vGPU_device_memory_usage_in_bytes{_labels(**old)} {30 * GIB}")
            add(f"vGPU_device_memory_limit_in_bytes{_labels(**old)} {40 * GIB}")
            add(f"Device_last_kernel_of_container{_labels(**old)} {int(5 + elapsed) % 60}")
            old_alloc = {"podnamespace": namespace, "nodename": NODE, "podname": pod,
                         "containeridx": "0", "deviceuuid": uuid}
            add(f"vGPUMemoryAllocated{_labels(**old_alloc)} {40 * GIB}")
    for gpu in (0, 1, 4):
        dev = {"node": NODE, "device_uuid": f"GPU-{NODE}-{gpu}", "device_index": str(gpu),
               "device_type": "NVIDIA"}
        add(f"hami_gpu_memory_allocated_bytes{_labels(**dev, device_cores='100')} {40 * GIB}")
        add(f"hami_gpu_memory_limit_bytes{_labels(**dev)} {80 * GIB}")
        add(f"hami_gpu_shared_count{_labels(**dev)} {2 if gpu == 0 else 1}")
        if gpu == 0:
            old_dev = {"nodeid": NODE, "deviceuuid": f"GPU-{NODE}-{gpu}", "deviceidx": str(gpu),
                       "devicetype": "NVIDIA"}
            add(f"GPUDeviceMemoryAllocated{_labels(**old_dev, devicecores='100')} {40 * GIB}")
            add(f"GPUDeviceMemoryLimit{_labels(**old_dev)} {80 * GIB}")
            add(f"GPUDeviceSharedNum{_labels(**old_dev)} 2")
    for namespace, used in QUOTA_USED.items():
        quota = _labels(namespace=namespace, quota_name="nvidia.com/gpumem", limit=str(160 * GIB))
        add(f"hami_resource_quota_used{quota} {used}")
        if namespace == "training":
            old_quota = _labels(quotanamespace=namespace, quotaName="nvidia.com/gpumem", limit=str(160 * GIB))
            add(f"QuotaUsed{old_quota} {used}")
    for point, (per_s, seconds) in STEPS.items():
        count = int(per_s * (60 + elapsed))
        base = {"extension_point": point, "status": "Success", "profile": "hami-scheduler"}
        for le in BUCKETS:
            add(f"{STEP}_bucket{_labels(**base, le=repr(le))} {count if seconds <= le else 0}")
        add(f"{STEP}_bucket{_labels(**base, le='+Inf')} {count}")
        add(f"{STEP}_sum{_labels(**base)} {count * seconds:.6f}")
        add(f"{STEP}_count{_labels(**base)} {count}")
    for result, per_s in (("scheduled", 2.0), ("unschedulable", 0.5)):
        add(f"scheduler_schedule_attempts_total{_labels(result=result, profile='hami-scheduler')} "
            f"{int(per_s * (60 + elapsed))}")
    return "\n".join(lines) + "\n"


class HamiSeries:
    """``GET /metrics`` answers ``exposition(seconds since start)``; a context manager."""

    def __init__(self) -> None:
        started = time.monotonic()

        class Handler(LoopbackHandler):
            def do_GET(self) -> None:
                body = exposition(time.monotonic() - started)
                self.reply(200, body, content_type="text/plain; version=0.0.4")

        self.server = LoopbackHTTPServer(Handler, name="hami-series")
        self.port = self.server.port

    def __enter__(self) -> HamiSeries:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
