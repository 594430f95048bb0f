"""Pure renderer: XID lines in the kernel log become a log-based signal in Loki's ruler.

Loki's ruler reads Prometheus-format rule groups whose ``expr`` is LogQL. Two rules per
node, both from the kernel ring Promtail ships (``unit="kernel"``, ``NVRM: Xid`` lines):

- ``gpufed:xid_log_lines:count<window>`` (recording) counts XID lines per node and XID
  code; the ruler remote-writes it to the metrics tier when a remote-write URL is known,
  so it sits next to the exporter's ``DCGM_FI_DEV_XID_ERRORS``.
- ``GPUXidInKernelLog`` (alerting) fires when a node logged any XID in the window.

How they complement the exporter's counter: the exporter reads XIDs through NVML events
and keeps the *last* code per GPU (a gauge), so two XIDs between scrapes show as one and a
node whose exporter is down or whose driver has wedged NVML reports nothing. The kernel
log keeps every line, with its text (PID, channel, "GPU has fallen off the bus"), whether
or not NVML still answers. The exporter's signal is per GPU and fast; the log's is per
node, complete, and survives the exporter. The alert names the node only: the kernel line
names the GPU by PCI address, not by index.

Loki's ruler reads ``<rules_dir>/<tenant>/*.yml``; with ``auth_enabled: false`` the one
tenant is ``fake`` (Loki's default single-tenant ID).
"""

from __future__ import annotations

from typing import Any

from logs.models import LogsSpec
from logs.promtail import KERNEL_UNIT, XID_LINE

SINGLE_TENANT = "fake"
RULES_DIR = "logs/rules"


def rules_file(logs: LogsSpec) -> str:
    return f"{RULES_DIR}/{logs.loki.tenant or SINGLE_TENANT}/gpufed-xid.yml"


def xid_selector() -> str:
    return f'{{job="journal", unit="{KERNEL_UNIT}"}} |= "{XID_LINE}"'


def xid_rules(logs: LogsSpec) -> dict[str, Any]:
    window = logs.ruler.xid_window
    count = f"count_over_time({xid_selector()} [{window}])"
    return {
        "groups": [
            {
                "name": "gpufed-xid-logs",
                "interval": logs.ruler.evaluation_interval,
                "rules": [
                    {
                        "record": f"gpufed:xid_log_lines:count{window}",
                        "expr": f"sum by (cluster, region, node, xid) ({count})",
                    },
                    {
                        "alert": "GPUXidInKernelLog",
                        "expr": f"sum by (cluster, region, node) ({count}) > 0",
                        "labels": {"severity": "warning", "source": "logs"},
                        "annotations": {
                            "summary": "{{ $labels.node }} logged {{ $value }} XID line(s) in " + window,
                            "description": (
                                "The kernel ring of {{ $labels.node }} has NVRM: Xid lines. The exporter's"
                                " XID gauge keeps only the last code per GPU; the log has every line and"
                                " its text."
                            ),
                        },
                    },
                ],
            }
        ]
    }
