"""Child Prometheus configs: typed spec + assignment + targets in, plain dicts out.

Pipeline position: ``sharder.engine.assigning`` decides which shard owns each target; this module
turns that decision into one ``prometheus.yml`` dict per child (replicas of a shard
differ only in their ``replica`` external label) plus the target groups each child
discovers, either from files beside its config (file_sd) or from the controller's
HTTP SD endpoint (``http_sd_groups`` is what that endpoint serves). Nothing here
dumps YAML or touches disk: ``sharder.kernel.output`` does that, so output stays byte-stable.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sharder.engine.assignment import Assignment
from sharder.kernel import prometheus_versions
from sharder.kernel.errors import AssignmentError
from sharder.kernel.models import host_port, parse_duration
from sharder.kernel.tls import TlsSpec
from sharder.model.inventory import Target
from sharder.model.spec import HEARTBEAT_JOB, FederationSpec, JobSpec, RemoteWriteSpec

#: What a child's heartbeat is called at the master: the ``up`` of its scrape of itself.
HEARTBEAT_METRIC = "gpufed_child_heartbeat"
#: The heartbeat's ``up`` leaves the child renamed: the master's freshness rules read ``up``
#: as the fleet's targets, and a child is not one. Its ``scrape_*`` report series go as they
#: are (4 series a child): dropping them here would count as samples dropped by relabelling,
#: which the federation dashboard shows as a child losing data.
HEARTBEAT_WRITE_RELABEL: list[dict[str, Any]] = [
    {"source_labels": ["job", "__name__"], "regex": f"{HEARTBEAT_JOB};up",
     "target_label": "__name__", "replacement": HEARTBEAT_METRIC},
]


def agent_flag(spec: FederationSpec) -> str:
    """Agent mode is a flag, not a config key, and its spelling follows the release
    (``sharder.kernel.prometheus_versions``: 2.x a feature flag, 3.x ``--agent``)."""
    return spec.prometheus.rendering().agent_flag

TargetGroup = dict[str, Any]


@dataclass(frozen=True)
class ChildConfig:
    """Everything needed to run one child Prometheus."""

    child: str
    shard: str
    region: str
    replica: int
    prometheus: dict[str, Any]
    file_sd: dict[str, list[TargetGroup]] = field(default_factory=dict)
    """job -> target groups; empty when the child uses http_sd."""
    flags: list[str] = field(default_factory=list)
    targets: int = 0
    load: int = 0


def target_groups(targets: Iterable[Target]) -> list[TargetGroup]:
    """One group per target, sorted, so one changed target changes one entry."""
    ordered = sorted(targets, key=lambda t: t.identity)
    return [{"targets": [t.instance], "labels": t.target_labels()} for t in ordered]


def shard_members(
    spec: FederationSpec, targets: Iterable[Target], assignment: Assignment
) -> dict[str, dict[str, list[Target]]]:
    """shard -> job -> targets, refusing targets the assignment or the spec does not know.

    A silent drop here would mean a node nobody scrapes, so both mismatches are errors.
    """
    jobs = {job.name for job in spec.jobs}
    members: dict[str, dict[str, list[Target]]] = {
        shard: {job: [] for job in sorted(jobs)} for shard in assignment.shards
    }
    for target in targets:
        if target.job not in jobs:
            raise AssignmentError(
                f"target {target.identity!r} has job {target.job!r}, which the spec does not define"
                f" (jobs: {sorted(jobs)})"
            )
        shard = assignment.targets.get(target.identity)
        if shard is None or shard not in members:
            raise AssignmentError(f"target {target.identity!r} is not in the assignment (stale assignment?)")
        members[shard][target.job].append(target)
    return members


def http_sd_groups(
    spec: FederationSpec, targets: Iterable[Target], assignment: Assignment, *, shard: str, job: str
) -> list[TargetGroup]:
    """The HTTP SD payload for ``/v1/sd/{shard}/{job}``; ``[]`` when the shard owns none."""
    if shard not in assignment.shards:
        raise AssignmentError(f"unknown shard {shard!r}")
    if spec.job(job) is None:
        raise AssignmentError(f"unknown job {job!r}")
    return target_groups(shard_members(spec, targets, assignment)[shard][job])


def http_sd_url(spec: FederationSpec, *, shard: str, job: str) -> str:
    return f"{spec.children.http_sd_url.rstrip('/')}/v1/sd/{shard}/{job}"


def metric_relabel_configs(job: JobSpec) -> list[dict[str, Any]]:
    """Keep, then drop, then strip labels: the cheapest filters run first."""
    rules: list[dict[str, Any]] = []
    if job.keep_metrics:
        rules.append({"action": "keep", "source_labels": ["__name__"], "regex": "|".join(job.keep_metrics)})
    if job.drop_metrics:
        rules.append({"action": "drop", "source_labels": ["__name__"], "regex": "|".join(job.drop_metrics)})
    if job.drop_labels:
        rules.append({"action": "labeldrop", "regex": "|".join(job.drop_labels)})
    return rules


def scrape_config(spec: FederationSpec, job: JobSpec, *, shard: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "job_name": job.name,
        "scrape_interval": job.scrape_interval,
        "metrics_path": job.metrics_path,
        "scheme": job.scheme,
        "honor_labels": job.honor_labels,
        "sample_limit": job.sample_limit,
    }
    if job.scrape_timeout:
        config["scrape_timeout"] = job.scrape_timeout
    fallback = spec.prometheus.rendering().fallback_scrape_protocol
    if fallback is not None:
        # Fleet exporters are not ours: one that sends no or a wrong Content-Type was scraped
        # as text by 2.x, and 3.x fails the scrape unless told what to fall back to.
        config["fallback_scrape_protocol"] = fallback
    tls = spec.tls
    if tls is not None and tls.scrapes(job.name):
        config["scheme"] = "https"
        config["tls_config"] = tls.client_config()
    if spec.children.target_discovery == "file_sd":
        # Prometheus resolves relative file_sd paths against the config file's directory,
        # so the rendered tree can be moved as a whole.
        config["file_sd_configs"] = [{"files": [f"targets/{job.name}.json"]}]
    else:
        config["http_sd_configs"] = [
            {
                "url": http_sd_url(spec, shard=shard, job=job.name),
                "refresh_interval": spec.children.http_sd_refresh_interval,
            }
        ]
        if tls is not None and tls.hops.http_sd:
            config["http_sd_configs"][0]["tls_config"] = tls.client_config()
    relabel = metric_relabel_configs(job)
    if relabel:
        config["metric_relabel_configs"] = relabel
    return config


def heartbeat_interval(spec: FederationSpec) -> str:
    """The heartbeat's interval: the spec's shortest, so a dead child shows as soon as its
    fastest job's targets would."""
    return min((job.scrape_interval for job in spec.jobs), key=parse_duration)


