"""The workload dashboards: **training job / pod** (GPU use per pod and namespace) and
**quota** (namespace GPU quota used vs limit).

Pod attribution: gpufed-exporter (and dcgm-exporter in Kubernetes mode) add
``namespace``/``pod``/``container`` to a GPU's series when a pod holds it; series
without a pod carry no such label, so ``pod!=""`` selects attributed GPUs. HAMi's
records (rules/hami.yml) spell them ``namespace``/``pod`` whichever HAMi version (v2.9+
names or the legacy ``--legacy-metrics`` ones) sent the series; kube-state-metrics' ResourceQuota
series use ``namespace``/``resource``/``type``. Quota sources are optional: each panel
says what it shows when its source is not scraped.

Every sum or count first collapses copies of one series: HA children differ in
``replica``, and during a make-before-break hand-over the old and the new shard's
children both scrape a target, so its series differ in ``shard`` too. ``max by`` the
labels that name a GPU or pod does that where they are known (``per_pod_gpu``);
``dedup`` (``max without (shard, replica)``) does it for third-party series whose
identifying labels vary (HAMi, kube-state-metrics).
"""

from __future__ import annotations

from federation.dashboards import dcgm
from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable

MIB = 1048576
POD_SEL = 'region=~"$region", namespace=~"$namespace", pod=~"$pod", pod!=""'
NS_SEL = 'region=~"$region", namespace=~"$namespace", pod!=""'
NS_GPUS = dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", NS_SEL)  # attributed GPUs under 3.x or 4.x names
# HAMi panels read hami.yml's gpufed:hami_* records: HAMi v2.9+ and legacy names in one
# spelling (v2.9's labels namespace/pod/container/node/device_uuid), each series once.
HAMI_POD = 'namespace=~"$namespace", pod=~"$pod"'
HAMI_NS = 'namespace=~"$namespace"'
REGION = 'region=~"$region"'
HAMI_PROFILE = 'profile="hami-scheduler"'
STEP_SECONDS = "scheduler_framework_extension_point_duration_seconds_bucket"
QUOTA = r'resource=~".*nvidia\\.com/.*", namespace=~"$namespace"'
QUOTA_USED = QUOTA + ', type="used"'
QUOTA_HARD = QUOTA + ', type="hard"'
NO_ATTRIBUTION = ("No data means no GPU series carries pod labels: the exporter's pod attribution "
                  "is off (the default) or no pod holds a GPU.")
NO_HAMI = ("Source: HAMi ({what}). Without HAMi these panels show no data; the 'Without a "
           "scheduler' row still shows GPU use per namespace from pod attribution.")
NO_KSM = ("Source: kube-state-metrics `kube_resourcequota` for resources matching nvidia.com/ "
          "(e.g. requests.nvidia.com/gpu). Without kube-state-metrics or a GPU ResourceQuota this "
          "panel shows no data.")


def per_pod_gpu(metric: str, selector: str) -> str:
    """One series per (pod, GPU): HA replica and hand-over copies collapsed."""
    return f"max by (namespace, pod, container, node, gpu) ({dcgm.metric(metric, selector)})"


def dedup(metric: str, selector: str) -> str:
    """One series per source series: HA replica and hand-over copies collapsed."""
    return f"max without (shard, replica) ({dcgm.metric(metric, selector)})"


