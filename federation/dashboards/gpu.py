"""The GPU fleet dashboards: **cluster** (fleet totals, per-region breakdown) and **node**
(per-GPU detail). Queries read the exporter's DCGM names and gpufed_* additions
(``exporter/catalogue.py``, ``exporter/exposition.py``) and the rule pack's recording
rules (``federation/rules/gpu.yml``) at the master tier.

Every series at the master carries ``node``/``region`` from gpufed's service discovery
and ``cluster``/``shard``/``replica`` from the child's external labels. Aggregations go
through ``max by (cluster, node, gpu)`` (or ``group by``) first: HA children
(replication factor 2) send the same GPU twice, differing only in ``replica``, and during
a make-before-break hand-over the old and the new shard's children both scrape a node,
whose series then differ only in ``shard``. Thanos Query deduplicates both (its replica
labels), a plain Prometheus master does not, and sums and counts would double.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from federation.dashboards import dcgm
from federation.dashboards.grafana import Dashboard, Link, Panel, Query, Row, Variable
from logs import explore

MIB = 1048576
REGION = 'region=~"$region"'
GPU_SEL = 'region=~"$region", node=~"$node", gpu=~"$gpu"'
# "A GPU is there" under DCGM 3.x or 4.x names (federation/dashboards/dcgm.py).
GPU_ANY = dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", REGION)
GPU_ANY_POD = dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", REGION + ', pod!=""')
REPLAYS = dcgm.any_name("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU_SEL)  # rate() needs a selector
NODE_SEL = 'region=~"$region", node=~"$node"'
# GPUs requested by pods bound to a node and Running or Pending (they hold their GPUs),
# HA copies collapsed: kube-state-metrics, so it needs no pod attribution.
KSM_GPU_REQUESTS = (
    "max by (cluster, namespace, pod, container) "
    f'(kube_pod_container_resource_requests{{resource="nvidia_com_gpu", node!="", {REGION}}})'
    " and on (cluster, namespace, pod) "
    f'(max by (cluster, namespace, pod) (kube_pod_status_phase{{phase=~"Running|Pending", {REGION}}}) == 1)'
)
HEALTH_MAP = (("1", "Healthy", "green"), ("0", "Unhealthy", "red"))
UP_MAP = (("1", "Up", "green"), ("0", "Down", "red"))
RED_IF_ANY = (("green", None), ("red", 1.0))


# Logs next to the metrics (the logs tier, ``logs/``): every panel links to the journal and
# container logs of the nodes the dashboard selects; series that carry a node link to theirs.
NODES_LOGS = Link("Logs of the selected nodes (Loki)", explore.panel_link_url(("region", "node")))
REGION_LOGS = Link("Logs of the selected regions (Loki)", explore.panel_link_url(("region",)))
NODE_LOGS = Link("Logs of ${__field.labels.node} (Loki)", explore.data_link_url())
# The outermost aggregation keeps ``node`` (``max by (node, gpu) (...)``, ``topk(5, sum by (node)
# ...)``): an inner ``by (node)`` under ``count(...)`` does not count.
_BY_NODE = re.compile(
    r"^\s*(?:time\(\) - )?(?:(?:topk|bottomk)\(\d+,\s*)?(?:max|min|sum|avg|count|group) by \([^)]*\bnode\b"
)


def with_node_logs(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """A data link to the node's logs on every panel whose series all keep a ``node`` label."""
    return tuple(Row(row.title, tuple(
        replace(p, data_links=(NODE_LOGS,)) if all(_BY_NODE.match(q.expr) for q in p.queries) else p
        for p in row.panels)) for row in rows)

#: Readings of a copy whose child stopped sending (the rule pack's freshness records) are
#: last values the 5-minute lookback still returns, not the GPU now: left out.
NOT_SILENT = "unless on (cluster, job, instance, shard, replica) gpufed:up_copy:silent == 1"


