"""HAMi-format exposition for the dashboard e2e, served on loopback as one scrape target.

What a HAMi install sends (Project-HAMi/HAMi v2.10, ``cmd/scheduler/metrics.go`` and
``cmd/vGPUmonitor/metrics.go`` with ``--legacy-metrics``, the names the shipped panels
read), and the kube-scheduler inside HAMi's scheduler pod (profile ``hami-scheduler``,
the chart's schedulerName): ``scheduler_framework_extension_point_duration_seconds``
(histogram, labels extension_point/status/profile, buckets 0.1 ms x 2^0..11) and
``scheduler_schedule_attempts_total{result, profile}``. The vGPU containers are the
attributed node's pods (namespace ``training``, pod ``llm-pretrain-0``); counters grow with
time so rates are non-zero.
"""

from __future__ import annotations

import time

from federation.demo.loopback import LoopbackHandler, LoopbackHTTPServer

NODE = "gpu-region-0-attributed"
CONTAINERS = (("training", "llm-pretrain-0", "main", 0), ("training", "llm-pretrain-0", "main", 1),
              ("inference", "chat-api-0", "server", 4))
GIB = 2**30
BUCKETS = [0.0001 * 2**k for k in range(12)]
STEP = "scheduler_framework_extension_point_duration_seconds"
#: extension point -> (attempts per second, seconds each)
STEPS = {"Filter": (4.0, 0.0015), "Score": (4.0, 0.0004), "Bind": (2.0, 0.012)}


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(elapsed: float) -> str:
    lines: list[str] = []
    add = lines.append
    for namespace, pod, container, gpu in CONTAINERS:
        ids = {"podnamespace": namespace, "podname": pod, "ctrname": container, "vdeviceid": "0",
               "deviceuuid": f"GPU-{NODE}-{gpu}"}
        add(f"vGPU_device_memory_usage_in_bytes{_labels(**ids)} {30 * GIB}")
        add(f"vGPU_device_memory_limit_in_bytes{_labels(**ids)} {40 * GIB}")
        add(f"Device_last_kernel_of_container{_labels(**ids)} {int(5 + elapsed) % 60}")
        alloc = {"deviceuuid": f"GPU-{NODE}-{gpu}", "nodename": NODE, "podnamespace": namespace,
                 "podname": pod, "containeridx": "0", "deviceusedcore": "50"}
        add(f"vGPUMemoryAllocated{_labels(**alloc)} {40 * GIB}")
    for gpu in (0, 1, 4):
        dev = {"nodeid": NODE, "deviceuuid": f"GPU-{NODE}-{gpu}", "deviceidx": str(gpu)}
        add(f"GPUDeviceMemoryAllocated{_labels(**dev)} {40 * GIB}")
        add(f"GPUDeviceMemoryLimit{_labels(**dev)} {80 * GIB}")
        add(f"GPUDeviceSharedNum{_labels(**dev)} {2 if gpu == 0 else 1}")
    for namespace, used in (("training", 80 * GIB), ("inference", 40 * GIB)):
        quota = _labels(quotanamespace=namespace, quotaName="nvidia.com/gpumem", limit=str(160 * GIB))
        add(f"QuotaUsed{quota} {used}")
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