def pod_dashboard() -> Dashboard:
    namespaces = Row("Namespaces", (
        Panel("Attributed GPUs", "stat", (Query(
            f"count(group by (node, gpu) ({NS_GPUS}))", instant=True),),
            "GPUs held by pods in the chosen namespaces. " + NO_ATTRIBUTION, width=4, height=8,
            no_value="0"),
        Panel("GPUs per namespace", "timeseries", (Query(
            f"count by (namespace) (group by (namespace, node, gpu) ({NS_GPUS}))",
            "{{namespace}}"),), "GPUs held by each namespace's pods. " + NO_ATTRIBUTION, width=6,
            stacked=True),
        Panel("GPU memory per namespace", "timeseries", (Query(
            f"sum by (namespace) ({per_pod_gpu('DCGM_FI_DEV_FB_USED', NS_SEL)}) * {MIB}", "{{namespace}}"),),
            "Framebuffer used on GPUs held by each namespace. " + NO_ATTRIBUTION, unit="bytes", width=7,
            stacked=True),
        Panel("GPU utilisation per namespace", "timeseries", (Query(
            f"avg by (namespace) ({per_pod_gpu('DCGM_FI_DEV_GPU_UTIL', NS_SEL)})", "{{namespace}}"),),
            "Mean utilisation of the GPUs each namespace holds. " + NO_ATTRIBUTION, unit="percent",
            min=0, max=100, width=7),
    ))
    pods = Row("Pods", (
        Panel("GPU utilisation per pod", "timeseries", (Query(
            f"avg by (namespace, pod) ({per_pod_gpu('DCGM_FI_DEV_GPU_UTIL', POD_SEL)})",
            "{{namespace}}/{{pod}}"),), "Mean utilisation over the pod's GPUs. " + NO_ATTRIBUTION,
            unit="percent", min=0, max=100, legend_table=True),
        Panel("GPU memory per pod", "timeseries", (Query(
            f"sum by (namespace, pod) ({per_pod_gpu('DCGM_FI_DEV_FB_USED', POD_SEL)}) * {MIB}",
            "{{namespace}}/{{pod}}"),), "Framebuffer used over the pod's GPUs. " + NO_ATTRIBUTION,
            unit="bytes", legend_table=True),
        Panel("Pods on GPUs", "table", (
            Query(per_pod_gpu("DCGM_FI_DEV_GPU_UTIL", POD_SEL), "util %", instant=True),
            Query(f"{per_pod_gpu('DCGM_FI_DEV_FB_USED', POD_SEL)} * {MIB}", "memory", instant=True),
            Query(per_pod_gpu("DCGM_FI_DEV_POWER_USAGE", POD_SEL), "power W", instant=True),
        ), "Each (pod, container, node, GPU) with utilisation, framebuffer used (bytes) and power. "
           + NO_ATTRIBUTION, width=24),
        Panel("GPU power per pod", "timeseries", (Query(
            f"sum by (namespace, pod) ({per_pod_gpu('DCGM_FI_DEV_POWER_USAGE', POD_SEL)})",
            "{{namespace}}/{{pod}}"),), "Board power of the pod's GPUs. " + NO_ATTRIBUTION, unit="watt"),
        Panel("GPU memory per process", "timeseries", (Query(
            f"max by (namespace, pod, node, gpu, pid) (gpufed_gpu_process_memory_used_bytes{{{POD_SEL}}})",
            "{{namespace}}/{{pod}} pid {{pid}} ({{node}} GPU {{gpu}})"),),
            "gpufed-exporter family `process` (opt-in): GPU memory per process. No data when the "
            "family is off. " + NO_ATTRIBUTION, unit="bytes"),
    ))
    hami = Row("HAMi vGPU containers", (
        Panel("vGPU memory used vs limit", "timeseries", (
            Query(f"sum by (namespace, pod) (gpufed:hami_vgpu_memory_used:bytes{{{HAMI_POD}}})",
                  "{{namespace}}/{{pod}} used"),
            Query(f"sum by (namespace, pod) (gpufed:hami_vgpu_memory_limit:bytes{{{HAMI_POD}}})",
                  "{{namespace}}/{{pod}} limit"),
        ), "Recording rules gpufed:hami_vgpu_memory_{used,limit}:bytes (hami_vgpu_memory_*_bytes, "
           "legacy vGPU_device_memory_*_in_bytes). " + NO_HAMI.format(what="vGPU monitor"), unit="bytes"),
        Panel("vGPU memory used % of limit", "timeseries", (Query(
            "max by (namespace, pod, container) "
            f"(gpufed:vgpu_container_memory_used:ratio{{{HAMI_POD}}})",
            "{{namespace}}/{{pod}}/{{container}}"),),
            "Recording rule gpufed:vgpu_container_memory_used:ratio. "
            + NO_HAMI.format(what="vGPU monitor"), unit="percentunit", min=0, max=1),
    ))
    return Dashboard(
        uid="gpufed-workloads", title="gpufed / Training jobs and pods",
        description="GPU utilisation and memory per pod and namespace, where pods are attributed to GPUs.",
        tags=("gpufed", "gpu", "kubernetes"),
        variables=(
            Variable("region", "Region", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL")),
            Variable("namespace", "Namespace",
                     dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", 'region=~"$region", pod!=""')),
            Variable("pod", "Pod", dcgm.any_name(
                "DCGM_FI_DEV_GPU_UTIL", 'region=~"$region", namespace=~"$namespace", pod!=""')),
        ),
        rows=(namespaces, pods, hami),
    )


# Namespaces from every source that knows one: quotas, HAMi allocations, attributed GPUs.
NAMESPACE_UNION = (
    'count by (namespace) (kube_resourcequota{resource=~".*nvidia\\\\.com/.*"})'
    ' or count by (namespace) (gpufed:hami_vgpu_memory_allocated:bytes)'
    ' or count by (namespace) (' + dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", 'pod!=""') + ')'
)


def quota_dashboard() -> Dashboard:
    ksm = Row("Namespace GPU quota (Kubernetes ResourceQuota)", (
        Panel("GPU quota used vs hard limit", "timeseries", (
            Query(f"sum by (namespace, resource) ({dedup('kube_resourcequota', QUOTA_USED)})",
                  "{{namespace}} {{resource}} used"),
            Query(f"sum by (namespace, resource) ({dedup('kube_resourcequota', QUOTA_HARD)})",
                  "{{namespace}} {{resource}} hard"),
        ), NO_KSM, width=12),
        Panel("GPU quota used %", "bargauge", (Query(
            f"sum by (namespace, resource) ({dedup('kube_resourcequota', QUOTA_USED)})"
            f" / sum by (namespace, resource) ({dedup('kube_resourcequota', QUOTA_HARD)} > 0)",
            "{{namespace}} {{resource}}", instant=True),), NO_KSM, unit="percentunit", min=0, max=1,
            width=12, thresholds=(("green", None), ("orange", 0.8), ("red", 0.95))),
    ))
    hami = Row("HAMi scheduler", (
        Panel("HAMi quota used (limit in the limit column)", "table", (Query(
            "max by (namespace, quota_name, limit) "
            '(gpufed:hami_resource_quota_used{namespace=~"$namespace"})',
            instant=True),),
            "HAMi scheduler's hami_resource_quota_used (legacy QuotaUsed), recording rule "
            "gpufed:hami_resource_quota_used: the value is what the namespace uses, the `limit` label is its "
            "ResourceQuota limit (HAMi exports the limit as a label, not a series). "
            + NO_HAMI.format(what="scheduler, port 31993"), width=12),
        Panel("vGPU allocated per namespace", "timeseries", (
            Query(f"sum by (namespace) (gpufed:hami_vgpu_memory_allocated:bytes{{{HAMI_NS}}})",
                  "{{namespace}} memory"),
        ), "GPU memory HAMi allocated to each namespace's containers (hami_vgpu_memory_allocated_bytes, "
           "legacy vGPUMemoryAllocated; recording rule gpufed:hami_vgpu_memory_allocated:bytes). "
           + NO_HAMI.format(what="scheduler"), unit="bytes", width=12, stacked=True),
        Panel("GPU memory allocated by region", "timeseries", (Query(
            'gpufed:region_gpu_memory_allocated:ratio{region=~"$region"}', "{{cluster}}/{{region}}"),),
            "Recording rule gpufed:region_gpu_memory_allocated:ratio (hami_gpu_memory_allocated_bytes / "
            "hami_gpu_memory_limit_bytes, legacy GPUDeviceMemory*). " + NO_HAMI.format(what="scheduler"),
            unit="percentunit", min=0, max=1, width=8),
        Panel("GPU memory allocated vs limit per node", "timeseries", (
            Query(f"sum by (node) (gpufed:hami_gpu_memory_allocated:bytes{{{REGION}}})",
                  "{{node}} allocated"),
            Query(f"sum by (node) (gpufed:hami_gpu_memory_limit:bytes{{{REGION}}})", "{{node}} limit"),
        ), "Recording rules gpufed:hami_gpu_memory_{allocated,limit}:bytes (hami_gpu_memory_*_bytes, "
           "legacy GPUDeviceMemory*). " + NO_HAMI.format(what="scheduler"), unit="bytes", width=8),
        Panel("Containers sharing a GPU", "timeseries", (Query(
            'topk(20, max by (node, device_index) (gpufed:hami_gpu_shared:count{region=~"$region"}))',
            "{{node}} GPU {{device_index}}"),), "Top 20 GPUs by containers sharing them "
            "(hami_gpu_shared_count, legacy GPUDeviceSharedNum). " + NO_HAMI.format(what="scheduler"),
            width=8),
        Panel("HAMi scheduler latency (Filter, Score, Bind)", "timeseries", tuple(Query(
            "histogram_quantile(0.99, sum by (le, extension_point) (max without (shard, replica) (rate("
            f"{STEP_SECONDS}{{{HAMI_PROFILE}, extension_point=\"{point}\", "
            'region=~"$region"}[$__rate_interval]))))', f"{point} p99")
            for point in ("Filter", "Score", "Bind")),
            "99th percentile per scheduling step of the kube-scheduler that HAMi's scheduler pod runs (its "
            "profile `hami-scheduler`, the HAMi chart's schedulerName): "
            "scheduler_framework_extension_point_duration_seconds{extension_point, profile}. The step "
            "covers the framework's plugins; HAMi's extender calls (filter, bind over HTTP) add to the pod's "
            "attempt time. No data without a scrape job for that kube-scheduler's /metrics.", unit="s",
            width=24, height=6),
        Panel("Scheduling failures", "timeseries", (Query(
            'gpufed:scheduler_failures:ratio_rate10m{region=~"$region"}', "{{region}} {{profile}}"),),
            "Recording rule gpufed:scheduler_failures:ratio_rate10m: share of kube-scheduler attempts "
            "ending unschedulable or in error. No data without kube-scheduler metrics.",
            unit="percentunit", min=0, max=1, width=24, height=6),
    ))
    usage = Row("Without a scheduler: GPU use per namespace (pod attribution)", (
        Panel("GPUs in use per namespace", "timeseries", (Query(
            f"count by (namespace) (group by (namespace, node, gpu) ({NS_GPUS}))",
            "{{namespace}}"),), "Use only (no limit): GPUs whose series carry the namespace's pod "
            "labels. Shows with neither HAMi nor kube-state-metrics. " + NO_ATTRIBUTION, width=8,
            stacked=True),
        Panel("GPU memory in use per namespace", "timeseries", (Query(
            f"sum by (namespace) (max by (namespace, node, gpu)"
            f" ({dcgm.metric('DCGM_FI_DEV_FB_USED', NS_SEL)})) * {MIB}",
            "{{namespace}}"),), "Framebuffer used on the namespace's GPUs. " + NO_ATTRIBUTION,
            unit="bytes", width=8, stacked=True),
        Panel("HAMi-format GPU memory per node", "timeseries", (Query(
            "sum by (node) (max by (node, device_uuid) "
            '(gpufed:hami_host_gpu_memory_used:bytes{region=~"$region"}))', "{{node}}"),),
            "HAMi's vGPU monitor host series hami_host_gpu_memory_used_bytes (legacy HostGPUMemoryUsage; "
            "recording rule gpufed:hami_host_gpu_memory_used:bytes). gpufed-exporter writes it too "
            "(family `hami`, on by default, with HAMi's labels), so this works without HAMi's device "
            "monitor.",
            unit="bytes", width=8),
    ))
    return Dashboard(
        uid="gpufed-quota", title="gpufed / GPU quota",
        description="Namespace GPU quota used vs limit (kube-state-metrics ResourceQuota, HAMi) and "
                    "GPU use per namespace where no quota source exists.",
        tags=("gpufed", "gpu", "kubernetes"),
        variables=(
            Variable("region", "Region", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL")),
            Variable("namespace", "Namespace", NAMESPACE_UNION, union=True),
        ),
        rows=(ksm, hami, usage),
    )
