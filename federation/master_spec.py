"""The ``master:`` section of federation.yaml: the Prometheus the children remote-write into.

    master:
      replicas: 2              # an HA pair; Thanos Query deduplicates on their replica label
      retention: 15d
      rule_pack: true          # federation/rules/*.yml, copied into master/rules/
      tenants: per-region      # Thanos Receive tenant per region, or one (the cluster)
      long_term:               # where the master remote-writes everything (see LongTermSpec)
        kind: victoriametrics  # or thanos (the default with thanos.mode receive), remote_write
        url: http://victoria-metrics:8428/api/v1/write
        queue_config: {capacity: 50000, max_shards: 100}
      monitoring:              # the master's scrape jobs about gpufed itself (meta-monitoring)
        child_url: http://child-{child}:9090

Checks that need the rest of the spec (Thanos mode, hashring tenants) live in
``federation.spec.GpufedSpec``; this module only types the section.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sharder.kernel.models import LABEL_NAME_RE, StrictModel, check_url, parse_duration
from sharder.model.spec import AuthorizationSpec, BasicAuthSpec, Interval, QueueConfig

#: Env var a replica's launcher sets; Prometheus expands it in external_labels when
#: (3.x always; 2.x with --enable-feature=expand-external-labels): one config for both replicas.
REPLICA_ENV = "GPUFED_MASTER_REPLICA"


#: Placeholders a child URL template may use; ``ordinal`` is the child's place in its
#: region (shard index x replication factor + replica), a StatefulSet pod's ordinal.
CHILD_URL_FIELDS = ("child", "region", "shard", "replica", "ordinal")


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def _child_url(value: str) -> str:
    example = {name: "x" for name in CHILD_URL_FIELDS}
    try:
        check_url(value.format(**example))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"child_url {value!r} is not an http(s) URL template over {{{'}, {'.join(CHILD_URL_FIELDS)}}}"
            f" ({exc})"
        ) from exc
    return value


class MonitoringSpec(StrictModel):
    """What the master scrapes about gpufed itself; every address is a default a deployment overrides.

    Children are listed by the controller (``GET /v1/sd-children``) from the served
    assignment, each at ``child_url`` (or its region's entry in ``child_url_by_region``).
    """

    enabled: bool = True
    scrape_interval: str | None = Field(default=None, description="default: the master's scrape_interval")
    child_url: str = "http://child-{child}:9090"
    child_url_by_region: dict[str, str] = Field(default_factory=dict)
    controllers: list[str] = Field(
        default_factory=list, description="HOST:PORT per controller replica; empty: children.http_sd_url's"
    )
    masters: list[str] = Field(
        default_factory=list, description="HOST:PORT per master replica; empty: the replica hosts at port"
    )

    @field_validator("scrape_interval")
    @classmethod
    def _interval(cls, value: str | None) -> str | None:
        if value is not None and parse_duration(value) <= 0:
            raise ValueError(f"duration must be above zero: {value!r}")
        return value

    @field_validator("child_url")
    @classmethod
    def _template(cls, value: str) -> str:
        return _child_url(value)

    @field_validator("child_url_by_region")
    @classmethod
    def _templates(cls, values: dict[str, str]) -> dict[str, str]:
        return {region: _child_url(value) for region, value in values.items()}

    @field_validator("controllers", "masters")
    @classmethod
    def _addresses(cls, values: list[str]) -> list[str]:
        return [_host_port(value) for value in values]

    def child_url_of(self, region: str) -> str:
        return self.child_url_by_region.get(region, self.child_url)


#: Paths VictoriaMetrics takes Prometheus remote_write on: ``/api/v1/write`` on a single node
#: (and vmagent), ``/insert/<tenant>/prometheus[/api/v1/write]`` on a cluster's vminsert.
VM_WRITE_PATH_RE = re.compile(r"^(.*/api/v1/write|/insert/[^/]+/prometheus/?)$")


class MasterQueueConfig(QueueConfig):
    """``queue_config`` of the master's remote_write.

    The master forwards the whole fleet through one queue per remote_write, so it starts
    deeper and wider than Prometheus' defaults (capacity 10000, max_shards 50).
    """

    capacity: int = Field(default=50000, ge=1)
    max_shards: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> MasterQueueConfig:
        if self.min_shards is not None and self.min_shards > self.max_shards:
            raise ValueError(f"min_shards {self.min_shards} is above max_shards {self.max_shards}")
        if self.max_samples_per_send is not None and self.max_samples_per_send > self.capacity:
            raise ValueError(
                f"max_samples_per_send {self.max_samples_per_send} is above capacity {self.capacity}:"
                " a shard's batch is taken from its queue"
            )
        return self


class LongTermSpec(StrictModel):
    """The long-term store the master remote-writes everything it holds into.

    ``thanos``: Thanos Receive as ``thanos.receive`` describes it (its URL and tenant header
    come from there); the default when ``thanos.mode`` is ``receive``. ``victoriametrics``: a
    VictoriaMetrics single node, vmagent or vminsert at ``url``. ``remote_write``: any other
    Prometheus remote-write receiver at ``url``. Whether ``kind`` fits the ``thanos`` section
    is checked in ``federation.spec.GpufedSpec``.
    """

    kind: Literal["thanos", "victoriametrics", "remote_write"]
    url: str | None = Field(default=None, description="victoriametrics/remote_write: where to write")
    queue_config: MasterQueueConfig = Field(default_factory=MasterQueueConfig)
    remote_timeout: Interval | None = None
    basic_auth: BasicAuthSpec | None = None
    authorization: AuthorizationSpec | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @model_validator(mode="after")
    def _kind_and_url(self) -> LongTermSpec:
        if self.kind == "thanos" and self.url is not None:
            raise ValueError(
                f"url {self.url!r} with kind thanos: the master writes where thanos.receive says"
                " (its url, else its first router); leave url out"
            )
        if self.kind != "thanos" and self.url is None:
            raise ValueError(f"kind {self.kind} needs url: the remote-write endpoint to send to")
        if self.kind == "victoriametrics" and self.url is not None:
            path = urlsplit(self.url).path
            if not VM_WRITE_PATH_RE.match(path):
                raise ValueError(
                    f"url {self.url!r}: VictoriaMetrics takes remote_write on /api/v1/write (single node,"
                    " vmagent) or /insert/<tenant>/prometheus/api/v1/write (vminsert), not on"
                    f" {path or '/'!r}"
                )
        if self.basic_auth is not None and self.authorization is not None:
            raise ValueError("set basic_auth or authorization, not both (Prometheus allows one)")
        return self


class MasterSpec(StrictModel):
    replicas: int = Field(default=1, ge=1, le=2, description="1: single; 2: HA pair")
    host: str = Field(default="master-prometheus", description="replica i is <host>-<i> with 2 replicas")
    port: int = Field(default=9090, ge=1, le=65535)
    retention: str = "15d"
    data_dir: str = "/var/lib/prometheus/master"
    rule_pack: bool = True
    extra_rule_files: list[str] = Field(default_factory=list, description="absolute paths, loaded as well")
    tenants: Literal["single", "per-region"] = "single"
    scrape_interval: str = "30s"
    evaluation_interval: str = "30s"
    external_labels: dict[str, str] = Field(default_factory=dict)
    external_url: str | None = Field(
        default=None, description="--web.external-url: where users open the master (alert source links)"
    )
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    long_term: LongTermSpec | None = Field(
        default=None,
        description="where the master remote-writes; unset: Thanos Receive when thanos.mode is receive",
    )

    @model_validator(mode="after")
    def _tenants_need_thanos(self) -> MasterSpec:
        if self.tenants == "per-region" and self.long_term is not None and self.long_term.kind != "thanos":
            raise ValueError(
                f"tenants per-region splits what the master sends into Thanos Receive tenants;"
                f" long_term.kind {self.long_term.kind} has no tenant header: use tenants single"
            )
        return self

    @field_validator("retention", "scrape_interval", "evaluation_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"duration must be above zero: {value!r}")
        return value

    @field_validator("external_url")
    @classmethod
    def _external_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @field_validator("extra_rule_files")
    @classmethod
    def _absolute(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value.startswith("/"):
                raise ValueError(f"extra rule files are absolute paths, got {value!r}")
        return values

    @field_validator("external_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = {"cluster", "replica"} & labels.keys()
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by gpufed itself")
        for name in labels:
            if not LABEL_NAME_RE.match(name):
                raise ValueError(f"not a valid label name: {name!r}")
        return labels

    def replica_names(self) -> list[str]:
        return [f"master-{i}" for i in range(self.replicas)]

    def replica_host(self, index: int) -> str:
        return self.host if self.replicas == 1 else f"{self.host}-{index}"