def heartbeat_config(spec: FederationSpec, url: str) -> dict[str, Any]:
    """The child scrapes itself at ``url`` (where the master's meta-monitoring finds it).

    Why: the master must tell a dead child (or its dead remote_write) from a live one. Before
    the heartbeat, the freshness rules took every shard's newest sample of any target, a read
    of every copy of ``up`` at each evaluation (a third of the group at 100k targets); one
    series per child costs nothing. The scrape's own samples are dropped: only the report
    series are left, and the remote_write renames their ``up`` (``HEARTBEAT_WRITE_RELABEL``).
    Its value says whether the child answered at that address; its timestamp is the heartbeat.
    """
    parts = urlsplit(url)
    config: dict[str, Any] = {
        "job_name": HEARTBEAT_JOB,
        "scrape_interval": heartbeat_interval(spec),
        "scheme": parts.scheme,
        "metrics_path": parts.path.rstrip("/") + "/metrics",
        "static_configs": [{"targets": [host_port(url)]}],
        "metric_relabel_configs": [{"action": "drop", "source_labels": ["__name__"], "regex": ".+"}],
    }
    if parts.scheme == "https" and spec.tls is not None:
        config["tls_config"] = spec.tls.client_config()
    return config


def remote_write_config(
    write: RemoteWriteSpec, *, tls: TlsSpec | None = None, heartbeat: bool = False
) -> dict[str, Any]:
    config: dict[str, Any] = {"name": write.name, "url": write.url}
    if write.protocol == "2.0":
        config["protobuf_message"] = prometheus_versions.REMOTE_WRITE_V2_MESSAGE
    if write.remote_timeout:
        config["remote_timeout"] = write.remote_timeout
    if write.headers:
        config["headers"] = dict(write.headers)
    if write.basic_auth is not None:
        config["basic_auth"] = write.basic_auth.model_dump()
    if write.authorization is not None:
        config["authorization"] = write.authorization.model_dump()
    if tls is not None and tls.hops.remote_write:
        config["tls_config"] = tls.client_config()
    queue = write.queue_config.model_dump(exclude_none=True)
    if queue:
        config["queue_config"] = queue
    if heartbeat:
        # A copy per write: objects shared between two of them would dump as YAML aliases.
        config["write_relabel_configs"] = copy.deepcopy(HEARTBEAT_WRITE_RELABEL)
    return config


