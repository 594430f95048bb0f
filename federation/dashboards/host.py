"""The **host** dashboard: CPU, memory, load, disk, network and filesystem fill of each node.

Source: node-exporter (job ``node``, the target NodeDown watches), read at the master tier
with the names node-exporter 1.9 and 1.11 export (checked against both pinned binaries).
The node job's keep list (``examples/federation.yaml``, ``compose/federation.yaml``)
keeps ``node_(cpu|memory|filesystem|network|load|disk|procs|uname|boot_time).*``;
``tests/deploy/test_keep_lists.py`` checks every series read here survives it.

As on the GPU dashboards (``gpu.py``), every query collapses the HA and hand-over copies of
a series (``max by (...)`` over the labels that name the machine and the device) and leaves
out copies whose child stopped sending (``NOT_SILENT``) before it sums or divides.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from federation.dashboards.gpu import NODE_LOGS, NODES_LOGS, NOT_SILENT
from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable

SEL = 'job="node", region=~"$region", node=~"$node"'
HOST = "cluster, region, node"
#: Pseudo and in-memory filesystems: their fill is memory, not disk.
REAL_FS = 'fstype!~"tmpfs|ramfs|squashfs|overlay|nsfs|fuse.*"'
#: Loopback and virtual interfaces carry no traffic off the machine.
REAL_NIC = 'device!~"lo|veth.*|docker.*|cali.*|flannel.*|cni.*|ifb.*"'
IDLE, BUSY = 'mode="idle"', 'mode!="idle"'
SOURCE = ("Source: node-exporter (job `node`, metric {name}); no data while the node's exporter is "
          "not scraped.")


def per_host(metric: str, extra: str = "", by: str = "") -> str:
    """One series per machine (and ``by`` labels), HA and hand-over copies collapsed."""
    selector = ", ".join(s for s in (SEL, extra) if s)
    labels = ", ".join(s for s in (HOST, by) if s)
    return f"max by ({labels}) ({metric}{{{selector}}} {NOT_SILENT})"


def rate_per_host(metric: str, extra: str = "", by: str = "") -> str:
    """Per-second rate of a counter, one series per machine (and ``by`` labels)."""
    selector = ", ".join(s for s in (SEL, extra) if s)
    labels = ", ".join(s for s in (HOST, by) if s)
    return (f"max by ({labels}) (rate({metric}{{{selector}}}[$__rate_interval]) "
            f"{NOT_SILENT})")


def nic_rate(metric: str) -> str:
    """Per-second rate summed over the node's real interfaces."""
    return f"sum by ({HOST}) ({rate_per_host(metric, REAL_NIC, 'device')})"


def _ts(title: str, queries: tuple[Query, ...], description: str, **kw: Any) -> Panel:
    return Panel(title, "timeseries", queries, description, **kw)


