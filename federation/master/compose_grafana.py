"""Grafana in ``compose/monitoring.yml`` when the spec has a ``grafana:`` section.

Called by ``federation.master.compose.render_compose_bundle`` after its single Grafana service is
built: that service then provisions from the rendered ``grafana/`` tree (datasources linked
by node, a folder per team; ``GPUFED_GRAFANA_DIR`` is what the provider paths expand), and
with ``grafana.ha`` it becomes replica 0 of a set sharing PostgreSQL (``grafana/ha.json``),
with a bundled ``postgres`` service unless the database lives elsewhere. Put a load
balancer in front of the replicas' ports; compose does not provide one.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from federation.grafana.render import DATASOURCES_FILE, HA_FILE
from federation.master import images
from sharder.kernel.output import Bundle

POSTGRES_IMAGE = images.ref("postgres")
_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")


def _required(value: str, what: str) -> str:
    match = _REF.match(value)
    return f"${{{match[1]}:?set {match[1]}: {what}}}" if match else value


def grafana_services(
    services: dict[str, dict[str, Any]], volumes: dict[str, dict[str, Any]], *, files: Bundle, tree: str
) -> None:
    if DATASOURCES_FILE not in files:
        return
    base = services["grafana"]
    base["environment"]["GF_PATHS_PROVISIONING"] = f"{tree}/grafana/provisioning"
    base["environment"]["GPUFED_GRAFANA_DIR"] = f"{tree}/grafana"
    if HA_FILE not in files:
        return
    ha = json.loads(files[HA_FILE])
    template = copy.deepcopy(base)
    for i, (_, replica) in enumerate(sorted(ha["replicas"].items())):
        service = base if i == 0 else copy.deepcopy(template)
        env = {k: _required(v, "Grafana's database password") for k, v in replica["env"].items()}
        service["environment"].update(env)
        service["hostname"] = replica["host"]
        if i:
            data = f"grafana-data-{i}"
            service["volumes"] = [
                v if v.get("source") != "grafana-data" else {**v, "source": data} for v in service["volumes"]
            ]
            volumes[data] = {}
            service["ports"] = [f"${{GPUFED_GRAFANA_PORT_{i}:-{3000 + i}}}:{replica['port']}"]
        if ha["database"]["bundled"]:
            service["depends_on"] = {"postgres": {"condition": "service_healthy"}}
        services[replica["host"]] = service
    if ha["database"]["bundled"]:
        db = ha["database"]
        password = next(
            v for k, v in services["grafana"]["environment"].items() if k == "GF_DATABASE_PASSWORD"
        )
        services["postgres"] = {
            "image": POSTGRES_IMAGE,
            "hostname": db["host"].rsplit(":", 1)[0],
            "restart": "unless-stopped",
            "environment": {
                "POSTGRES_DB": db["name"],
                "POSTGRES_USER": db["user"],
                "POSTGRES_PASSWORD": password,
            },
            "volumes": [{"type": "volume", "source": "grafana-db", "target": "/var/lib/postgresql/data"}],
            "healthcheck": {
                "test": ["CMD", "pg_isready", "-U", db["user"], "-d", db["name"]],
                "interval": "10s",
                "timeout": "5s",
                "retries": 5,
                "start_period": "20s",
            },
        }
        volumes["grafana-db"] = {}
