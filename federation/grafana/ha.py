"""Pure renderer: Grafana replicas sharing one PostgreSQL, as environment per replica.

Grafana HA (Grafana docs, "Set up Grafana for high availability"): every replica points
at the same database, which holds dashboards, users, sessions and alerting state, so any
replica answers any request behind a load balancer. Alerting has two modes:

- ``alertmanager`` (default): Grafana's alerting is off (``[unified_alerting] enabled =
  false``); gpufed's rule pack and its Alertmanager HA set page, as without Grafana HA.
- ``unified``: Grafana alerting on; the replicas gossip like an Alertmanager cluster
  (``ha_peers``, ``ha_listen_address``, ``ha_advertise_address``) so one notification is sent.

Written as ``grafana/ha.json`` (replica -> host and ``GF_*`` environment), which compose
turns into services and the chart into a StatefulSet's environment. The database password
is a reference: ``GF_DATABASE_PASSWORD`` from a variable, or Grafana's ``__FILE`` suffix.
"""

from __future__ import annotations

from typing import Any

from federation.grafana.models import HASpec

GRAFANA_PORT = 3000


def replica_host(index: int) -> str:
    """Replica 0 keeps the single-replica name (``grafana``) so links and datasources hold."""
    return "grafana" if index == 0 else f"grafana-{index}"


def replica_env(ha: HASpec, index: int) -> dict[str, str]:
    db = ha.database
    env = {
        "GF_DATABASE_TYPE": db.type,
        "GF_DATABASE_HOST": db.host,
        "GF_DATABASE_NAME": db.name,
        "GF_DATABASE_USER": db.user,
        "GF_DATABASE_SSL_MODE": db.ssl_mode,
    }
    if db.password.env is not None:
        env["GF_DATABASE_PASSWORD"] = f"${{{db.password.env}}}"
    else:
        env["GF_DATABASE_PASSWORD__FILE"] = str(db.password.file)
    if ha.alerting == "alertmanager":
        env["GF_UNIFIED_ALERTING_ENABLED"] = "false"
    else:
        peers = [f"{replica_host(i)}:{ha.alerting_port}" for i in range(ha.replicas)]
        env |= {
            "GF_UNIFIED_ALERTING_ENABLED": "true",
            "GF_UNIFIED_ALERTING_HA_PEERS": ",".join(peers),
            "GF_UNIFIED_ALERTING_HA_LISTEN_ADDRESS": f"0.0.0.0:{ha.alerting_port}",
            "GF_UNIFIED_ALERTING_HA_ADVERTISE_ADDRESS": peers[index],
        }
    return env


def ha_document(ha: HASpec) -> dict[str, Any]:
    return {
        "replicas": {
            f"grafana-{i}": {"host": replica_host(i), "port": GRAFANA_PORT, "env": replica_env(ha, i)}
            for i in range(ha.replicas)
        },
        "database": {
            "host": ha.database.host,
            "name": ha.database.name,
            "user": ha.database.user,
            "bundled": ha.database.bundled,
        },
        "alerting": ha.alerting,
    }