def host_dashboard() -> Dashboard:
    cpus = f"count by ({HOST}) ({per_host('node_cpu_seconds_total', IDLE, 'cpu')})"
    idle = f"sum by ({HOST}) ({rate_per_host('node_cpu_seconds_total', IDLE, 'cpu')})"
    busy = f"1 - ({idle}) / ({cpus})"
    mem_used = (f"1 - {per_host('node_memory_MemAvailable_bytes')} / on ({HOST}) "
                f"{per_host('node_memory_MemTotal_bytes')}")
    fs_by = "device, mountpoint, fstype"
    fs_used = (f"1 - {per_host('node_filesystem_avail_bytes', REAL_FS, fs_by)} / on ({HOST}, {fs_by}) "
               f"{per_host('node_filesystem_size_bytes', REAL_FS, fs_by)}")
    overview = Row("Overview", (
        Panel("CPU busy", "bargauge", (Query(busy, "{{node}}", instant=True),),
              "Share of CPU time not idle, over all cores. "
              + SOURCE.format(name="node_cpu_seconds_total"),
              unit="percentunit", min=0, max=1, thresholds=(("green", None), ("orange", 0.8), ("red", 0.95)),
              width=8, height=6),
        Panel("Memory used", "bargauge", (Query(mem_used, "{{node}}", instant=True),),
              "1 - MemAvailable / MemTotal: memory the kernel cannot hand out without swapping or "
              "dropping caches. " + SOURCE.format(name="node_memory_MemAvailable_bytes, _MemTotal_bytes"),
              unit="percentunit", min=0, max=1, thresholds=(("green", None), ("orange", 0.85), ("red", 0.95)),
              width=8, height=6),
        Panel("Fullest filesystem", "bargauge",
              (Query(f"max by ({HOST}) ({fs_used})", "{{node}}", instant=True),),
              "The fullest disk-backed filesystem of each node (tmpfs, overlay and other in-memory "
              "filesystems left out). " + SOURCE.format(name="node_filesystem_avail_bytes, _size_bytes"),
              unit="percentunit", min=0, max=1, thresholds=(("green", None), ("orange", 0.8), ("red", 0.95)),
              width=8, height=6),
    ))
    cpu = Row("CPU and load", (
        _ts("CPU busy per node", (Query(busy, "{{node}}"),),
            "Share of CPU time not idle, averaged over the node's cores. "
            + SOURCE.format(name="node_cpu_seconds_total"), unit="percentunit", min=0, max=1, width=8),
        _ts("CPU time by mode", (Query(
            f"sum by ({HOST}, mode) ({rate_per_host('node_cpu_seconds_total', BUSY, 'cpu, mode')})"
            f" / on ({HOST}) group_left() ({cpus})", "{{node}} {{mode}}"),),
            "Where the busy time goes (user, system, iowait, steal, ...), as a share of all cores. "
            "High iowait: the node waits on its disks; high steal: on its hypervisor. "
            + SOURCE.format(name="node_cpu_seconds_total"), unit="percentunit", min=0, stacked=True, width=8),
        _ts("Load per core", (
            Query(f"{per_host('node_load1')} / on ({HOST}) ({cpus})", "{{node}} 1m"),
            Query(f"{per_host('node_load15')} / on ({HOST}) ({cpus})", "{{node}} 15m"),
        ), "Load average (runnable and uninterruptible tasks) divided by the core count: above 1 "
           "tasks queue for a core. " + SOURCE.format(name="node_load1, node_load15"), min=0, width=8),
        _ts("Processes running and blocked", (
            Query(per_host("node_procs_running"), "{{node}} running"),
            Query(per_host("node_procs_blocked"), "{{node}} blocked on I/O"),
        ), "Tasks on a CPU or waiting for one, and tasks blocked on I/O (the stat collector). "
           + SOURCE.format(name="node_procs_running, node_procs_blocked"), min=0, width=12),
        _ts("Memory", (
            Query(f"{per_host('node_memory_MemTotal_bytes')} - on ({HOST}) "
                  f"{per_host('node_memory_MemAvailable_bytes')}", "{{node}} used"),
            Query(per_host("node_memory_MemAvailable_bytes"), "{{node}} available"),
        ), "Memory in use (MemTotal - MemAvailable) and available. "
           + SOURCE.format(name="node_memory_MemTotal_bytes, _MemAvailable_bytes"), unit="bytes", min=0,
            width=12),
    ))
    disk = Row("Disks and filesystems", (
        _ts("Disk throughput", (
            Query(f"sum by ({HOST}) ({rate_per_host('node_disk_read_bytes_total', by='device')})",
                  "{{node}} read"),
            Query(f"sum by ({HOST}) ({rate_per_host('node_disk_written_bytes_total', by='device')})",
                  "{{node}} written"),
        ), "Bytes read and written per second over all block devices. "
           + SOURCE.format(name="node_disk_read_bytes_total, _written_bytes_total"),
            unit="Bps", min=0, width=8),
        _ts("Busiest disk", (Query(
            f"max by ({HOST}) ({rate_per_host('node_disk_io_time_seconds_total', by='device')})",
            "{{node}}"),),
            "Share of time the node's busiest block device had I/O in flight; near 100% it is saturated. "
            + SOURCE.format(name="node_disk_io_time_seconds_total"),
            unit="percentunit", min=0, max=1, width=8),
        _ts("Filesystem fill", (Query(fs_used, "{{node}} {{mountpoint}}"),),
            "Used share of each disk-backed filesystem. The rule pack's HostFilesystemFillingUp fires "
            "when one is under 20% free and its 6-hour trend reaches zero within a day. "
            + SOURCE.format(name="node_filesystem_avail_bytes, _size_bytes"),
            unit="percentunit", min=0, max=1, width=8),
        Panel("Filesystems", "table", (
            Query(fs_used, "used", instant=True),
            Query(per_host("node_filesystem_avail_bytes", REAL_FS, fs_by), "free", instant=True),
            Query(f"max by ({HOST}, {fs_by}) (predict_linear(node_filesystem_avail_bytes{{{SEL}, {REAL_FS}}}"
                  f"[6h], 24 * 3600) {NOT_SILENT})", "free in 24 h (6 h trend)", instant=True),
        ), "Every disk-backed filesystem: used share, free bytes, and free bytes in 24 hours at the "
           "last 6 hours' rate (negative: it fills up before then). "
           + SOURCE.format(name="node_filesystem_avail_bytes, _size_bytes"), width=24, height=8),
    ))
    network = Row("Network", (
        _ts("Network traffic", (
            Query(nic_rate("node_network_receive_bytes_total"), "{{node}} in"),
            Query(nic_rate("node_network_transmit_bytes_total"), "{{node}} out"),
        ), "Bytes per second over the node's physical and bond interfaces (loopback and container "
           "veths left out). "
           + SOURCE.format(name="node_network_receive_bytes_total, _transmit_bytes_total"),
            unit="Bps", min=0, width=12),
        _ts("Network errors and drops", (
            Query(nic_rate("node_network_receive_errs_total") + f" + on ({HOST}) "
                  + nic_rate("node_network_transmit_errs_total"), "{{node}} errors"),
            Query(nic_rate("node_network_receive_drop_total") + f" + on ({HOST}) "
                  + nic_rate("node_network_transmit_drop_total"), "{{node}} drops"),
        ), "Packets per second that failed or were dropped, received and sent together; anything "
           "above zero for long is a cable, NIC or ring-buffer problem. "
           + SOURCE.format(name="node_network_{receive,transmit}_{errs,drop}_total"), min=0, width=12),
    ))
    rows = tuple(Row(row.title, tuple(p if p.kind == "table" else _with_logs(p) for p in row.panels))
                 for row in (overview, cpu, disk, network))
    return Dashboard(
        uid="gpufed-host", title="gpufed / Host resources",
        description="CPU, memory, load, disks, filesystem fill and network of each node (node-exporter).",
        tags=("gpufed", "host"),
        variables=(
            Variable("region", "Region", 'node_load1{job="node"}'),
            Variable("node", "Node", 'node_load1{job="node", region=~"$region"}'),
        ),
        rows=rows,
        panel_links=(NODES_LOGS,),
    )


def _with_logs(panel: Panel) -> Panel:
    """Every series here keeps ``node``: link each to that node's logs."""
    return replace(panel, data_links=(NODE_LOGS,))
