"""Pure HA wiring: each Alertmanager replica's gossip flags and Prometheus' view of the set.

Alertmanager HA is a gossip mesh, not a load-balanced service: every replica must know
its peers (``--cluster.peer``), and every Prometheus must send every alert to *every*
replica so that notification dedup by gossip works when one is down. A load balancer in
front would lose alerts sent to a replica that then fails before gossiping them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from alertmanager.models import AlertingSpec, ReplicaSpec
from sharder.kernel.tls import TlsSpec


def replica_flags(alerting: AlertingSpec, replica: ReplicaSpec) -> list[str]:
    """Command-line flags for one replica: listen, advertise, one ``--cluster.peer`` per other.

    ``--cluster.advertise-address`` takes an IP only (a host name stops Alertmanager with
    "Failed to parse advertise address", prometheus/alertmanager#1271). A replica named by
    host name (compose's ``alertmanager-0``) leaves it out: Alertmanager then advertises its
    private address on the interface with the default route, as in a container.
    """
    flags = [
        f"--web.listen-address=0.0.0.0:{replica.port}",
        f"--cluster.listen-address=0.0.0.0:{replica.cluster_port}",
    ]
    if _is_ip(replica.host):
        flags.append(f"--cluster.advertise-address={replica.cluster_address}")
    flags += [f"--cluster.peer={p.cluster_address}" for p in alerting.replicas if p.name != replica.name]
    if alerting.external_url is not None:
        # The externalURL of every webhook: the relay's Alertmanager link in each message.
        flags.append(f"--web.external-url={alerting.external_url}")
    return flags


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def gossip_peer_name(alerting: AlertingSpec) -> str | None:
    """The first replica's host name, the name a replica's gossip TLS checks in its peers'
    certificate (gossip dials IPs); None when replicas are named by IP."""
    host = alerting.replicas[0].host
    return None if _is_ip(host) else host


def all_replica_flags(alerting: AlertingSpec) -> dict[str, list[str]]:
    return {replica.name: replica_flags(alerting, replica) for replica in alerting.replicas}


def prometheus_alerting(
    alerting: AlertingSpec, *, cluster: str | None = None, tls: TlsSpec | None = None
) -> dict[str, Any]:
    """The ``alerting:`` block of a Prometheus config: every replica listed, never a VIP.

    With ``cluster`` set, alerts lacking a ``cluster`` label get it, so the label the
    inhibition rules rely on is always there. With ``tls`` and its ``alertmanager`` hop on,
    every replica is reached over https with the section's client settings.
    """
    secure = tls is not None and tls.hops.alertmanager
    manager: dict[str, Any] = {
        "api_version": "v2",
        "scheme": "https" if secure else "http",
        "timeout": "10s",
        "static_configs": [{"targets": [r.address for r in alerting.replicas]}],
    }
    if tls is not None and secure:
        manager["tls_config"] = tls.client_config()
    block: dict[str, Any] = {"alertmanagers": [manager]}
    if cluster is not None:
        block["alert_relabel_configs"] = [
            {"source_labels": ["cluster"], "regex": "", "target_label": "cluster", "replacement": cluster}
        ]
    return block


def ha_document(alerting: AlertingSpec, *, cluster: str, tls: TlsSpec | None = None) -> dict[str, Any]:
    """What ``ha.json`` holds: per-replica addresses and flags, and the Prometheus block."""
    return {
        "cluster": cluster,
        "replicas": {
            r.name: {
                "address": r.address,
                "cluster_address": r.cluster_address,
                "flags": replica_flags(alerting, r),
            }
            for r in alerting.replicas
        },
        "prometheus_alerting": prometheus_alerting(alerting, cluster=cluster, tls=tls),
    }
