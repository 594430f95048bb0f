"""Pure renderer: the spec in, one Promtail config for every GPU node out.

Pipeline position: ``logs.render.render_logs_bundle`` dumps it to ``logs/promtail.yml``;
compose's ``node.yml`` and the chart's DaemonSet run it with ``-config.expand-env=true``.
One file serves the whole fleet: the node's identity comes from its environment, the same
variables the exporter reads (``NODE_NAME``, ``GPUFED_REGION``, ``GPUFED_RACK``,
``GPUFED_TEAM``), so a log stream carries the ``node``/``region``/``rack``/``team`` labels
its metrics carry and a query moves from one to the other by label.

The identity labels are set by ``relabel_configs`` rather than ``external_labels``: a
relabel ``replace`` that yields an empty value removes the label (Prometheus relabelling,
which Promtail reuses), so a node without a rack sends no ``rack`` label, exactly as its
metrics have none, instead of an empty one. (Expansion happens on the text before YAML
parsing, so an empty variable leaves ``replacement:`` null, which yaml.v2 decodes as "".)

Journal labels follow Promtail's journal target (``__journal_<field>``, lower-cased,
grafana/loki clients/pkg/promtail/targets/journal/journaltarget.go); kernel-ring entries
have ``_TRANSPORT=kernel`` and no unit, so they get ``unit="kernel"``.
"""

from __future__ import annotations

from typing import Any

from logs.models import LogsSpec

CONFIG_FILE = "logs/promtail.yml"
PUSH_PATH = "/loki/api/v1/push"
KERNEL_UNIT = "kernel"
#: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, ...``: the driver's XID report in the kernel ring.
XID_LINE = "NVRM: Xid"
XID_REGEX = r"NVRM: Xid \((?P<pci>PCI:[0-9a-fA-F:.]+)\): (?P<xid>\d+)"
#: Node identity from the environment: (label, variable). Same names as compose/node.yml's.
IDENTITY_ENV = (
    ("node", "NODE_NAME"),
    ("region", "GPUFED_REGION"),
    ("rack", "GPUFED_RACK"),
    ("team", "GPUFED_TEAM"),
)
LOKI_URL_ENV = "GPUFED_LOKI_URL"
POSITIONS = "/var/lib/promtail/positions.yaml"
DOCKER_LOGS = "/var/lib/docker/containers/*/*-json.log"
POD_LOGS = "/var/log/pods/*/*/*.log"
POD_PATH_REGEX = r"^/var/log/pods/(?P<namespace>[^_/]+)_(?P<pod>[^_/]+)_[^/]+/(?P<container>[^/]+)/"


def _identity(cluster: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [{"target_label": "cluster", "replacement": cluster}]
    for label, variable in IDENTITY_ENV:
        # ${VAR} is expanded by -config.expand-env; empty -> the label is dropped.
        rules.append({"target_label": label, "replacement": f"${{{variable}}}"})
    return rules


def unit_regex(logs: LogsSpec) -> str:
    # Unit names hold only [A-Za-z0-9@._:-] (LogsSpec checks), so '.' is the one metacharacter.
    return "|".join([KERNEL_UNIT, *(u.replace(".", r"\.") for u in logs.units)])


def journal_job(logs: LogsSpec, *, cluster: str) -> dict[str, Any]:
    return {
        "job_name": "journal",
        "journal": {
            "max_age": logs.journal.max_age,
            **({"path": logs.journal.path} if logs.journal.path else {}),
            "labels": {"job": "journal"},
        },
        "relabel_configs": [
            {"source_labels": ["__journal__systemd_unit"], "target_label": "unit"},
            {
                "source_labels": ["__journal__transport"],
                "regex": KERNEL_UNIT,
                "target_label": "unit",
                "replacement": KERNEL_UNIT,
            },
            {"source_labels": ["unit"], "regex": unit_regex(logs), "action": "keep"},
            {"source_labels": ["__journal_priority_keyword"], "target_label": "level"},
            *_identity(cluster),
        ],
        "pipeline_stages": [
            {
                "match": {
                    "selector": f'{{unit="{KERNEL_UNIT}"}} |= "{XID_LINE}"',
                    "stages": [{"regex": {"expression": XID_REGEX}}, {"labels": {"xid": None}}],
                }
            }
        ],
    }


def container_jobs(*, cluster: str) -> list[dict[str, Any]]:
    docker = {
        "job_name": "docker",
        "static_configs": [
            {"targets": ["localhost"], "labels": {"job": "containers", "__path__": DOCKER_LOGS}}
        ],
        "relabel_configs": _identity(cluster),
        "pipeline_stages": [{"docker": {}}],
    }
    pods = {
        "job_name": "pods",
        "static_configs": [{"targets": ["localhost"], "labels": {"job": "pods", "__path__": POD_LOGS}}],
        "relabel_configs": _identity(cluster),
        "pipeline_stages": [
            {"cri": {}},
            # the extracted map starts with the entry's labels, `filename` among them
            # (grafana/loki clients/pkg/logentry/stages/pipeline.go, Pipeline.Run)
            {"regex": {"source": "filename", "expression": POD_PATH_REGEX}},
            {"labels": {"namespace": None, "pod": None, "container": None}},
        ],
    }
    return [docker, pods]


def promtail_config(logs: LogsSpec, *, cluster: str) -> dict[str, Any]:
    client: dict[str, Any] = {
        "url": f"${{{LOKI_URL_ENV}:-{logs.loki.url}}}{PUSH_PATH}",
        "backoff_config": {"min_period": "500ms", "max_period": "5m", "max_retries": 10},
    }
    if logs.loki.tenant:
        client["tenant_id"] = logs.loki.tenant
    jobs = [journal_job(logs, cluster=cluster)]
    if logs.containers:
        jobs += container_jobs(cluster=cluster)
    return {
        "server": {"http_listen_port": logs.promtail_port, "grpc_listen_port": 0, "log_level": "info"},
        "positions": {"filename": POSITIONS},
        "clients": [client],
        "scrape_configs": jobs,
    }