def per_gpu(metric: str, selector: str, by: str = "cluster, region, node, gpu") -> str:
    """One series per physical GPU (HA replica and hand-over copies collapsed), fresh copies only."""
    return f"max by ({by}) ({dcgm.metric(metric, selector)} {NOT_SILENT})"


def _stat(title: str, expr: str, description: str, **kw: Any) -> Panel:
    return Panel(title, "stat", (Query(expr, instant=True),), description, width=4, height=4, **kw)


def cluster_dashboard() -> Dashboard:
    gpus = f'count(group by (cluster, node, gpu) ({GPU_ANY}))'
    allocated = (f"sum({KSM_GPU_REQUESTS}) or count(group by (cluster, node, gpu) ({GPU_ANY_POD}))")
    used = f"sum({per_gpu('DCGM_FI_DEV_FB_USED', REGION)}) * {MIB}"
    total = (f"sum(max by (cluster, region, node, gpu) ({dcgm.metric('DCGM_FI_DEV_FB_USED', REGION)}"
             f" + {dcgm.metric('DCGM_FI_DEV_FB_FREE', REGION)})) * {MIB}")
    unhealthy_nodes = (
        f'count(group by (cluster, node) (gpufed:target_up:fresh{{job="gpu", {REGION}}} == 0)'
        f" or group by (cluster, node) (gpufed_gpu_health{{{REGION}}} == 0))"
    )
    attribution = ("Allocated = the exporter attributes the GPU to a pod (series carry a non-empty "
                   "`pod` label; needs pod attribution, e.g. kubelet pod-resources). Without "
                   "attribution nothing is allocated as far as this panel knows and it shows 0.")
    requested = ("Allocated = nvidia.com/gpu requested by pods bound to a node and Running or Pending "
                 "(kube-state-metrics' kube_pod_container_resource_requests, as the training dashboard "
                 "reads it); without kube-state-metrics, GPUs the exporter attributes to a pod (pod "
                 "attribution), else 0.")
    fleet = Row("Fleet", (
        _stat("GPU nodes", f'count(group by (cluster, node) (gpufed:target_up:fresh{{job="gpu", {REGION}}}))',
              "Nodes with a GPU exporter target (job `gpu`), up, down or unknown."),
        _stat("Unhealthy GPU nodes", unhealthy_nodes,
              "Nodes whose GPU exporter is down or unknown (`gpufed:target_up:fresh == 0`: its "
              "samples stopped reaching the master) or that have a GPU with "
              "`gpufed_gpu_health == 0` (critical XID within the health window, or a failed read).",
              no_value="0", thresholds=RED_IF_ANY),
        _stat("GPUs", gpus, "Physical GPUs reporting DCGM_FI_DEV_GPU_UTIL (HA copies counted once)."),
        _stat("GPUs allocated", allocated, requested, no_value="0"),
        _stat("Unhealthy GPUs", f"count({per_gpu('gpufed_gpu_health', REGION)} == 0)",
              "GPUs with `gpufed_gpu_health == 0`.", no_value="0", thresholds=RED_IF_ANY),
        _stat("GPU exporters down",
              f'count(max by (cluster, node) (gpufed:target_up:fresh{{job="gpu", {REGION}}}) == 0)',
              "GPU exporter targets that do not answer scrapes, or whose samples stopped reaching the "
              "master (rule pack freshness records); their GPUs are unwatched.",
              no_value="0", thresholds=RED_IF_ANY),
        _stat("Mean GPU utilisation", f"avg({per_gpu('DCGM_FI_DEV_GPU_UTIL', REGION)})",
              "Mean of DCGM_FI_DEV_GPU_UTIL over all GPUs.", unit="percent", min=0, max=100),
        _stat("GPU memory used", used, "Sum of DCGM_FI_DEV_FB_USED.", unit="bytes"),
        _stat("GPU memory total", total, "Sum of used + free framebuffer (DCGM_FI_DEV_FB_USED + _FREE).",
              unit="bytes"),
        _stat("GPU memory used %", f"({used}) / ({total})", "Used / total framebuffer memory.",
              unit="percentunit", min=0, max=1),
        _stat("GPUs allocated %", f"({allocated}) / ({gpus})", requested, unit="percentunit",
              min=0, max=1, no_value="0"),
        _stat("GPU power", f"sum({per_gpu('DCGM_FI_DEV_POWER_USAGE', REGION)})",
              "Total board power draw (DCGM_FI_DEV_POWER_USAGE).", unit="watt"),
    ))
    by_region = "cluster, region"
    regions = Row("Per region", (
        Panel("Regions", "table", (
            Query(f"count by ({by_region}) (group by (cluster, region, node, gpu) "
                  f"({GPU_ANY}))", "GPUs", instant=True),
            Query(f'count by ({by_region}) (group by (cluster, region, node, gpu) '
                  f'({GPU_ANY_POD}))', "allocated", instant=True),
            Query(f"gpufed:region_gpu_utilization:avg{{{REGION}}}", "mean util %", instant=True),
            Query(f"gpufed:region_gpu_memory_used:ratio{{{REGION}}}", "memory used", instant=True),
            Query(f"sum by ({by_region}) ({per_gpu('DCGM_FI_DEV_POWER_USAGE', REGION)})", "power W",
                  instant=True),
        ), "One row per region: GPUs, GPUs allocated to pods (empty without pod attribution), mean "
           "utilisation and memory used (recording rules gpufed:region_*), power.", width=24, height=6),
        Panel("Mean GPU utilisation by region", "timeseries",
              (Query(f"gpufed:region_gpu_utilization:avg{{{REGION}}}", "{{cluster}}/{{region}}"),),
              "Recording rule gpufed:region_gpu_utilization:avg.", unit="percent", min=0, max=100, width=8),
        Panel("GPU memory used by region", "timeseries",
              (Query(f"gpufed:region_gpu_memory_used:ratio{{{REGION}}}", "{{cluster}}/{{region}}"),),
              "Recording rule gpufed:region_gpu_memory_used:ratio.", unit="percentunit", min=0, max=1,
              width=8),
        Panel("GPUs allocated by region", "timeseries", (
            Query(f'count by ({by_region}) (group by (cluster, region, node, gpu) '
                  f'({GPU_ANY_POD}))', "{{region}} allocated"),
            Query(f"count by ({by_region}) (group by (cluster, region, node, gpu) "
                  f"({GPU_ANY}))", "{{region}} total"),
        ), attribution, width=8),
        Panel("Unhealthy GPUs by region", "timeseries",
              (Query(f"count by ({by_region}) ({per_gpu('gpufed_gpu_health', REGION)} == 0)",
                     "{{cluster}}/{{region}}"),),
              "GPUs with gpufed_gpu_health == 0; no line means none is unhealthy.", width=12),
        Panel("GPU power by region", "timeseries",
              (Query(f"sum by ({by_region}) ({per_gpu('DCGM_FI_DEV_POWER_USAGE', REGION)})",
                     "{{cluster}}/{{region}}"),),
              "Board power draw summed per region.", unit="watt", width=12, stacked=True),
    ))
    hot = Row("Hot spots", (
        Panel("Busiest nodes", "table", (Query(
            f"topk(10, avg by (cluster, region, node) ({per_gpu('DCGM_FI_DEV_GPU_UTIL', REGION)}))",
            instant=True),), "Top 10 nodes by mean GPU utilisation (%).", unit="percent", width=8),
        Panel("Hottest GPUs", "table", (Query(
            f"topk(10, {per_gpu('DCGM_FI_DEV_GPU_TEMP', REGION)})", instant=True),),
            "Top 10 GPUs by core temperature.", unit="celsius", width=8),
        Panel("Least free GPU memory", "table", (Query(
            f"bottomk(10, min by (cluster, region, node, gpu) (gpufed:gpu_memory_free:bytes{{{REGION}}}))",
            instant=True),), "Recording rule gpufed:gpu_memory_free:bytes, lowest 10.", unit="bytes",
            width=8),
        Panel("GPUs with an XID", "table", (Query(
            f"max by (cluster, region, node, gpu, xid) (gpufed:gpu_xid_last:code{{{REGION}}})",
            instant=True),), "Recording rule gpufed:gpu_xid_last:code: GPUs whose last XID "
            "(DCGM_FI_DEV_XID_ERRORS) is non-zero, with the code. Empty when no GPU reported an XID.",
            width=24, height=6),
    ))
    return Dashboard(
        uid="gpufed-cluster", title="gpufed / GPU cluster",
        description="Fleet-wide GPU capacity, health, utilisation and per-region breakdown.",
        tags=("gpufed", "gpu"),
        variables=(Variable("region", "Region", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL")),),
        rows=with_node_logs((fleet, regions, hot)),
        panel_links=(REGION_LOGS,),
    )


def _gpu_ts(title: str, metric: str, description: str, **kw: Any) -> Panel:
    query = Query(per_gpu(metric, GPU_SEL, "node, gpu"), "{{node}} GPU {{gpu}}")
    return Panel(title, "timeseries", (query,), description, **kw)


def node_dashboard() -> Dashboard:
    health = Row("Health", (
        Panel("GPU health", "stat", (Query(per_gpu("gpufed_gpu_health", GPU_SEL, "node, gpu"),
                                           "{{node}} GPU {{gpu}}", instant=True),),
              "gpufed_gpu_health: 0 after a critical XID within the health window or a failed read.",
              width=12, height=5, mappings=HEALTH_MAP, thresholds=(("red", None), ("green", 1.0))),
        Panel("GPU exporter", "stat", (Query(f'max by (node) (up{{job="gpu", {NODE_SEL}}})', "{{node}}",
                                             instant=True),),
              "Whether the node's GPU exporter answers scrapes.", width=4, height=5, mappings=UP_MAP,
              thresholds=(("red", None), ("green", 1.0))),
        Panel("Time since last collection", "stat", (Query(
            "time() - max by (node) "
            f"(gpufed_exporter_last_collection_success_timestamp_seconds{{{NODE_SEL}}})",
            "{{node}}", instant=True),),
            "Seconds since the exporter last read the GPUs successfully (gpufed-exporter only).",
            unit="s", width=4, height=5, thresholds=(("green", None), ("orange", 30.0), ("red", 60.0))),
        Panel("Collection errors", "stat", (Query(
            f"max by (node) (increase(gpufed_exporter_collection_errors_total{{{NODE_SEL}}}[$__range]))"
            f" + max by (node) (increase(gpufed_exporter_collection_timeouts_total{{{NODE_SEL}}}[$__range]))",
            "{{node}}", instant=True),), "Failed, partial or timed-out GPU reads over the time range.",
            width=4, height=5, thresholds=RED_IF_ANY),
        Panel("Devices", "table", (Query(
            f"max by (node, gpu, modelName, UUID, pci_bus_id) "
            f"({dcgm.metric('DCGM_FI_DEV_FB_USED', GPU_SEL)} + {dcgm.metric('DCGM_FI_DEV_FB_FREE', GPU_SEL)})"
            f" * {MIB}",
            instant=True),), "Each GPU's model, UUID, PCI bus id and framebuffer size.", unit="bytes",
            width=24, height=6),
    ))
    usage = Row("Utilisation and memory", (
        _gpu_ts("GPU utilisation", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL.", unit="percent",
                min=0, max=100),
        _gpu_ts("Memory copy utilisation", "DCGM_FI_DEV_MEM_COPY_UTIL",
                "DCGM_FI_DEV_MEM_COPY_UTIL: share of time the memory interface was busy.", unit="percent",
                min=0, max=100),
        Panel("Framebuffer used", "timeseries", (Query(
            f"{per_gpu('DCGM_FI_DEV_FB_USED', GPU_SEL, 'node, gpu')} * {MIB}", "{{node}} GPU {{gpu}}"),),
            "DCGM_FI_DEV_FB_USED.", unit="bytes"),
        _gpu_ts("Framebuffer used %", "gpufed:gpu_memory_used:ratio",
                "Recording rule gpufed:gpu_memory_used:ratio (used / (used + free)).", unit="percentunit",
                min=0, max=1),
        _gpu_ts("SM active", "DCGM_FI_PROF_SM_ACTIVE",
                "DCGM_FI_PROF_SM_ACTIVE (exporter family `gpm`, opt-in, Hopper and newer). No data "
                "when the family is off or the GPU has no GPM.", unit="percentunit", min=0, max=1),
        _gpu_ts("Tensor pipe active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (family `gpm`, opt-in). No data when it is off.",
                unit="percentunit", min=0, max=1),
    ))
    physical = Row("Temperature, power and clocks", (
        Panel("Temperature", "timeseries", (
            Query(per_gpu("DCGM_FI_DEV_GPU_TEMP", GPU_SEL, "node, gpu"), "{{node}} GPU {{gpu}} core"),
            Query(per_gpu("DCGM_FI_DEV_MEMORY_TEMP", GPU_SEL, "node, gpu"), "{{node}} GPU {{gpu}} memory"),
        ), "DCGM_FI_DEV_GPU_TEMP and DCGM_FI_DEV_MEMORY_TEMP.", unit="celsius",
            thresholds=(("green", None), ("orange", 85.0), ("red", 90.0))),
        Panel("Power", "timeseries", (
            Query(per_gpu("DCGM_FI_DEV_POWER_USAGE", GPU_SEL, "node, gpu"), "{{node}} GPU {{gpu}}"),
            Query(f"max by (node, gpu) ({dcgm.rate('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION', GPU_SEL)}) / 1000",
                  "{{node}} GPU {{gpu}} (from energy)"),
        ), "Instant draw (DCGM_FI_DEV_POWER_USAGE) and the average over the interval from the energy "
           "counter (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ).", unit="watt"),
        Panel("Clocks", "timeseries", (
            Query(f"{per_gpu('DCGM_FI_DEV_SM_CLOCK', GPU_SEL, 'node, gpu')} * 1000000",
                  "{{node}} GPU {{gpu}} SM"),
            Query(f"{per_gpu('DCGM_FI_DEV_MEM_CLOCK', GPU_SEL, 'node, gpu')} * 1000000",
                  "{{node}} GPU {{gpu}} memory"),
        ), "DCGM_FI_DEV_SM_CLOCK and DCGM_FI_DEV_MEM_CLOCK; SM clocks drop when idle or throttled.",
            unit="hertz", width=24),
    ))
    errors = Row("Errors", (
        Panel("Last XID", "table", (Query(
            f"max by (node, gpu, xid) (gpufed:gpu_xid_last:code{{{GPU_SEL}}})", instant=True),),
            "Recording rule gpufed:gpu_xid_last:code: the xid column is the last XID the driver "
            "reported (DCGM_FI_DEV_XID_ERRORS). Empty when no GPU reported one.", width=8),
        Panel("XID errors in range", "table", (Query(
            f"max by (node, gpu, err_code) (increase(gpufed_gpu_xid_errors_total{{{GPU_SEL}}}[$__range]))",
            instant=True),), "gpufed-exporter's per-code XID counter; rows exist for every code seen "
            "since the exporter started, the value is the increase over the time range. Empty when the "
            "GPU never reported an XID.", width=8),
        Panel("XID last seen", "table", (Query(
            f"max by (node, gpu, err_code) (gpufed_gpu_xid_last_seen_timestamp_seconds{{{GPU_SEL}}}) * 1000",
            instant=True),), "When each XID code was last reported.", unit="dateTimeAsIso", width=8),
        Panel("ECC errors", "timeseries", (
            Query(per_gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", GPU_SEL, "node, gpu"),
                  "{{node}} GPU {{gpu}} single-bit"),
            Query(per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU_SEL, "node, gpu"),
                  "{{node}} GPU {{gpu}} double-bit"),
        ), "Volatile ECC error totals since the driver loaded; any double-bit error makes results "
           "on the GPU suspect."),
        Panel("PCIe replays", "timeseries", (Query(
            f"max by (node, gpu) (rate({REPLAYS}[$__rate_interval]))",
            "{{node}} GPU {{gpu}}"),), "PCIe link retries per second; a steady rate points at a bad "
            "riser or slot.", unit="ops"),
        Panel("PCIe throughput", "timeseries", (
            Query(f"max by (node, gpu) (DCGM_FI_PROF_PCIE_TX_BYTES{{{GPU_SEL}}})", "{{node}} GPU {{gpu}} TX"),
            Query(f"max by (node, gpu) (DCGM_FI_PROF_PCIE_RX_BYTES{{{GPU_SEL}}})", "{{node}} GPU {{gpu}} RX"),
        ), "DCGM_FI_PROF_PCIE_{TX,RX}_BYTES (bytes per second; dcgm-exporter's default set, the same "
           "name under every DCGM naming). In gpufed-exporter from the family `pcie` (opt-in: NVML "
           "samples each direction for 20 ms); no data when the family is off.", unit="Bps", width=24),
    ))
    nvlink = Row("NVLink", (
        Panel("NVLink throughput", "timeseries", (
            Query(f"max by (node, gpu) ({dcgm.metric('DCGM_FI_PROF_NVLINK_TX_BYTES', GPU_SEL)})",
                  "{{node}} GPU {{gpu}} TX"),
            Query(f"max by (node, gpu) ({dcgm.metric('DCGM_FI_PROF_NVLINK_RX_BYTES', GPU_SEL)})",
                  "{{node}} GPU {{gpu}} RX"),
            Query(f"max by (node, gpu) ({dcgm.rate('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL', GPU_SEL)}) * 1024",
                  "{{node}} GPU {{gpu}} TX + RX (counter)"),
        ), "Bytes per second over all of a GPU's NVLinks: DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES (fields "
           "1011/1012) and the rate of DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (KiB sent + received; in "
           "dcgm-exporter's default counters). gpufed-exporter writes all three in its default family "
           "`nvlink_gpu` on its one port (docs/exporter.md). Orange is under 10 GB/s, the seed's check "
           "for a GPU of a multi-GPU job; an idle GPU sits there too. No data on GPUs without NVLink.",
            unit="Bps",
            thresholds=(("orange", None), ("green", 10e9)), width=16),
        Panel("NVLinks up per GPU", "table", (Query(
            f"sum by (node, gpu) (max by (node, gpu, link) (gpufed_nvlink_link_up{{{GPU_SEL}}}))",
            instant=True),),
            "Active links per GPU (gpufed_nvlink_link_up from the opt-in per-link family `nvlink`); a GPU "
            "with fewer links than its siblings has a link down. No data while the family is off.", width=8),
    ))
    return Dashboard(
        uid="gpufed-node", title="gpufed / GPU node",
        description="Per-GPU utilisation, memory, temperature, power, clocks, XID and health.",
        tags=("gpufed", "gpu"),
        variables=(
            Variable("region", "Region", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL")),
            Variable("node", "Node", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", REGION)),
            Variable("gpu", "GPU", dcgm.any_name("DCGM_FI_DEV_GPU_UTIL", 'region=~"$region", node=~"$node"')),
        ),
        rows=with_node_logs((health, usage, physical, errors, nvlink)),
        panel_links=(NODES_LOGS,),
    )
