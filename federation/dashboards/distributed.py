"""The **distributed training** dashboard: NVLink traffic and errors per job, GPU
utilisation per job, and stragglers (a job's slowest GPU against the job's median).

NVLink series come from gpufed-exporter's ``nvlink`` family (per GPU and ``link``, with
pod labels when a pod holds the GPU); utilisation from the rule pack's
``gpufed:gpu_utilization:percent``. A job is the pod's controlling owner in
kube-state-metrics (``kube_pod_owner``), joined on namespace and pod.
"""

from __future__ import annotations

from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable
from federation.dashboards.training import BY_JOB, of_job

SEL = 'pod!="", namespace=~"$namespace"'
NO_NVLINK = (" Source: gpufed-exporter family `nvlink` with pod attribution, and kube-state-metrics; no data "
             "without them.")


def nvlink_rate(metric: str, *, keep: str = "") -> str:
    """Per (job, GPU, link) rate, HA copies collapsed; ``keep`` names extra labels kept."""
    return of_job(f"max by (namespace, pod, node, gpu, link{keep}) "
                  f"(rate({metric}{{{SEL}}}[$__rate_interval]))")


LINKS_DOWN = f"max by (namespace, pod, node, gpu, link) (gpufed_nvlink_link_up{{{SEL}}}) == 0"
UTIL = of_job(f"max by (namespace, pod, node, gpu) (gpufed:gpu_utilization:percent{{{SEL}}})")


def distributed_dashboard() -> Dashboard:
    nvlink = Row("NVLink per job", (
        Panel("NVLink throughput per job", "timeseries", (
            Query(f"sum by ({BY_JOB}) ({nvlink_rate('gpufed_nvlink_tx_bytes_total')})", "{{owner_name}} tx"),
            Query(f"sum by ({BY_JOB}) ({nvlink_rate('gpufed_nvlink_rx_bytes_total')})", "{{owner_name}} rx"),
        ), "Bytes per second over all NVLinks of the job's GPUs." + NO_NVLINK, unit="Bps"),
        Panel("NVLink errors per job", "timeseries", (
            Query(f"sum by ({BY_JOB}, type) ({nvlink_rate('gpufed_nvlink_crc_errors_total', keep=', type')})",
                  "{{owner_name}} CRC {{type}}"),
            Query(f"sum by ({BY_JOB}) ({nvlink_rate('gpufed_nvlink_replay_errors_total')})",
                  "{{owner_name}} replay"),
            Query(f"sum by ({BY_JOB}) ({nvlink_rate('gpufed_nvlink_recovery_errors_total')})",
                  "{{owner_name}} recovery"),
        ), "CRC, replay and recovery errors per second on the job's NVLinks; any sustained rate slows "
           "collectives." + NO_NVLINK, unit="cps"),
        Panel("NVLinks down per job", "table", (Query(
            f"count by ({BY_JOB}) ({of_job(LINKS_DOWN)})",
            "links down", instant=True),),
            "Links whose state is down on the job's GPUs; empty when every link is up." + NO_NVLINK,
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
