"""The **training jobs and quotas** dashboard: jobs, GPUs per job and node, quotas.

Sources: kube-state-metrics v2 (``kube_pod_owner``, ``kube_pod_status_phase``,
``kube_pod_start_time``, ``kube_pod_container_resource_requests`` and
``kube_node_status_allocatable``, whose ``resource`` label spells ``nvidia.com/gpu`` as
``nvidia_com_gpu``, ``kube_resourcequota``), the Kubeflow training-operator's counters
(``training_operator_jobs_*_total{job_namespace, framework}``), and ElasticQuota
(scheduler-plugins capacity scheduling) through kube-state-metrics' custom-resource-state
config in the README (``kube_customresource_elasticquota_{min,max,used}{resource}``).

A job is a pod's controlling owner (``owner_kind``/``owner_name``): a batch Job, or a
Kubeflow PyTorchJob/TFJob/MPIJob, which owns its pods directly. GPU use per job joins
the rule pack's per-GPU records (pod-attributed) to that owner on namespace and pod.
"""

from __future__ import annotations

from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable

NS = 'namespace=~"$namespace"'
GPU_REQ = f'resource="nvidia_com_gpu", {NS}'
OWNER = ('max by (namespace, pod, owner_kind, owner_name) '
         '(kube_pod_owner{owner_is_controller="true", '
         f'owner_kind!~"ReplicaSet|DaemonSet|Node|StatefulSet", {NS}}})')
BY_JOB = "namespace, owner_kind, owner_name"
QUOTA_RESOURCES = (r'(requests\\.|limits\\.)?'
                   r'(cpu|memory|nvidia\\.com/gpu|aliyun\\.com/gpu-mem|aliyun\\.com/gpu)')
NO_KSM = "Source: kube-state-metrics; no data without it."
NO_ATTRIBUTION = " No data when GPU series carry no pod labels (exporter pod attribution off)."


def of_job(expr: str) -> str:
    """A per-pod expression labelled with its pod's job (controlling owner)."""
    return f"({expr}) * on (namespace, pod) group_left (owner_kind, owner_name) {OWNER}"


def pods_in_phase(phase: str) -> str:
    return of_job(f'kube_pod_status_phase{{phase="{phase}", {NS}}} == 1')


def per_job_gpu(record: str) -> str:
    """One series per (job, GPU): the rule pack's record, HA copies already collapsed."""
    return of_job(f'max by (namespace, pod, node, gpu) ({record}{{pod!="", {NS}}})')


def training_dashboard() -> Dashboard:
    summary = Row("Job summary", (
        Panel("Running jobs", "stat", (Query(f"count(count by ({BY_JOB}) ({pods_in_phase('Running')}))",
                                             instant=True),),
              "Jobs with at least one Running pod. " + NO_KSM, width=6, height=5, no_value="0"),
        Panel("Pending jobs", "stat", (Query(f"count(count by ({BY_JOB}) ({pods_in_phase('Pending')}))",
                                             instant=True),),
              "Jobs with at least one Pending pod (waiting for GPUs or quota). " + NO_KSM, width=6, height=5,
              no_value="0"),
        Panel("Succeeded jobs", "stat", (Query(f'count(kube_job_complete{{condition="true", {NS}}} == 1)',
                                               instant=True),),
              "batch Jobs whose Complete condition is true. " + NO_KSM, width=6, height=5, no_value="0"),
        Panel("Failed jobs", "stat", (Query(f'count(kube_job_failed{{condition="true", {NS}}} == 1)',
                                            instant=True),),
              "batch Jobs whose Failed condition is true. " + NO_KSM, width=6, height=5, no_value="0",
              thresholds=(("green", None), ("red", 1))),
        Panel("Training-operator jobs (1h)", "timeseries", tuple(Query(
            f"sum by (framework) (increase(training_operator_jobs_{what}_total"
            '{job_namespace=~"$namespace"}[1h]))',
            f"{{{{framework}}}} {what}") for what in ("created", "successful", "failed", "restarted")),
              "Kubeflow training-operator counters per framework. No data without the operator.", width=24,
              height=6),
    ))
    jobs = Row("Jobs", (
        Panel("Job table", "table", (
            Query(f"count by ({BY_JOB}) ({pods_in_phase('Running')})", "running pods", instant=True),
            Query(f"count by ({BY_JOB}) ({pods_in_phase('Pending')})", "pending pods", instant=True),
            Query(f"sum by ({BY_JOB}) ({of_job(f'kube_pod_container_resource_requests{{{GPU_REQ}}}')})",
                  "GPUs requested", instant=True),
            Query(f"time() - min by ({BY_JOB}) ({of_job(f'kube_pod_start_time{{{NS}}}')})", "duration s",
                  instant=True),
        ), "One row per job: type (owner_kind), running and pending pods, GPUs requested, seconds since its "
           "first pod started. " + NO_KSM, width=24),
        Panel("GPU utilisation per job", "timeseries", (Query(
            f"avg by ({BY_JOB}) ({per_job_gpu('gpufed:gpu_utilization:percent')})", "{{owner_name}}"),),
            "Mean utilisation over the job's GPUs." + NO_ATTRIBUTION, unit="percent", min=0, max=100),
        Panel("GPU memory used per job", "timeseries", (Query(
            f"avg by ({BY_JOB}) ({per_job_gpu('gpufed:gpu_memory_used:ratio')})", "{{owner_name}}"),),
            "Mean share of framebuffer used on the job's GPUs." + NO_ATTRIBUTION, unit="percentunit", min=0,
            max=1),
    ))
    nodes = Row("Nodes", (
        Panel("Allocated vs allocatable GPUs per node", "table", (
            Query('sum by (node) (kube_pod_container_resource_requests{resource="nvidia_com_gpu", node!=""}'
                  ' and on '
                  '(namespace, pod) (kube_pod_status_phase{phase=~"Running|Pending"} == 1))', "allocated",
                  instant=True),
            Query('sum by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})', "allocatable",
                  instant=True),
        ), "GPUs requested by the node's Running and Pending pods against what it can allocate. " + NO_KSM,
            width=24),
    ))
    quotas = Row("Quotas", (
        Panel("ResourceQuota used vs hard", "table", tuple(Query(
            'max by (namespace, resource) '
            f'(kube_resourcequota{{resource=~"{QUOTA_RESOURCES}", type="{kind}", '
            f'{NS}}})', kind, instant=True) for kind in ("used", "hard")),
            "cpu, memory, nvidia.com/gpu, aliyun.com/gpu-mem and aliyun.com/gpu (with requests./limits.) per "
            "namespace. " + NO_KSM, width=12),
        Panel("ElasticQuota min, max and used", "table", tuple(Query(
            f'max by (namespace, name, resource) (kube_customresource_elasticquota_{kind}{{{NS}}})', kind,
            instant=True) for kind in ("min", "max", "used")),
            "scheduler-plugins ElasticQuota spec.min/spec.max/status.used, exposed by kube-state-metrics' "
            "custom-resource-state config in the README. No data without it.", width=12),
    ))
    return Dashboard(
        uid="gpufed-training", title="gpufed / Training jobs and quotas",
        description="Jobs (batch and Kubeflow), GPUs per job and node, and quotas with min, max and used.",
        tags=("gpufed", "gpu", "kubernetes"),
        variables=(Variable("namespace", "Namespace", "kube_pod_owner"),),
        rows=(summary, jobs, nodes, quotas),
    )
