"""The ``thanos:`` section of federation.yaml: typed, validated, nothing rendered here.

``thanos.render`` turns it into ``hashrings.json``, ``objstore.yml`` and per-component
argument files. Two checks live here because Thanos would accept the input and then lose
data or fail at runtime: a replication factor above a ring's endpoints (ketama refuses to
build the ring) and retention shorter than the age at which the compactor downsamples.

    thanos:
      mode: receive                     # or sidecar (uploads the master's blocks)
      objstore: {type: FILESYSTEM, config: {directory: /var/lib/thanos/bucket}}
      receive:
        hashrings:
          - {name: default, endpoints: [{address: "receive-0:10901", az: a}]}
      compactor: {retention_raw: 30d, retention_5m: 90d, retention_1h: 1y}

The object store lives in ``thanos.objstore`` (secrets there are references, never values).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sharder.kernel.models import LABEL_NAME_RE, NAME_RE, StrictModel, parse_duration
from thanos.objstore import ObjstoreSpec

HOST_PORT_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:\d{1,5}$")
#: The compactor makes 5m blocks from raw data older than 40 h and 1h blocks from 5m data
#: older than 10 d (Thanos compactor docs); a shorter retention deletes the source first.
RAW_MIN_S = 40 * 3600
FIVE_MIN_MIN_S = 10 * 86400
#: Copies of one series differ only in these labels, so Query deduplicates on them.
#: ``replica`` tells HA children (and masters) apart. ``shard`` is safe too: two shards
#: never scrape the same target except during a make-before-break hand-over, when the old
#: and the new owner both scrape it and their series differ only in the children's
#: ``shard`` (and ``replica``) external labels; the target's own labels do not change. So
#: series of one target from different shards are copies, and Query keeps one of them.
DEFAULT_REPLICA_LABELS = ("replica", "shard")
RECEIVE_REPLICA_LABEL = "receive_replica"


def _host_port(value: str, what: str) -> str:
    if "://" in value or not HOST_PORT_RE.match(value):
        raise ValueError(f"{what} must be host:port without a scheme, got {value!r}")
    return value


class EndpointSpec(StrictModel):
    """One ingestor: its gRPC address (what the hashring names) and availability zone."""

    address: str
    az: str = ""
    http_port: int = Field(default=10902, ge=1, le=65535)
    remote_write_port: int = Field(default=19291, ge=1, le=65535)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value, "endpoint address")

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def grpc_port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


class HashringSpec(StrictModel):
    name: str
    tenants: list[str] = Field(default_factory=list, description="empty: the catch-all ring, rendered last")
    tenant_matcher_type: Literal["exact", "glob"] = "exact"
    endpoints: list[EndpointSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("hashring names are lower-case letters, digits and '-'")
        return value


class RouterSpec(StrictModel):
    name: str
    host: str
    http_port: int = Field(default=10902, ge=1, le=65535)
    grpc_port: int = Field(default=10901, ge=1, le=65535)
    remote_write_port: int = Field(default=19291, ge=1, le=65535)


class ReceiveSpec(StrictModel):
    algorithm: Literal["ketama", "hashmod"] = "ketama"
    replication_factor: int = Field(default=1, ge=1)
    tenant_header: str = "THANOS-TENANT"
    default_tenant: str = "default-tenant"
    tenant_label: str = "tenant_id"
    retention: str = Field(default="15d", description="local TSDB before blocks live only in the bucket")
    data_dir: str = "/var/lib/thanos/receive"
    hashrings: list[HashringSpec] = Field(min_length=1)
    routers: list[RouterSpec] = Field(
        default_factory=list, description="split mode: stateless routers in front of the ingestors"
    )
    url: str | None = Field(
        default=None, description="remote-write URL the master uses; default: first router"
    )

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("tenant_label")
    @classmethod
    def _label(cls, value: str) -> str:
        if not LABEL_NAME_RE.match(value):
            raise ValueError(f"not a valid label name: {value!r}")
        return value

    @model_validator(mode="after")
    def _rings(self) -> ReceiveSpec:
        names = [ring.name for ring in self.hashrings]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate hashring names: {dupes}")
        catch_all = [ring.name for ring in self.hashrings if not ring.tenants]
        if len(catch_all) > 1:
            raise ValueError(
                f"only one hashring may have no tenants (it takes every other tenant): {catch_all}"
            )
        for ring in self.hashrings:
            if self.replication_factor > len(ring.endpoints):
                raise ValueError(
                    f"replication_factor {self.replication_factor} exceeds the"
                    f" {len(ring.endpoints)} endpoints of hashring {ring.name!r};"
                    " Thanos Receive would refuse the ring"
                )
            zoned = {bool(e.az) for e in ring.endpoints}
            if len(zoned) > 1:
                raise ValueError(f"hashring {ring.name!r} mixes endpoints with and without az")
            if any(e.az for e in ring.endpoints) and self.algorithm != "ketama":
                raise ValueError("az-aware endpoints need algorithm ketama (hashmod refuses them)")
        addresses = [e.address for ring in self.hashrings for e in ring.endpoints]
        dupes = sorted({a for a in addresses if addresses.count(a) > 1})
        if dupes:
            raise ValueError(f"an ingestor belongs to one hashring: {dupes} listed twice")
        return self

    def ingestors(self) -> list[EndpointSpec]:
        return [e for ring in self.hashrings for e in ring.endpoints]


class QuerySpec(StrictModel):
    replica_labels: list[str] = Field(default_factory=lambda: list(DEFAULT_REPLICA_LABELS))
    endpoints: list[str] = Field(
        default_factory=list, description="extra StoreAPIs, e.g. dnssrv+_grpc._tcp.x"
    )
    http_port: int = Field(default=10904, ge=1, le=65535)
    grpc_port: int = Field(default=10903, ge=1, le=65535)

    @field_validator("replica_labels")
    @classmethod
    def _labels(cls, values: list[str]) -> list[str]:
        for value in values:
            if not LABEL_NAME_RE.match(value):
                raise ValueError(f"not a valid label name: {value!r}")
        return values


class StoreSpec(StrictModel):
    host: str = "thanos-store"
    grpc_port: int = Field(default=10901, ge=1, le=65535)
    http_port: int = Field(default=10902, ge=1, le=65535)
    data_dir: str = "/var/lib/thanos/store"


def _retention(value: str) -> str:
    parse_duration(value)
    return value


class CompactorSpec(StrictModel):
    """Retention per resolution; ``0d`` keeps that resolution forever (Thanos' default)."""

    retention_raw: str = "30d"
    retention_5m: str = "90d"
    retention_1h: str = "1y"
    data_dir: str = "/var/lib/thanos/compact"
    http_port: int = Field(default=10902, ge=1, le=65535)

    @field_validator("retention_raw", "retention_5m", "retention_1h")
    @classmethod
    def _duration(cls, value: str) -> str:
        return _retention(value)

    @model_validator(mode="after")
    def _downsampling_guard(self) -> CompactorSpec:
        raw, five = parse_duration(self.retention_raw), parse_duration(self.retention_5m)
        if 0 < raw < RAW_MIN_S:
            raise ValueError(
                f"retention_raw {self.retention_raw} is shorter than 40h: the compactor builds 5m blocks only"
                " from raw data older than 40h, so raw blocks would be deleted before they are downsampled"
            )
        if 0 < five < FIVE_MIN_MIN_S:
            raise ValueError(
                f"retention_5m {self.retention_5m} is shorter than 10d: the compactor builds 1h blocks only"
                " from 5m data older than 10d, so 5m blocks would be deleted before they are downsampled"
            )
        return self


class SidecarSpec(StrictModel):
    grpc_port: int = Field(default=10911, ge=1, le=65535)
    http_port: int = Field(default=10912, ge=1, le=65535)


class ThanosSpec(StrictModel):
    mode: Literal["receive", "sidecar"] = "receive"
    config_dir: str = Field(default="/etc/gpufed/thanos", description="where thanos/ files are deployed")
    objstore: ObjstoreSpec
    receive: ReceiveSpec | None = None
    query: QuerySpec = Field(default_factory=QuerySpec)
    store: StoreSpec = Field(default_factory=StoreSpec)
    compactor: CompactorSpec = Field(default_factory=CompactorSpec)
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)

    @model_validator(mode="after")
    def _mode(self) -> ThanosSpec:
        if self.mode == "receive" and self.receive is None:
            raise ValueError("mode receive needs a receive section with at least one hashring")
        if self.mode == "sidecar" and self.receive is not None:
            raise ValueError("mode sidecar uploads the master's own blocks; drop the receive section")
        return self

    def receive_url(self) -> str:
        """The remote-write URL the master sends to (a router in split mode, else an ingestor)."""
        assert self.receive is not None
        if self.receive.url:
            return self.receive.url
        if self.receive.routers:
            router = self.receive.routers[0]
            return f"http://{router.host}:{router.remote_write_port}/api/v1/receive"
        first = self.receive.ingestors()[0]
        return f"http://{first.host}:{first.remote_write_port}/api/v1/receive"
