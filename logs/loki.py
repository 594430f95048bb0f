"""Pure renderer: the spec in, Loki's config out, stored in the bucket Thanos already uses.

Pipeline position: ``logs.render`` writes ``logs/loki.yml`` (single binary, ``-target=all``,
what compose runs) and ``logs/loki-scalable.yml`` (one file for the simple-scalable
``-target=read|write|backend`` trio, rings over memberlist, what Kubernetes runs).

Storage: Loki 3.4+ can use the Thanos object-store client (``storage_config.
use_thanos_objstore``), so the bucket in ``thanos.objstore`` maps field for field
(grafana/loki pkg/storage/bucket/client.go@044402b2 ``Config``; s3/config.go@0321ffc2;
oss/config.go@74f3b953; filesystem/config.go@1d397605) and ``storage_prefix`` keeps Loki's
objects under their own prefix, beside Thanos' blocks. Secrets stay references: Thanos'
``$(VAR)`` becomes Loki's ``${VAR}`` (``-config.expand-env=true``), and ``logs/secrets.json``
says where each comes from, as ``thanos/secrets.json`` does.

Retention is the compactor's (``retention_enabled`` with ``limits_config.retention_period``),
so the delete-request store names the same backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from logs.models import LogsSpec
from thanos.objstore import ObjstoreSpec
from thanos.render import objstore_document

CONFIG_FILE = "logs/loki.yml"
SCALABLE_FILE = "logs/loki-scalable.yml"
SECRETS_FILE = "logs/secrets.json"
SCHEMA_FROM = "2024-04-01"
#: Thanos objstore type -> (Loki backend name in schema_config, key under object_store).
BACKENDS = {
    "S3": ("s3", "s3"),
    "ALIYUNOSS": ("alibabacloud", "alibaba"),
    "FILESYSTEM": ("filesystem", "filesystem"),
}
MEMBERLIST_PORT = 7946
_THANOS_VAR = re.compile(r"^\$\(([A-Za-z_][A-Za-z0-9_]*)\)\Z")


def _expand(value: Any) -> Any:
    match = _THANOS_VAR.match(str(value)) if isinstance(value, str) else None
    return f"${{{match[1]}}}" if match else value


def object_store(
    store: ObjstoreSpec, *, prefix: str
) -> tuple[str, dict[str, Any], dict[str, dict[str, str]]]:
    """(schema backend, ``storage_config.object_store`` block, secret variables) for the bucket."""
    document, secrets = objstore_document(store)
    backend, key = BACKENDS[document["type"]]
    config = {k: _expand(v) for k, v in document["config"].items()}
    if document["type"] == "S3":
        block: dict[str, Any] = {
            "bucket_name": config["bucket"],
            "endpoint": config["endpoint"],
            "insecure": config.get("insecure", False),
        }
        if "region" in config:
            block["region"] = config["region"]
        if "access_key" in config:
            block["access_key_id"] = config["access_key"]
            block["secret_access_key"] = config["secret_key"]
        sse = config.get("sse_config")
        if sse:
            if sse["type"] == "SSE-C":
                raise ValueError(
                    "Loki's S3 client supports SSE-S3 and SSE-KMS, not SSE-C (thanos.objstore.config.sse)"
                )
            block["sse"] = {k: v for k, v in sse.items() if k in ("type", "kms_key_id")}
    elif document["type"] == "ALIYUNOSS":
        block = {
            "endpoint": config["endpoint"],
            "bucket": config["bucket"],
            "access_key_id": config["access_key_id"],
            "access_key_secret": config["access_key_secret"],
        }
    else:
        block = {"dir": config["directory"]}
    return backend, {key: block, "storage_prefix": prefix}, secrets


def _common(logs: LogsSpec, *, backend: str, store: dict[str, Any]) -> dict[str, Any]:
    data = logs.loki.data_dir.rstrip("/")
    return {
        "auth_enabled": bool(logs.loki.tenant),
        "server": {
            "http_listen_port": logs.loki.http_port,
            "grpc_listen_port": logs.loki.grpc_port,
            "log_level": "info",
        },
        "schema_config": {
            "configs": [
                {
                    "from": SCHEMA_FROM,
                    "store": "tsdb",
                    "object_store": backend,
                    "schema": "v13",
                    "index": {"prefix": "index_", "period": "24h"},
                }
            ]
        },
        "storage_config": {
            "use_thanos_objstore": True,
            "object_store": store,
            "tsdb_shipper": {
                "active_index_directory": f"{data}/tsdb-index",
                "cache_location": f"{data}/tsdb-cache",
            },
        },
        "compactor": {
            "working_directory": f"{data}/compactor",
            "retention_enabled": True,
            "delete_request_store": backend,
            "compaction_interval": "10m",
        },
        "limits_config": {"retention_period": logs.retention_hours(), "allow_structured_metadata": True},
    }


def _ruler(
    logs: LogsSpec, *, rules_dir: str, alertmanagers: Sequence[str], remote_write: str | None
) -> dict[str, Any]:
    data = logs.loki.data_dir.rstrip("/")
    ruler: dict[str, Any] = {
        "rule_path": f"{data}/ruler-scratch",
        "enable_api": True,
        "evaluation_interval": logs.ruler.evaluation_interval,
        "wal": {"dir": f"{data}/ruler-wal"},
    }
    if alertmanagers:
        ruler["alertmanager_url"] = ",".join(alertmanagers)
    if remote_write:
        ruler["remote_write"] = {"enabled": True, "clients": {"gpufed": {"url": remote_write}}}
    return ruler


def loki_config(
    logs: LogsSpec,
    *,
    objstore: ObjstoreSpec,
    rules_dir: str,
    alertmanagers: Sequence[str] = (),
    remote_write: str | None = None,
    scalable_members: str | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """Loki's config and the secret variables it expands.

    ``scalable_members``: the memberlist join address of a simple-scalable deployment
    (its headless Service); ``None`` renders the single binary with in-memory rings.
    """
    backend, store, secrets = object_store(objstore, prefix=logs.storage_prefix)
    config = _common(logs, backend=backend, store=store)
    config["ruler"] = _ruler(
        logs, rules_dir=rules_dir, alertmanagers=alertmanagers, remote_write=remote_write
    )
    config["ruler_storage"] = {"backend": "local", "local": {"directory": rules_dir}}
    common: dict[str, Any] = {"path_prefix": logs.loki.data_dir}
    if scalable_members is None:
        config["target"] = "all"
        common |= {
            "replication_factor": 1,
            "ring": {"kvstore": {"store": "inmemory"}},
            "instance_addr": "127.0.0.1",
        }
    else:
        # -target=read|write|backend comes from each Deployment's args; rings gossip.
        common |= {
            "replication_factor": 3,
            "ring": {"kvstore": {"store": "memberlist"}},
            "compactor_address": f"http://{logs.loki.host}-backend:{logs.loki.http_port}",
        }
        config["memberlist"] = {
            "join_members": [f"{scalable_members}:{MEMBERLIST_PORT}"],
            "bind_port": MEMBERLIST_PORT,
        }
    config["common"] = common
    return config, secrets
