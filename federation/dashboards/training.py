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
ACK's filters: ``$job_namespace``, ``$job_type`` (the owner kind) and ``$job_name``.

The GPU node table reads kube-state-metrics' node series (``kube_node_info`` for the
internal IP, ``kube_node_role``, ``kube_node_status_condition{condition="Ready"}``,
``kube_node_status_capacity``/``_allocatable``). A node is *shared* when it advertises
ACK's GPU-sharing resource ``aliyun.com/gpu-mem`` (GiB; kube-state-metrics spells it
``aliyun_com_gpu_mem``), else *exclusive* (whole ``nvidia.com/gpu`` devices).
"""

from __future__ import annotations

from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable

NS = 'namespace=~"$namespace"'
JOB_NS = 'namespace=~"$job_namespace"'
JOB_SEL = f'{JOB_NS}, owner_kind=~"$job_type", owner_name=~"$job_name"'
CONTROLLERS = 'owner_is_controller="true", owner_kind!~"ReplicaSet|DaemonSet|Node|StatefulSet"'
GPU_REQ = f'resource="nvidia_com_gpu", {JOB_NS}'
GPU_MEM_REQ = f'resource="aliyun_com_gpu_mem", {JOB_NS}'
GIB = 1073741824
# A node's GPUs: whole devices, or ACK GPU sharing's device count.
NODE_GPUS = 'resource=~"nvidia_com_gpu|aliyun_com_gpu_count"'
BY_JOB = "namespace, owner_kind, owner_name"
STATUS_ORDER = ("Running", "Pending", "Failed", "Succeeded")
# kube_job_* name the batch Job in job_name; only owner kind Job has them.
JOB_BATCH = f'{JOB_NS}, job_name=~"$job_name"'
QUOTA_RESOURCES = (r'(requests\\.|limits\\.)?'
                   r'(cpu|memory|nvidia\\.com/gpu|aliyun\\.com/gpu-mem|aliyun\\.com/gpu)')
NO_KSM = "Source: kube-state-metrics; no data without it."
NO_ATTRIBUTION = " No data when GPU series carry no pod labels (exporter pod attribution off)."


def owner(selector: str = NS) -> str:
    """Each pod's controlling owner (its job), HA copies collapsed."""
    return f"max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner{{{CONTROLLERS}, {selector}}})"


def of_job(expr: str, selector: str = NS) -> str:
    """A per-pod expression labelled with its pod's job (controlling owner)."""
    return f"({expr}) * on (namespace, pod) group_left (owner_kind, owner_name) {owner(selector)}"


def pods_in_phase(phase: str) -> str:
    return of_job(f'kube_pod_status_phase{{phase="{phase}", {JOB_NS}}} == 1', JOB_SEL)


def per_job_gpu(record: str) -> str:
    """One series per (job, GPU): the rule pack's record, HA copies already collapsed."""
    return of_job(f'max by (namespace, pod, node, gpu) ({record}{{pod!="", {JOB_NS}}})', JOB_SEL)


def job_status() -> str:
    """One series per job, value 1, whose ``status`` label is its state: Running if a pod
    runs, else Pending if one waits, else Failed if one failed, else Succeeded (``or on``
    keeps the first state a job has, in that order)."""
    states = [f'label_replace(count by ({BY_JOB}) ({pods_in_phase(phase)}), "status", "{phase}", "", "")'
              for phase in STATUS_ORDER]
    return f"group by ({BY_JOB}, status) ({f' or on ({BY_JOB}) '.join(states)})"


def job_requests(selector: str) -> str:
    """Each job's pods' resource requests (kube-state-metrics), labelled with the job; HA
    copies (``shard``/``replica``) collapsed so sums count each container once."""
    requests = f"max without (shard, replica) (kube_pod_container_resource_requests{{{selector}}})"
    return of_job(requests, JOB_SEL)


def with_status(expr: str) -> str:
    """A per-job column carrying the job's status label, so the table's merge joins rows."""
    return f"({expr}) * on ({BY_JOB}) group_left (status) {job_status()}"


