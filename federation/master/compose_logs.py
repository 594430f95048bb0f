"""The logs tier in ``compose/monitoring.yml``: a Loki service over the rendered ``logs/``.

Called by ``federation.master.compose.render_compose_bundle`` when the bundle has ``logs/loki.yml``
(the spec has a ``logs:`` section). Loki runs as one binary (``-target=all``) with the
bucket Thanos uses; its rule directory moves into the mounted tree, so compose gets its own
copy of the config (``compose/loki.yml``) that differs from ``logs/loki.yml`` only there.
GPU nodes push to its published port (``GPUFED_LOKI_PORT``, default 3100): compose/node.yml's
Promtail (``--profile logs``).

Image: grafana/loki's is distroless ``static:debug`` (grafana/loki cmd/loki/Dockerfile@0230065a),
so the healthcheck calls busybox's wget by its path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from federation.master import compose_objstore, images
from sharder.kernel.output import Bundle, dump_yaml

LOKI_IMAGE = images.ref("loki")
LOKI_FILE = "compose/loki.yml"
LOKI_PORT = 3100


def loki_service(
    services: dict[str, dict[str, Any]],
    volumes: dict[str, dict[str, Any]],
    *,
    files: Bundle,
    tree: str,
    mount: dict[str, Any],
    secrets_env: Callable[[Bundle], dict[str, str]],
) -> Bundle:
    """Add ``loki`` to ``services``; returns ``compose/loki.yml`` (nothing without a logs tier).

    ``mount``: the read-only bind of the rendered tree's parent every service gets;
    ``secrets_env``: the object store's secret variables, as the Thanos services get them.
    """
    if "logs/loki.yml" not in files:
        return {}
    config = yaml.safe_load(files["logs/loki.yml"])
    config["ruler_storage"]["local"]["directory"] = f"{tree}/logs/rules"
    data = config["common"]["path_prefix"]
    service: dict[str, Any] = {
        "image": LOKI_IMAGE,
        "hostname": "loki",
        "command": [f"-config.file={tree}/{LOKI_FILE}", "-config.expand-env=true"],
        "restart": "unless-stopped",
        "volumes": [dict(mount), {"type": "volume", "source": "loki-data", "target": data}],
        "ports": [f"${{GPUFED_LOKI_PORT:-{LOKI_PORT}}}:{config['server']['http_listen_port']}"],
        "healthcheck": {
            "test": [
                "CMD",
                "/busybox/wget",
                "-qO-",
                f"http://127.0.0.1:{config['server']['http_listen_port']}/ready",
            ],
            "interval": "30s",
            "timeout": "5s",
            "retries": 3,
            "start_period": "30s",
        },
    }
    store = config["storage_config"]["object_store"]
    if "filesystem" in store:  # one machine: the bucket volume Thanos writes to
        service["volumes"].append(
            {"type": "volume", "source": "thanos-bucket", "target": store["filesystem"]["dir"]}
        )
        volumes["thanos-bucket"] = {}
    env = secrets_env(files)
    if env:
        service["environment"] = env
    if compose_objstore.INIT in services:  # the bucket and Loki's prefix exist first
        service["depends_on"] = dict(compose_objstore.INIT_DONE)
    services["loki"] = service
    volumes["loki-data"] = {}
    return {LOKI_FILE: dump_yaml(config)}
