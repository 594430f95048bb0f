"""Pure renderers: ``ThanosSpec`` in, Thanos files and per-component arguments out.

Pipeline position: ``federation.master.pipeline.thanos_part`` calls ``render_thanos_bundle``
with the master instances (sidecar mode runs one sidecar beside each); the bundle
lands under ``thanos/`` in the output tree::

    thanos/hashrings.json   receive mode: tenant rings in spec order, the catch-all last
    thanos/objstore.yml     bucket config; secrets appear only as $(VAR) references
    thanos/secrets.json     VAR -> {env: NAME} | {file: PATH}: what the launcher exports
    thanos/<component>.json {"component": c, "instances": {name: {"args": [...], ...}}}

Thanos expands ``$(VAR)`` in ``--objstore.config-file`` at startup (extkingpin's env
substitution, Kubernetes syntax) and refuses unset variables, so a key never sits in a
file that gets logged or committed. Dumping happens in ``sharder.kernel.output``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sharder.kernel.output import Bundle, dump_json, dump_yaml
from thanos.models import RECEIVE_REPLICA_LABEL, EndpointSpec, ReceiveSpec, ThanosSpec
from thanos.objstore import ObjstoreSpec, OSSStore, S3Store, SecretRef

HASHRINGS_FILE = "thanos/hashrings.json"
OBJSTORE_FILE = "thanos/objstore.yml"
SECRETS_FILE = "thanos/secrets.json"


@dataclass(frozen=True)
class MasterInstance:
    """What a sidecar needs of the master Prometheus beside it."""

    name: str
    prometheus_url: str
    tsdb_path: str
    host: str


def secret_variable(ref: SecretRef, *, default: str) -> str:
    """The variable Thanos expands: the env name itself, or ``default`` filled from a file."""
    return ref.env if ref.env is not None else default


def _secret(ref: SecretRef, default: str, secrets: dict[str, dict[str, str]]) -> str:
    name = secret_variable(ref, default=default)
    secrets[name] = {"env": name} if ref.env is not None else {"file": str(ref.file)}
    return f"$({name})"


def objstore_document(store: ObjstoreSpec) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """``objstore.yml`` as a dict, and the secret variables it references."""
    secrets: dict[str, dict[str, str]] = {}
    config: dict[str, Any]
    if isinstance(store, S3Store):
        s3 = store.config
        config = {"bucket": s3.bucket, "endpoint": s3.endpoint, "insecure": s3.insecure}
        if s3.region:
            config["region"] = s3.region
        if s3.access_key is not None and s3.secret_key is not None:
            config["access_key"] = _secret(s3.access_key, "GPUFED_S3_ACCESS_KEY", secrets)
            config["secret_key"] = _secret(s3.secret_key, "GPUFED_S3_SECRET_KEY", secrets)
        if s3.sse is not None:
            sse: dict[str, Any] = {"type": s3.sse.type}
            if s3.sse.kms_key_id:
                sse["kms_key_id"] = s3.sse.kms_key_id
            if s3.sse.encryption_key_file:
                sse["encryption_key"] = s3.sse.encryption_key_file  # a path: Thanos reads the key itself
            config["sse_config"] = sse
    elif isinstance(store, OSSStore):
        oss = store.config
        config = {
            "endpoint": oss.endpoint,
            "bucket": oss.bucket,
            "access_key_id": _secret(oss.access_key_id, "GPUFED_OSS_ACCESS_KEY_ID", secrets),
            "access_key_secret": _secret(oss.access_key_secret, "GPUFED_OSS_ACCESS_KEY_SECRET", secrets),
        }
    else:
        config = {"directory": store.config.directory}
    document: dict[str, Any] = {"type": store.type, "config": config}
    if store.prefix:
        document["prefix"] = store.prefix
    return document, secrets


def hashrings_document(receive: ReceiveSpec) -> list[dict[str, Any]]:
    """Tenant rings in spec order, then the catch-all: Thanos takes the first ring that matches."""
    ordered = [r for r in receive.hashrings if r.tenants] + [r for r in receive.hashrings if not r.tenants]
    rings = []
    for ring in ordered:
        entry: dict[str, Any] = {
            "hashring": ring.name,
            "algorithm": receive.algorithm,
            "endpoints": [
                {"address": e.address, "az": e.az} if e.az else {"address": e.address} for e in ring.endpoints
            ],
        }
        if ring.tenants:
            entry["tenants"] = list(ring.tenants)
            entry["tenant_matcher_type"] = ring.tenant_matcher_type
        rings.append(entry)
    return rings


def _path(thanos: ThanosSpec, name: str) -> str:
    return f"{thanos.config_dir.rstrip('/')}/{name}"


def _tenancy_args(receive: ReceiveSpec) -> list[str]:
    return [
        f"--receive.tenant-header={receive.tenant_header}",
        f"--receive.default-tenant-id={receive.default_tenant}",
        f"--receive.tenant-label-name={receive.tenant_label}",
    ]


def _ring_args(thanos: ThanosSpec, receive: ReceiveSpec) -> list[str]:
    return [
        f"--receive.hashrings-file={_path(thanos, 'hashrings.json')}",
        f"--receive.hashrings-algorithm={receive.algorithm}",
        f"--receive.replication-factor={receive.replication_factor}",
    ]


def ingestor_args(thanos: ThanosSpec, endpoint: EndpointSpec) -> list[str]:
    """One ingestor; without routers it also routes (hashrings file + local endpoint)."""
    receive = thanos.receive
    assert receive is not None
    args = [
        "receive",
        f"--grpc-address=0.0.0.0:{endpoint.grpc_port}",
        f"--http-address=0.0.0.0:{endpoint.http_port}",
        f"--remote-write.address=0.0.0.0:{endpoint.remote_write_port}",
        f"--tsdb.path={receive.data_dir}",
        f"--tsdb.retention={receive.retention}",
        f"--objstore.config-file={_path(thanos, 'objstore.yml')}",
        f'--label={RECEIVE_REPLICA_LABEL}="{endpoint.address}"',
        f"--receive.local-endpoint={endpoint.address}",
        *_tenancy_args(receive),
    ]
    if not receive.routers:
        args += _ring_args(thanos, receive)
    return args


def receive_instances(thanos: ThanosSpec) -> dict[str, dict[str, Any]]:
    receive = thanos.receive
    assert receive is not None
    role = "ingestor" if receive.routers else "router-ingestor"
    instances: dict[str, dict[str, Any]] = {}
    for ring in receive.hashrings:
        for i, endpoint in enumerate(ring.endpoints):
            instances[f"{ring.name}-{i}"] = {
                "role": role,
                "hashring": ring.name,
                "args": ingestor_args(thanos, endpoint),
            }
    for router in receive.routers:
        instances[router.name] = {
            "role": "router",
            "args": [
                "receive",
                f"--grpc-address=0.0.0.0:{router.grpc_port}",
                f"--http-address=0.0.0.0:{router.http_port}",
                f"--remote-write.address=0.0.0.0:{router.remote_write_port}",
                f'--label={RECEIVE_REPLICA_LABEL}="{router.name}"',
                *_ring_args(thanos, receive),
                *_tenancy_args(receive),
            ],
        }
    return instances


def query_args(thanos: ThanosSpec, *, masters: Sequence[MasterInstance]) -> list[str]:
    """Every StoreAPI as a DNS-resolved endpoint, and every label that marks a duplicate copy."""
    labels = list(thanos.query.replica_labels)
    endpoints: list[str] = []
    if thanos.receive is not None:
        if RECEIVE_REPLICA_LABEL not in labels:
            labels.append(RECEIVE_REPLICA_LABEL)  # replication_factor copies differ only by it
        endpoints += [f"dns+{e.address}" for e in thanos.receive.ingestors()]
    else:
        endpoints += [f"dns+{m.host}:{thanos.sidecar.grpc_port}" for m in masters]
    endpoints.append(f"dns+{thanos.store.host}:{thanos.store.grpc_port}")
    endpoints += thanos.query.endpoints
    return [
        "query",
        f"--http-address=0.0.0.0:{thanos.query.http_port}",
        f"--grpc-address=0.0.0.0:{thanos.query.grpc_port}",
        *(f"--query.replica-label={label}" for label in labels),
        *(f"--endpoint={endpoint}" for endpoint in endpoints),
    ]


def store_args(thanos: ThanosSpec) -> list[str]:
    return [
        "store",
        f"--data-dir={thanos.store.data_dir}",
        f"--objstore.config-file={_path(thanos, 'objstore.yml')}",
        f"--grpc-address=0.0.0.0:{thanos.store.grpc_port}",
        f"--http-address=0.0.0.0:{thanos.store.http_port}",
    ]


def compact_args(thanos: ThanosSpec) -> list[str]:
    compactor = thanos.compactor
    return [
        "compact",
        "--wait",
        f"--data-dir={compactor.data_dir}",
        f"--objstore.config-file={_path(thanos, 'objstore.yml')}",
        f"--http-address=0.0.0.0:{compactor.http_port}",
        f"--retention.resolution-raw={compactor.retention_raw}",
        f"--retention.resolution-5m={compactor.retention_5m}",
        f"--retention.resolution-1h={compactor.retention_1h}",
    ]


def sidecar_args(thanos: ThanosSpec, master: MasterInstance) -> list[str]:
    return [
        "sidecar",
        f"--tsdb.path={master.tsdb_path}",
        f"--prometheus.url={master.prometheus_url}",
        f"--objstore.config-file={_path(thanos, 'objstore.yml')}",
        f"--grpc-address=0.0.0.0:{thanos.sidecar.grpc_port}",
        f"--http-address=0.0.0.0:{thanos.sidecar.http_port}",
    ]


def _component(name: str, instances: dict[str, dict[str, Any]]) -> bytes:
    return dump_json({"component": name, "instances": instances})


def render_thanos_bundle(thanos: ThanosSpec, *, masters: Sequence[MasterInstance]) -> Bundle:
    """Every Thanos file for the spec's mode, keyed by path relative to the output dir."""
    objstore, secrets = objstore_document(thanos.objstore)
    bundle: Bundle = {
        OBJSTORE_FILE: dump_yaml(objstore),
        "thanos/query.json": _component("query", {"query": {"args": query_args(thanos, masters=masters)}}),
        "thanos/store.json": _component("store", {"store": {"args": store_args(thanos)}}),
        "thanos/compact.json": _component("compact", {"compact": {"args": compact_args(thanos)}}),
    }
    if secrets:
        bundle[SECRETS_FILE] = dump_json(secrets)
    if thanos.receive is not None:
        bundle[HASHRINGS_FILE] = dump_json(hashrings_document(thanos.receive))
        bundle["thanos/receive.json"] = _component("receive", receive_instances(thanos))
    else:
        sidecars = {f"sidecar-{m.name}": {"master": m.name, "args": sidecar_args(thanos, m)} for m in masters}
        bundle["thanos/sidecar.json"] = _component("sidecar", sidecars)
    return bundle
