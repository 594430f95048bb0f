"""The bundled object store in ``compose/monitoring.yml``: ``minio`` and ``bucket-init``.

Called by ``federation.master.compose.render_compose_bundle`` when the spec's S3 endpoint
is this service (``minio:9000``). The image is the community MinIO build the image table
names (federation/master/images.py says why not Docker Hub's ``minio/minio``).

A fresh store has no bucket, and Thanos receive/store/compactor and Loki fail on a missing
one, so ``bucket-init`` runs once before them (they wait with ``service_completed_successfully``):
``mc mb --ignore-existing`` makes the bucket, and a zero-byte marker under each prefix the
spec gives Thanos (``objstore.prefix``) and Loki (``logs.storage_prefix``) makes the
prefix visible to ``mc ls``. Both steps succeed again on a store that has them, so a
restart or ``up -d`` after a render is harmless. Thanos and Loki skip objects whose names
are not theirs (a block is a ULID directory; Loki reads its own index/chunk paths).
"""

from __future__ import annotations

import shlex
from typing import Any

from federation.master import images

HOST = "minio"
INIT = "bucket-init"
PORT = 9000
MARKER = ".gpufed-prefix"
#: Services that read or write the bucket wait for this.
INIT_DONE = {INIT: {"condition": "service_completed_successfully"}}


def init_script(*, bucket: str, prefixes: list[str]) -> str:
    """The ``sh -c`` script of ``bucket-init``. ``$$``: compose leaves ``$NAME`` to the shell."""
    target = f"gpufed/{bucket}"
    lines = [
        "set -eu",
        f'mc alias set gpufed http://{HOST}:{PORT} "$$MINIO_ROOT_USER" "$$MINIO_ROOT_PASSWORD"',
        f"mc mb --ignore-existing {shlex.quote(target)}",
    ]
    for prefix in sorted(set(p.strip("/") for p in prefixes if p.strip("/"))):
        lines.append(f"printf '' | mc pipe {shlex.quote(f'{target}/{prefix}/{MARKER}')}")
    lines.append(f"mc ls {shlex.quote(target)}")
    return "\n".join(lines)


def object_store_services(
    services: dict[str, dict[str, Any]],
    volumes: dict[str, dict[str, Any]],
    *,
    bucket: str,
    access_key: str,
    secret_key: str,
    prefixes: list[str],
    console_port: str,
) -> None:
    """Add ``minio`` and ``bucket-init``; ``access_key``/``secret_key``: compose ``${VAR}`` refs."""
    credentials = {"MINIO_ROOT_USER": access_key, "MINIO_ROOT_PASSWORD": secret_key}
    services[HOST] = {
        "image": images.ref("object-store"),
        "hostname": HOST,
        "command": ["server", "/data", "--console-address", ":9001"],
        "restart": "unless-stopped",
        "environment": dict(credentials),
        "ports": [f"{console_port}:9001"],
        "volumes": [{"type": "volume", "source": "minio-data", "target": "/data"}],
        "healthcheck": {
            "test": ["CMD", "mc", "ready", "local"],
            "interval": "10s",
            "timeout": "5s",
            "retries": 6,
            "start_period": "10s",
        },
    }
    volumes["minio-data"] = {}
    services[INIT] = {
        "image": images.ref("object-store"),
        "hostname": INIT,
        "entrypoint": ["sh", "-c", init_script(bucket=bucket, prefixes=prefixes)],
        "restart": "on-failure",
        "environment": dict(credentials),
        "depends_on": {HOST: {"condition": "service_healthy"}},
    }