def node_info() -> str:
    """One series per GPU node, value 1: internal IP, role, Ready status and GPU mode labels."""
    role = ('(max by (node, role) (kube_node_role) or on (node) '
            'label_replace(max by (node) (kube_node_info), "role", "worker", "", ""))')
    ready = ('(label_replace(max by (node) '
             '(kube_node_status_condition{condition="Ready", status="true"}) == 1, "status", "Ready", "", "")'
             ' or on (node) '
             'label_replace(max by (node) (kube_node_info), "status", "NotReady", "", ""))')
    mode = ('(label_replace(max by (node) (kube_node_status_allocatable{resource="aliyun_com_gpu_mem"})'
            ' > 0, "gpu_mode", "shared", "", "") or on (node) '
            'label_replace(max by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})'
            ' > 0, "gpu_mode", "exclusive", "", "")) * 0 + 1')
    return (f"max by (node, internal_ip) (kube_node_info)"
            f" * on (node) group_left (role) {role}"
            f" * on (node) group_left (status) {ready}"
            f" * on (node) group_left (gpu_mode) ({mode})")


def per_node(expr: str) -> str:
    """A per-node column carrying the node table's labels."""
    return f"({expr}) * on (node) group_left (internal_ip, role, status, gpu_mode) {node_info()}"


#: Per (job, GPU): the framebuffer of each GPU a job's pod holds (used + free).
JOB_FRAMEBUFFER = of_job("max by (namespace, pod, node, gpu) ("
                         f'gpufed:gpu_memory_used:bytes{{pod!="", {JOB_NS}}}'
                         f' + gpufed:gpu_memory_free:bytes{{pod!="", {JOB_NS}}})', JOB_SEL)
JOB_STARTS = of_job(f"kube_pod_start_time{{{JOB_NS}}}", JOB_SEL)
ALLOCATED = ('max without (shard, replica) (kube_pod_container_resource_requests{{resource="{resource}", '
             'node!=""}}) and on (namespace, pod) (kube_pod_status_phase{{phase=~"Running|Pending"}} == 1)')
NODE_ALLOCATED = ALLOCATED.format(resource="nvidia_com_gpu")