def prometheus_config(
    spec: FederationSpec, *, shard: str, region: str, replica: int, url: str | None = None
) -> dict[str, Any]:
    """One child's ``prometheus.yml``; agent mode leaves out what agents refuse.

    ``url``: where the child answers; with a remote_write to carry it, the child scrapes
    itself there for its heartbeat (:func:`heartbeat_config`).
    """
    external = dict(spec.external_labels)
    external.update(cluster=spec.cluster, region=region, shard=shard, replica=str(replica))
    global_: dict[str, Any] = {"scrape_interval": spec.children.scrape_interval, "external_labels": external}
    if not spec.children.agent_mode:
        global_["evaluation_interval"] = spec.children.evaluation_interval
    writes = [w for w in spec.remote_write if not w.regions or region in w.regions]
    scrapes = [scrape_config(spec, job, shard=shard) for job in spec.jobs]
    beat = heartbeat_config(spec, url) if writes and url is not None else None  # writes carry it
    if beat is not None:
        scrapes.append(beat)
    config: dict[str, Any] = {"global": global_, "scrape_configs": scrapes}
    if writes:
        config["remote_write"] = [remote_write_config(w, tls=spec.tls, heartbeat=beat is not None)
                                  for w in writes]
    return config


def render_children(
    spec: FederationSpec, targets: Iterable[Target], assignment: Assignment, *, configs: bool = True
) -> list[ChildConfig]:
    """Every child of every shard, sorted by child id. ``configs=False``: the counts and
    flags alone (``prometheus`` and ``file_sd`` empty), for a manifest without a render."""
    members = shard_members(spec, targets, assignment)
    loads = assignment.load()
    file_sd = configs and spec.children.target_discovery == "file_sd"
    flags = [agent_flag(spec)] if spec.children.agent_mode else []
    children: list[ChildConfig] = []
    for shard, info in sorted(assignment.shards.items()):
        groups = {job: target_groups(found) for job, found in members[shard].items()} if file_sd else {}
        count = sum(len(found) for found in members[shard].values())
        for child, replica in assignment.children(shard):
            prometheus: dict[str, Any] = {}
            if configs:  # a summary (the config refresh) asks for no address at all
                url = spec.child_url(child=child, region=info.region, shard=shard, replica=replica,
                                     ordinal=assignment.ordinal(shard, replica))
                prometheus = prometheus_config(spec, shard=shard, region=info.region, replica=replica,
                                               url=url)
            children.append(
                ChildConfig(
                    child=child,
                    shard=shard,
                    region=info.region,
                    replica=replica,
                    prometheus=prometheus,
                    file_sd=groups,
                    flags=list(flags),
                    targets=count,
                    load=loads.get(shard, 0),
                )
            )
    return sorted(children, key=lambda c: c.child)


def manifest(spec: FederationSpec, assignment: Assignment, children: list[ChildConfig]) -> dict[str, Any]:
    """What was rendered, for deploy tooling and summaries; no timestamps, so it is stable."""
    return {
        "cluster": spec.cluster,
        "algorithm": assignment.algorithm,
        "algorithm_version": assignment.algorithm_version,
        "replication_factor": assignment.replication_factor,
        "target_discovery": spec.children.target_discovery,
        "agent_mode": spec.children.agent_mode,
        "prometheus_version": spec.prometheus.version,
        "children": [
            {
                "child": c.child,
                "shard": c.shard,
                "region": c.region,
                "replica": c.replica,
                "targets": c.targets,
                "load": c.load,
                "flags": c.flags,
                "config": f"children/{c.child}/prometheus.yml",
            }
            for c in children
        ],
    }
