"""Loki's config structs as strict models: what ``loki -config.file`` would refuse, refused here.

Loki parses its file strictly (dskit ``cfg`` with ``yaml.UnmarshalStrict``: an unknown key
stops it at startup). Field names follow grafana/loki:

- ``ConfigWrapper``/``loki.Config`` top level: pkg/loki/loki.go (``target``, ``auth_enabled``,
  ``server``, ``common``, ``schema_config``, ``storage_config``, ``compactor``,
  ``limits_config``, ``ruler``, ``ruler_storage``, ``memberlist``)
- ``common.Config``: pkg/loki/common/common.go@03c5a7cf (``path_prefix``, ``replication_factor``,
  ``ring``, ``instance_addr``, ``compactor_address``)
- ``bucket.Config`` (the Thanos objstore client): pkg/storage/bucket/client.go@044402b2,
  ``s3.Config`` s3/config.go@0321ffc2, ``oss.Config`` oss/config.go@74f3b953,
  ``filesystem.Config`` filesystem/config.go@1d397605
- ``config.PeriodConfig``: pkg/storage/config/schema_config.go (``from``, ``store``,
  ``object_store``, ``schema``, ``index.prefix``/``period``)

Large structs (``server``, ``limits_config``, ``ruler``, ``compactor``) are modelled on the
fields gpufed writes plus their close neighbours; anything else is refused, a false alarm
rather than a silent pass. This is a stand-in for Loki's parser, validated against its
documented reference and sources, not Loki itself.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from logs.promtail_structs import GoStruct

BACKENDS = ("s3", "gcs", "azure", "swift", "filesystem", "alibabacloud", "bos")
_PREFIX = re.compile(r"^[\da-zA-Z-]+\Z")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+\Z")


def _duration(value: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"not a Loki duration: {value!r}")
    return value


class Server(GoStruct):
    http_listen_address: str = ""
    http_listen_port: int = 3100
    grpc_listen_address: str = ""
    grpc_listen_port: int = 9095
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"
    http_server_read_timeout: str = "30s"
    http_server_write_timeout: str = "30s"


class KVStore(GoStruct):
    store: Literal["consul", "etcd", "inmemory", "memberlist", "multi"] = "consul"
    prefix: str = "collectors/"


class Ring(GoStruct):
    kvstore: KVStore = Field(default_factory=KVStore)
    heartbeat_period: str = "15s"
    heartbeat_timeout: str = "1m"
    instance_addr: str = ""


class Common(GoStruct):
    path_prefix: str = ""
    replication_factor: int = Field(default=3, ge=1)
    ring: Ring = Field(default_factory=Ring)
    instance_addr: str = ""
    instance_interface_names: list[str] = Field(default_factory=list)
    compactor_address: str = ""
    persist_tokens: bool = False


class IndexConfig(GoStruct):
    prefix: str = Field(min_length=1)
    period: Literal["24h"]  # tsdb requires daily index tables


class PeriodConfig(GoStruct):
    from_: str = Field(alias="from", pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
    store: Literal["tsdb", "boltdb-shipper"]
    object_store: str
    schema_: Literal["v11", "v12", "v13"] = Field(alias="schema")
    index: IndexConfig

    @model_validator(mode="after")
    def _v13_tsdb(self) -> PeriodConfig:
        if self.schema_ == "v13" and self.store != "tsdb":
            raise ValueError("schema v13 needs store tsdb")
        return self


class SchemaConfig(GoStruct):
    configs: list[PeriodConfig] = Field(min_length=1)


class S3Bucket(GoStruct):
    endpoint: str = ""
    region: str = ""
    bucket_name: str = Field(min_length=1)
    secret_access_key: str = ""
    access_key_id: str = ""
    insecure: bool = False
    signature_version: Literal["v4", "v2"] = "v4"
    storage_class: str = "STANDARD"
    sse: dict[Literal["type", "kms_key_id", "kms_encryption_context"], str] = Field(default_factory=dict)
    http: dict[str, str | int | bool] = Field(default_factory=dict)

    @field_validator("endpoint")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        if "://" in value:
            raise ValueError("Loki's S3 endpoint is hostname:port without a scheme")
        return value


class OSSBucket(GoStruct):
    endpoint: str = Field(min_length=1)
    bucket: str = Field(min_length=1)
    access_key_id: str = ""
    access_key_secret: str = ""


class FilesystemBucket(GoStruct):
    dir: str = Field(min_length=1)


class ObjectStore(GoStruct):
    """``bucket.Config``: one backend block plus ``storage_prefix``."""

    s3: S3Bucket | None = None
    alibaba: OSSBucket | None = None
    filesystem: FilesystemBucket | None = None
    storage_prefix: str = ""

    @field_validator("storage_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and not _PREFIX.match(value):
            raise ValueError("storage prefix contains invalid characters (digits, letters and dashes only)")
        return value

    def backend(self) -> str:
        present = [
            name
            for name, block in (
                ("s3", self.s3),
                ("alibabacloud", self.alibaba),
                ("filesystem", self.filesystem),
            )
            if block is not None
        ]
        if len(present) != 1:
            raise ValueError(f"object_store configures {len(present)} backends; gpufed renders exactly one")
        return present[0]


class TSDBShipper(GoStruct):
    active_index_directory: str = Field(min_length=1)
    cache_location: str = Field(min_length=1)
    cache_ttl: str = "24h"


class StorageConfig(GoStruct):
    use_thanos_objstore: bool = False
    object_store: ObjectStore | None = None
    tsdb_shipper: TSDBShipper | None = None

    @model_validator(mode="after")
    def _thanos(self) -> StorageConfig:
        if self.use_thanos_objstore and self.object_store is None:
            raise ValueError("use_thanos_objstore needs an object_store block")
        return self


class Compactor(GoStruct):
    working_directory: str = Field(min_length=1)
    compaction_interval: str = "10m"
    retention_enabled: bool = False
    retention_delete_delay: str = "2h"
    delete_request_store: str = ""

    @model_validator(mode="after")
    def _delete_store(self) -> Compactor:
        # Loki refuses retention without a store for delete requests (since 3.0).
        if self.retention_enabled and not self.delete_request_store:
            raise ValueError("retention_enabled needs delete_request_store")
        return self


class Limits(GoStruct):
    retention_period: str = "0s"
    allow_structured_metadata: bool = True
    volume_enabled: bool = False
    ingestion_rate_mb: float = 4
    ingestion_burst_size_mb: float = 6

    @field_validator("retention_period")
    @classmethod
    def _period(cls, value: str) -> str:
        return _duration(value)


class RemoteWriteClient(GoStruct):
    url: str = Field(pattern=r"^https?://")
    remote_timeout: str = "30s"
    headers: dict[str, str] = Field(default_factory=dict)


class RulerRemoteWrite(GoStruct):
    enabled: bool = False
    clients: dict[str, RemoteWriteClient] = Field(default_factory=dict)


class RulerWAL(GoStruct):
    dir: str = Field(min_length=1)


class Ruler(GoStruct):
    rule_path: str = ""
    enable_api: bool = False
    evaluation_interval: str = "1m"
    alertmanager_url: str = ""
    wal: RulerWAL | None = None
    remote_write: RulerRemoteWrite = Field(default_factory=RulerRemoteWrite)

    @field_validator("alertmanager_url")
    @classmethod
    def _urls(cls, value: str) -> str:
        for url in filter(None, value.split(",")):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"alertmanager_url entries are URLs, got {url!r}")
        return value


class LocalRuleStore(GoStruct):
    directory: str = Field(min_length=1)


class RulerStorage(GoStruct):
    backend: Literal["local", "s3", "gcs", "azure", "swift", "filesystem", "alibabacloud", "bos"]
    local: LocalRuleStore | None = None


class Memberlist(GoStruct):
    join_members: list[str] = Field(default_factory=list)
    bind_port: int = 7946


class LokiConfig(GoStruct):
    target: str = "all"
    auth_enabled: bool = True
    server: Server = Field(default_factory=Server)
    common: Common = Field(default_factory=Common)
    schema_config: SchemaConfig
    storage_config: StorageConfig
    compactor: Compactor | None = None
    limits_config: Limits = Field(default_factory=Limits)
    ruler: Ruler | None = None
    ruler_storage: RulerStorage | None = None
    memberlist: Memberlist | None = None

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        known = {"all", "read", "write", "backend"}
        if not set(value.split(",")) <= known:
            raise ValueError(f"gpufed runs Loki as one of {sorted(known)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cross(self) -> LokiConfig:
        store = self.storage_config.object_store
        if store is not None:
            backend = store.backend()
            for period in self.schema_config.configs:
                if period.object_store != backend:
                    raise ValueError(
                        f"schema_config names object_store {period.object_store!r} but storage_config"
                        f" configures {backend!r}"
                    )
            if (
                self.compactor is not None
                and self.compactor.retention_enabled
                and self.compactor.delete_request_store != backend
            ):
                raise ValueError("compactor.delete_request_store must name the configured backend")
        if self.common.ring.kvstore.store == "memberlist" and (
            self.memberlist is None or not self.memberlist.join_members
        ):
            raise ValueError("rings in memberlist need memberlist.join_members")
        return self