def training_dashboard() -> Dashboard:
    summary = Row("Job summary", (
        Panel("Running jobs", "stat", (Query(f"count(count by ({BY_JOB}) ({pods_in_phase('Running')}))",
                                             instant=True),),
              "Jobs with at least one Running pod. " + NO_KSM, width=6, height=5, no_value="0"),
        Panel("Pending jobs", "stat", (Query(f"count(count by ({BY_JOB}) ({pods_in_phase('Pending')}))",
                                             instant=True),),
              "Jobs with at least one Pending pod (waiting for GPUs or quota). " + NO_KSM, width=6, height=5,
              no_value="0"),
        Panel("Succeeded jobs", "stat", (Query(
            f'count(kube_job_complete{{condition="true", {JOB_BATCH}}} == 1)', instant=True),),
              "batch Jobs whose Complete condition is true (filters: namespace, job name). " + NO_KSM,
              width=6, height=5, no_value="0"),
        Panel("Failed jobs", "stat", (Query(f'count(kube_job_failed{{condition="true", {JOB_BATCH}}} == 1)',
                                            instant=True),),
              "batch Jobs whose Failed condition is true (filters: namespace, job name). " + NO_KSM,
              width=6, height=5, no_value="0",
              thresholds=(("green", None), ("red", 1))),
        Panel("Training-operator jobs (1h)", "timeseries", tuple(Query(
            f"sum by (framework) (increase(training_operator_jobs_{what}_total"
            '{job_namespace=~"$job_namespace"}[1h]))',
            f"{{{{framework}}}} {what}") for what in ("created", "successful", "failed", "restarted")),
              "Kubeflow training-operator counters per framework. No data without the operator.", width=24,
              height=6),
    ))
    jobs = Row("Jobs", (
        Panel("Job table", "table", (
            *(Query(with_status(f"count by ({BY_JOB}) ({pods_in_phase(phase)})"), f"{phase.lower()} pods",
                    instant=True) for phase in ("Running", "Pending")),
            Query(with_status(f"sum by ({BY_JOB}) ({job_requests(GPU_REQ)})"), "GPUs requested",
                  instant=True),
            Query(with_status(f"sum by ({BY_JOB}) ({job_requests(GPU_MEM_REQ)}) * {GIB}"
                              f" or on ({BY_JOB}) sum by ({BY_JOB}) ({JOB_FRAMEBUFFER})"),
                  "GPU memory allocated", instant=True),
            Query(with_status(f"time() - min by ({BY_JOB}) ({JOB_STARTS})"), "duration s", instant=True),
        ), "One row per job: type (owner_kind), status (Running if a pod runs, else Pending, Failed, "
           "Succeeded), running and pending pods, GPUs requested, GPU memory allocated (ACK GPU sharing's "
           "aliyun.com/gpu-mem requests in GiB; for whole GPUs, the framebuffer of the GPUs the job's pods "
           "hold, which needs pod attribution), seconds since its first pod started. " + NO_KSM, width=24),
        Panel("GPU utilisation per job", "timeseries", (Query(
            f"avg by ({BY_JOB}) ({per_job_gpu('gpufed:gpu_utilization:percent')})", "{{owner_name}}"),),
            "Mean utilisation over the job's GPUs." + NO_ATTRIBUTION, unit="percent", min=0, max=100),
        Panel("GPU memory used per job", "timeseries", (Query(
            f"avg by ({BY_JOB}) ({per_job_gpu('gpufed:gpu_memory_used:ratio')})", "{{owner_name}}"),),
            "Mean share of framebuffer used on the job's GPUs." + NO_ATTRIBUTION, unit="percentunit", min=0,
            max=1),
    ))
    nodes = Row("Nodes", (
        Panel("GPU nodes", "table", (
            Query(per_node(f"max by (node) (kube_node_status_capacity{{{NODE_GPUS}}})"), "GPUs",
                  instant=True),
            Query(per_node(f"sum by (node) ({NODE_ALLOCATED})"), "GPUs allocated", instant=True),
            Query(per_node(f"sum by (node) ({ALLOCATED.format(resource='aliyun_com_gpu_mem')}) * {GIB}"),
                  "GPU memory allocated", instant=True),
            Query(per_node("sum by (node) (max by (node, gpu) (gpufed:gpu_memory_used:bytes))"),
                  "GPU memory used", instant=True),
            Query(per_node("avg by (node) (max by (node, gpu) (gpufed:gpu_utilization:percent))"),
                  "utilisation %", instant=True),
        ), "One row per GPU node: name, internal IP (kube_node_info), role (kube_node_role; worker when it "
           "has none), status (Ready condition), GPU mode (shared when the node advertises ACK's "
           "aliyun.com/gpu-mem, else exclusive), GPUs (capacity), GPUs allocated (requests of its Running "
           "and Pending pods), GPU memory allocated (aliyun.com/gpu-mem requests, GiB; shared nodes), GPU "
           "memory used and mean utilisation (DCGM, rule pack records). " + NO_KSM, width=24),
        Panel("Allocated vs allocatable GPUs per node", "table", (
            Query(f"sum by (node) ({NODE_ALLOCATED})", "allocated", instant=True),
            Query('sum by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})', "allocatable",
                  instant=True),
        ), "GPUs requested by the node's Running and Pending pods against what it can allocate. " + NO_KSM,
            width=24),
    ))
    quotas = Row("Quotas", (
        Panel("ResourceQuota used vs hard", "table", tuple(Query(
            'max by (namespace, resource) '
            f'(kube_resourcequota{{resource=~"{QUOTA_RESOURCES}", type="{kind}", '
            f'{JOB_NS}}})', kind, instant=True) for kind in ("used", "hard")),
            "cpu, memory, nvidia.com/gpu, aliyun.com/gpu-mem and aliyun.com/gpu (with requests./limits.) per "
            "namespace. " + NO_KSM, width=12),
        Panel("ElasticQuota min, max and used", "table", tuple(Query(
            f'max by (namespace, name, resource) (kube_customresource_elasticquota_{kind}{{{JOB_NS}}})', kind,
            instant=True) for kind in ("min", "max", "used")),
            "scheduler-plugins ElasticQuota spec.min/spec.max/status.used, exposed by kube-state-metrics' "
            "custom-resource-state config in the README. No data without it.", width=12),
    ))
    return Dashboard(
        uid="gpufed-training", title="gpufed / Training jobs and quotas",
        description="Jobs (batch and Kubeflow), GPUs per job and node, and quotas with min, max and used.",
        tags=("gpufed", "gpu", "kubernetes"),
        variables=(
            Variable("job_namespace", "Namespace", "kube_pod_owner", label_name="namespace"),
            Variable("job_type", "Job type", f'kube_pod_owner{{{CONTROLLERS}, {JOB_NS}}}',
                     label_name="owner_kind"),
            Variable("job_name", "Job", f'kube_pod_owner{{{CONTROLLERS}, {JOB_NS}, owner_kind=~"$job_type"}}',
                     label_name="owner_name"),
        ),
        rows=(summary, jobs, nodes, quotas),
    )
