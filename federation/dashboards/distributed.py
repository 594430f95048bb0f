"""The **distributed training** dashboard: NVLink traffic and errors per job, GPU
utilisation per job, and stragglers (a job's slowest GPU against the job's median).

NVLink series are dcgm-exporter's default per-GPU set, which gpufed-exporter's default
``nvlink_gpu`` family writes too: ``DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES`` (bytes per second)
and the NVLink error totals under either DCGM naming (`federation.dashboards.dcgm`), with
pod labels when a pod holds the GPU. Only "NVLinks down" needs the opt-in per-link
``nvlink`` family. Utilisation comes from the rule pack's ``gpufed:gpu_utilization:percent``.
A job is the pod's controlling owner in kube-state-metrics (``kube_pod_owner``), joined on namespace and pod.
"""

from __future__ import annotations

from federation.dashboards import dcgm
from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable
from federation.dashboards.training import BY_JOB, of_job

SEL = 'pod!="", namespace=~"$namespace"'
NO_NVLINK = (" Source: DCGM NVLink fields (dcgm-exporter's default set, gpufed-exporter's default "
             "`nvlink_gpu` family) with pod attribution, and kube-state-metrics; no data without them.")
PER_LINK = (" Source: gpufed-exporter's opt-in per-link family (`--families nvlink`) with pod attribution, "
            "and kube-state-metrics.")
ERRORS = (("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "CRC flit"),
          ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "CRC data"),
          ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replay"),
          ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "recovery"))


def per_gpu(expr: str) -> str:
    """Per (job, GPU) value, HA copies collapsed."""
    return of_job(f"max by (namespace, pod, node, gpu) ({expr})")


LINKS_DOWN = f"max by (namespace, pod, node, gpu, link) (gpufed_nvlink_link_up{{{SEL}}}) == 0"
UTIL = of_job(f"max by (namespace, pod, node, gpu) (gpufed:gpu_utilization:percent{{{SEL}}})")


def distributed_dashboard() -> Dashboard:
    nvlink = Row("NVLink per job", (
        Panel("NVLink throughput per job", "timeseries", (
            Query(f"sum by ({BY_JOB}) ({per_gpu(dcgm.metric('DCGM_FI_PROF_NVLINK_TX_BYTES', SEL))})",
                  "{{owner_name}} tx"),
            Query(f"sum by ({BY_JOB}) ({per_gpu(dcgm.metric('DCGM_FI_PROF_NVLINK_RX_BYTES', SEL))})",
                  "{{owner_name}} rx"),
        ), "Bytes per second over all NVLinks of the job's GPUs." + NO_NVLINK, unit="Bps"),
        Panel("NVLink errors per job", "timeseries", tuple(
            Query(f"sum by ({BY_JOB}) ({per_gpu(dcgm.rate(name, SEL))})", "{{owner_name}} " + what)
            for name, what in ERRORS
        ), "CRC, replay and recovery errors per second on the job's NVLinks; any sustained rate slows "
           "collectives." + NO_NVLINK, unit="cps"),
        Panel("NVLinks down per job", "table", (Query(
            f"count by ({BY_JOB}) ({of_job(LINKS_DOWN)})",
            "links down", instant=True),),
            "Links whose state is down on the job's GPUs; empty when every link is up." + PER_LINK,
            width=24, height=6),
    ))
    stragglers = Row("Utilisation and stragglers", (
        Panel("GPU utilisation per job", "timeseries",
              (Query(f"avg by ({BY_JOB}) ({UTIL})", "{{owner_name}}"),),
              "Mean utilisation over the job's GPUs." + NO_NVLINK, unit="percent", min=0, max=100),
        Panel("Slowest GPU vs job median", "timeseries", (Query(
            f"min by ({BY_JOB}) ({UTIL}) / on ({BY_JOB}) (quantile by ({BY_JOB}) (0.5, {UTIL}) > 0)",
            "{{owner_name}}"),),
            "The job's least-utilised GPU as a share of the job's median: 1 is even, well below 1 is a "
            "straggler holding back every synchronous step." + NO_NVLINK, unit="percentunit", min=0, max=1.2),
        Panel("Straggler GPUs", "table", (Query(
            f"({UTIL}) / on ({BY_JOB}) group_left () (quantile by ({BY_JOB}) (0.5, {UTIL}) > 0) < 0.8",
            "share of job median", instant=True),),
            "GPUs running below 80% of their job's median utilisation, with node and pod." + NO_NVLINK,
            width=24, height=6),
    ))
    return Dashboard(
        uid="gpufed-distributed", title="gpufed / Distributed training",
        description="NVLink traffic and errors, GPU utilisation and stragglers per training job.",
        tags=("gpufed", "gpu", "kubernetes"),
        variables=(Variable("namespace", "Namespace", "kube_pod_owner"),),
        rows=(nvlink, stragglers),
    )
