"""The master's scrape jobs about gpufed itself, and the list of children it scrapes. Pure.

Pipeline position: ``federation.master.render.render_master_config`` appends :func:`scrape_jobs`
to the master config (so ``gpufed render``, the controller's ``master/prometheus.yml``,
compose, Helm and the demo all run the same jobs); the controller's
``GET /v1/sd-children`` answers :func:`children_groups` over its served assignment.

Job names are the contracts of the rule pack (``federation/rules/federation.yml``) and the
federation dashboard: ``gpufed-child`` (``PrometheusChildDown``, the remote_write alerts and
panels read ``up`` and ``prometheus_*`` of ``job=~"gpufed-child.*"`` with ``region``,
``shard``, ``replica``), ``gpufed-master``, ``gpufed-controller``, ``alertmanager``,
``gpufed-dingtalk`` and ``thanos-<component>``. A down component other than a child
fires the pack's ``ExporterDown`` with its host as ``node``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from federation.master_spec import MonitoringSpec
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.kernel.models import host_port
from sharder.kernel.tls import TlsSpec

CHILD_JOB = "gpufed-child"
MASTER_JOB = "gpufed-master"
CONTROLLER_JOB = "gpufed-controller"
ALERTMANAGER_JOB = "alertmanager"
RELAY_JOB = "gpufed-dingtalk"
SD_CHILDREN_PATH = "/v1/sd-children"
#: Hosts the compose renderer gives the Thanos components that have none in the spec.
THANOS_HOSTS = {"query": "thanos-query", "compact": "thanos-compact"}
SD_REFRESH = "15s"


def _static(job: str, targets: Iterable[str], interval: str, *, tls: TlsSpec | None = None) -> dict[str, Any]:
    job_config: dict[str, Any] = {
        "job_name": job,
        "scrape_interval": interval,
        "static_configs": [{"targets": sorted(set(targets))}],
    }
    return _secured(job_config, tls)


def _secured(job: dict[str, Any], tls: TlsSpec | None) -> dict[str, Any]:
    """``job`` scraped over https with the tls section's client settings, when ``tls`` is given."""
    if tls is None:
        return job
    return {**job, "scheme": "https", "tls_config": tls.client_config()}


def _tls_where(spec: GpufedSpec, on: bool) -> TlsSpec | None:
    return spec.tls if spec.tls is not None and on else None


def master_targets(spec: GpufedSpec) -> list[str]:
    master = spec.master
    assert master is not None
    if master.monitoring.masters:
        return list(master.monitoring.masters)
    if master.replicas == 1:
        return [f"127.0.0.1:{master.port}"]  # itself: its host name may not resolve inside it
    return [f"{master.replica_host(i)}:{master.port}" for i in range(master.replicas)]


def thanos_targets(spec: GpufedSpec) -> dict[str, list[str]]:
    """``thanos-<component>`` -> HOST:HTTP_PORT of each instance the spec has."""
    thanos = spec.thanos
    if thanos is None:
        return {}
    jobs: dict[str, list[str]] = {}
    if thanos.receive is not None:
        jobs["thanos-receive"] = [
            *(f"{e.host}:{e.http_port}" for e in thanos.receive.ingestors()),
            *(f"{r.host}:{r.http_port}" for r in thanos.receive.routers),
        ]
    if thanos.mode == "sidecar" and spec.master is not None:
        master = spec.master
        jobs["thanos-sidecar"] = [
            f"{master.replica_host(i)}:{thanos.sidecar.http_port}" for i in range(master.replicas)
        ]
    jobs["thanos-query"] = [f"{THANOS_HOSTS['query']}:{thanos.query.http_port}"]
    jobs["thanos-store"] = [f"{thanos.store.host}:{thanos.store.http_port}"]
    jobs["thanos-compact"] = [f"{THANOS_HOSTS['compact']}:{thanos.compactor.http_port}"]
    return jobs


def scrape_jobs(spec: GpufedSpec) -> list[dict[str, Any]]:
    """The master's meta-monitoring jobs, by job name; empty when ``monitoring.enabled`` is off."""
    master = spec.master
    assert master is not None
    monitoring: MonitoringSpec = master.monitoring
    # Who serves TLS: the children, the master and the Alertmanagers with tls.serve (their
    # web-config), the controller with the http_sd hop on, the relay with the relay hop on.
    hops = spec.tls.hops if spec.tls is not None else None
    served = _tls_where(spec, spec.tls is not None and spec.tls.serve is not None)
    controller_tls = _tls_where(spec, hops is not None and hops.http_sd)
    if not monitoring.enabled:
        return [_secured({"job_name": MASTER_JOB, "static_configs": [{"targets": master_targets(spec)}]},
                         served)]
    interval = monitoring.scrape_interval or master.scrape_interval
    controller_url = str(spec.children.http_sd_url).rstrip("/")
    sd: dict[str, Any] = {"url": controller_url + SD_CHILDREN_PATH, "refresh_interval": SD_REFRESH}
    if controller_tls is not None:
        sd["tls_config"] = controller_tls.client_config()
    # The children's scheme comes from child_url (__scheme__ in /v1/sd-children).
    children: dict[str, Any] = {"job_name": CHILD_JOB, "scrape_interval": interval, "http_sd_configs": [sd]}
    if served is not None:
        children["tls_config"] = served.client_config()
    jobs = [
        children,
        _static(CONTROLLER_JOB, monitoring.controllers or [host_port(controller_url)], interval,
                tls=controller_tls),
        _static(MASTER_JOB, master_targets(spec), interval, tls=served),
    ]
    if spec.alerting is not None:
        jobs.append(_static(ALERTMANAGER_JOB, (r.address for r in spec.alerting.replicas), interval,
                            tls=served))
        jobs.append(_static(RELAY_JOB, [host_port(spec.alerting.relay_url)], interval,
                            tls=_tls_where(spec, hops is not None and hops.relay)))
    jobs += [_static(job, targets, interval) for job, targets in thanos_targets(spec).items() if targets]
    return sorted(jobs, key=lambda job: str(job["job_name"]))


def children_groups(spec: GpufedSpec, assignment: Assignment | None) -> list[dict[str, Any]]:
    """HTTP SD groups, one per child of ``assignment``, labelled as the rule pack expects.

    The child's URL comes from the spec's template; a path in it (a proxy in front of
    the children, as in the demo) becomes the scrape's ``__metrics_path__`` prefix, and
    the child's name its ``instance`` (not the proxy's address, the same for every child).
    """
    if assignment is None:
        return []
    groups = []
    for shard, info in sorted(assignment.shards.items()):
        for child, replica in assignment.children(shard):
            url = spec.child_url(child=child, region=info.region, shard=shard, replica=replica,
                                 ordinal=assignment.ordinal(shard, replica))
            parts = urlsplit(url)
            labels = {"child": child, "region": info.region, "shard": shard, "replica": str(replica)}
            if parts.path.strip("/"):
                labels["__metrics_path__"] = parts.path.rstrip("/") + "/metrics"
                # Behind a proxy every child has the proxy's address: name the child instead,
                # so alerts (instance, and the node the rule pack derives from it) say which.
                labels["instance"] = child
            if parts.scheme == "https":
                labels["__scheme__"] = "https"
            groups.append({"targets": [host_port(url)], "labels": labels})
    return sorted(groups, key=lambda group: group["labels"]["child"])
