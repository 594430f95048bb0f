"""The federation spec (``federation.yaml``): typed models and nothing else.

The spec is the one source every renderer reads: the child Prometheus configs
(``sharder.children.render``), and in later stages the master tier, Thanos and Alertmanager.
Loading from disk and mapping validation errors lives in ``sharder.model.loading``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from sharder.kernel import prometheus_versions, secrets
from sharder.kernel.errors import preview
from sharder.kernel.models import (
    NAME_RE,
    StrictModel,
    check_label_name,
    check_url,
    parse_duration,
)
from sharder.kernel.re2check import check_re2
from sharder.kernel.tls import TlsSpec

MAX_WEIGHT = 10_000
#: The job every child scrapes itself under; its `up` reaches the master as the child's
#: heartbeat (``sharder.children.render``), so no spec job may take the name.
HEARTBEAT_JOB = "gpufed-heartbeat"
# Headers Prometheus 2.42 refuses in remote_write.headers (checked against promtool in the tests).
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-encoding",
        "content-length",
        "content-type",
        "user-agent",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "www-authenticate",
        "accept-encoding",
        "x-prometheus-remote-write-version",
        "x-prometheus-remote-read-version",
        "x-amz-date",
        "x-amz-security-token",
        "x-amz-content-sha256",
    }
)
HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
IDENTIFYING_LABELS = frozenset(
    {"__name__", "instance", "job", "node", "cluster", "region", "shard", "replica"}
)
"""Labels that tell one series from another; a job may not drop them (see ``JobSpec``)."""


def _check_positive_duration(value: str) -> str:
    if parse_duration(value) <= 0:
        raise ValueError(f"{value!r} must be longer than 0s")
    return value


Interval = Annotated[str, AfterValidator(_check_positive_duration)]
"""A Prometheus duration above zero (scrape, evaluation and refresh intervals)."""
Url = Annotated[str, AfterValidator(check_url)]
Re2Regex = Annotated[str, AfterValidator(check_re2)]


class RegionSpec(StrictModel):
    name: str
    shards: int | None = Field(
        default=None, ge=1, description="fixed child count; default from targets_per_shard"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("region names are lower-case letters, digits and '-'")
        return value


class ShardingSpec(StrictModel):
    targets_per_shard: int = Field(default=12, ge=1)
    replication_factor: int = Field(default=1, ge=1, le=3)
    load_factor: float = Field(default=1.05, ge=1.0, le=2.0, description="c in 'no shard above c x mean'")
    algorithm: Literal["bounded-ring", "bounded-rendezvous"] = "bounded-ring"
    max_removal_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="largest share of the previous targets one render may remove unless"
        " --allow-mass-removal is given",
    )


class JobSpec(StrictModel):
    name: str
    scrape_interval: Interval = "15s"
    scrape_timeout: Interval | None = None
    metrics_path: str = "/metrics"
    scheme: Literal["http", "https"] = "http"
    keep_metrics: list[Re2Regex] = Field(default_factory=list, description="regexes on __name__ to keep")
    drop_metrics: list[Re2Regex] = Field(default_factory=list, description="regexes on __name__ to drop")
    drop_labels: list[str] = Field(default_factory=list, description="label names removed after scrape")
    honor_labels: bool = False
    sample_limit: int = Field(default=0, ge=0)
    weight: Literal["gpus"] | int | None = Field(
        default=None,
        description="load units one target of this job costs its child: 'gpus' (its node's GPU count,"
        " at least 1) or a fixed number; default 'gpus' for the job named 'gpu', else 1",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("job names are lower-case letters, digits and '-'")
        if value == HEARTBEAT_JOB:
            raise ValueError(f"job name {value!r} is gpufed's own: every child scrapes itself under it")
        return value

    @field_validator("metrics_path")
    @classmethod
    def _metrics_path(cls, path: str) -> str:
        if not path.startswith("/") or not path.isprintable() or " " in path or "?" in path or "#" in path:
            raise ValueError("metrics_path is a URL path: it starts with '/', no spaces, query or fragment")
        return path

    @field_validator("drop_labels")
    @classmethod
    def _labels(cls, values: list[str]) -> list[str]:
        for value in values:
            check_label_name(value)
            if value in IDENTIFYING_LABELS or value.startswith("__"):
                raise ValueError(
                    f"dropping {value!r} would merge series that must stay apart"
                    f" (never dropped: {', '.join(sorted(IDENTIFYING_LABELS))} and __*)"
                )
        return values

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, int) and not 1 <= value <= MAX_WEIGHT:
            raise ValueError(f"weight is 'gpus' or a whole number from 1 to {MAX_WEIGHT}")
        return value

    def target_weight(self, gpus: int) -> int:
        """Load units of one target of this job on a node with ``gpus`` GPUs."""
        rule = self.weight if self.weight is not None else ("gpus" if self.name == "gpu" else 1)
        return max(1, gpus) if rule == "gpus" else int(rule)

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> JobSpec:
        if self.scrape_timeout and parse_duration(self.scrape_timeout) > parse_duration(self.scrape_interval):
            raise ValueError(
                f"scrape_timeout {self.scrape_timeout} is longer than scrape_interval {self.scrape_interval}"
            )
        return self


class QueueConfig(StrictModel):
    """Prometheus ``remote_write.queue_config``; unset fields keep Prometheus' defaults."""

    capacity: int | None = Field(default=None, ge=1)
    max_shards: int | None = Field(default=None, ge=1)
    min_shards: int | None = Field(default=None, ge=1)
    max_samples_per_send: int | None = Field(default=None, ge=1)
    batch_send_deadline: Interval | None = None
    min_backoff: Interval | None = None
    max_backoff: Interval | None = None


def _absolute(path: str) -> str:
    if not path.startswith("/") or not path.isprintable():
        raise ValueError(f"credential files are absolute paths read by Prometheus, got {preview(path)}")
    return path


CredentialFile = Annotated[str, AfterValidator(_absolute)]


class BasicAuthSpec(StrictModel):
    """Prometheus' ``basic_auth``: the password only ever as a file Prometheus reads."""

    username: str = Field(min_length=1)
    password_file: CredentialFile


class AuthorizationSpec(StrictModel):
    """Prometheus' ``authorization``: the credentials only ever as a file Prometheus reads."""

    type: str = Field(default="Bearer", pattern=r"^[A-Za-z][A-Za-z0-9-]*$")
    credentials_file: CredentialFile


class RemoteWriteSpec(StrictModel):
    name: str = Field(min_length=1)
    url: Url
    protocol: Literal["1.0", "2.0"] = Field(
        default="1.0",
        description="remote-write protocol; 2.0 (experimental in Prometheus 3.x) only where the receiver"
        " speaks it too (the master does when prometheus.version is 3.x)",
    )
    regions: list[str] = Field(default_factory=list, description="empty: every region")
    queue_config: QueueConfig = Field(default_factory=QueueConfig)
    remote_timeout: Interval | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    basic_auth: BasicAuthSpec | None = None
    authorization: AuthorizationSpec | None = None

    @model_validator(mode="after")
    def _one_auth(self) -> RemoteWriteSpec:
        if self.basic_auth is not None and self.authorization is not None:
            raise ValueError("set basic_auth or authorization, not both (Prometheus allows one)")
        return self

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not HEADER_NAME_RE.match(name):
                raise ValueError(f"not an HTTP header name: {preview(name)}")
            if name.lower() == "authorization":
                raise ValueError("credentials go in Prometheus' auth settings, not an Authorization header")
            if secrets.is_secret_name(name):
                raise ValueError(
                    f"{secrets.LITERAL}: header {name} holds {secrets.shape(value)}; Prometheus cannot"
                    " read headers from files: use authorization.credentials_file or basic_auth.password_file"
                )
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"{name} is a header Prometheus sets itself and refuses to have changed")
            if not value.isprintable():
                raise ValueError(f"header {name} has control characters in its value")
        return headers


class PrometheusSpec(StrictModel):
    """The Prometheus release the children and the master run: flags and fields follow it."""

    version: str = Field(
        default=prometheus_versions.DEFAULT_PROMETHEUS,
        description="MAJOR[.MINOR[.PATCH]], the line and its oldest release in use: 3 (default), 3.13, 2.53",
    )

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str):
            # YAML reads 3.10 as the number 3.1: only a quoted version says what was meant.
            raise ValueError(f"prometheus.version is quoted, such as '3' or '2.53', got {value!r}")
        prometheus_versions.parse_prometheus(text)
        return text

    def release(self) -> prometheus_versions.Release:
        return prometheus_versions.parse_prometheus(self.version)

    def rendering(self) -> prometheus_versions.PrometheusRendering:
        return prometheus_versions.prometheus_rendering(self.release())


class ChildrenSpec(StrictModel):
    """How each child Prometheus is configured."""

    target_discovery: Literal["file_sd", "http_sd"] = "file_sd"
    http_sd_url: Url = "http://127.0.0.1:8080"
    http_sd_refresh_interval: Interval = "30s"
    agent_mode: bool = False
    scrape_interval: Interval = "30s"
    evaluation_interval: Interval = "30s"


class FederationSpec(StrictModel):
    cluster: str
    regions: list[RegionSpec] = Field(min_length=1)
    sharding: ShardingSpec = Field(default_factory=ShardingSpec)
    jobs: list[JobSpec] = Field(min_length=1)
    remote_write: list[RemoteWriteSpec] = Field(default_factory=list)
    external_labels: dict[str, str] = Field(default_factory=dict)
    children: ChildrenSpec = Field(default_factory=ChildrenSpec)
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec)
    tls: TlsSpec | None = Field(default=None, description="TLS on the federation's hops (sharder.kernel.tls)")

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("cluster names are lower-case letters, digits and '-'")
        return value

    def child_url(self, *, child: str, region: str, shard: str, replica: int, ordinal: int) -> str | None:
        """Where a child answers HTTP, or None where this spec does not say (the sharder's
        own spec: the master's section, which names the children's addresses, is not here).

        A child scrapes itself there for its heartbeat (``sharder.children.render``).
        """
        return None

    @field_validator("external_labels")
    @classmethod
    def _external_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = {"cluster", "region", "shard", "replica"} & labels.keys()
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by gpufed itself")
        for name in labels:
            check_label_name(name)
            if name.startswith("__"):
                raise ValueError(f"label names starting with '__' are reserved for Prometheus: {name!r}")
        return labels

    @model_validator(mode="after")
    def _unique_and_known(self) -> FederationSpec:
        for what, names in (
            ("regions", [r.name for r in self.regions]),
            ("jobs", [j.name for j in self.jobs]),
            ("remote_write", [w.name for w in self.remote_write]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {what} names: {dupes}")
        known = {r.name for r in self.regions}
        for write in self.remote_write:
            unknown = sorted(set(write.regions) - known)
            if unknown:
                raise ValueError(f"remote_write {write.name!r} names unknown regions {unknown}")
            if write.protocol == "2.0" and not self.prometheus.rendering().remote_write_v2:
                raise ValueError(
                    f"remote_write {write.name!r} protocol 2.0 needs Prometheus 3.x;"
                    f" prometheus.version is {self.prometheus.version!r}"
                )
        return self

    @model_validator(mode="after")
    def _tls_urls(self) -> FederationSpec:
        # A hop that is on but points at http:// would send the client certificate nowhere and
        # the data in clear: refuse it, naming the field that still says http.
        tls = self.tls
        if tls is None:
            return self
        scrape = tls.hops.scrape
        if isinstance(scrape, list):
            unknown = sorted(set(scrape) - {j.name for j in self.jobs})
            if unknown:
                raise ValueError(f"tls.hops.scrape names jobs {unknown} the spec does not have")
        if tls.hops.http_sd and self.children.target_discovery == "http_sd":
            require_https("children.http_sd_url", self.children.http_sd_url, hop="http_sd")
        if tls.hops.remote_write:
            for write in self.remote_write:
                require_https(f"remote_write {write.name!r} url", write.url, hop="remote_write")
        return self

    def region_names(self) -> list[str]:
        return [r.name for r in self.regions]

    def job(self, name: str) -> JobSpec | None:
        return next((j for j in self.jobs if j.name == name), None)

    def shard_count(self, region: str, *, nodes: int) -> int:
        """Children for a region: the fixed count, else ceil(nodes / targets_per_shard).

        Sizing counts GPU nodes (the usual 10-15 nodes per child guidance), not scrape
        targets, so adding a node-exporter job does not double the children.
        """
        fixed = next(r.shards for r in self.regions if r.name == region)
        if fixed is not None:
            return fixed
        return max(1, math.ceil(nodes / self.sharding.targets_per_shard))


def require_https(field: str, url: str, *, hop: str) -> None:
    """Refuse an ``http://`` URL on a hop the ``tls`` section turns on."""
    if not url.startswith("https://"):
        raise ValueError(
            f"{field} is {url!r} but tls.hops.{hop} is on: use an https:// URL, or set"
            f" tls.hops.{hop}: false"
        )


def shard_id(region: str, index: int) -> str:
    """Stable shard names: adding a shard adds a name and renames none."""
    return f"{region}-{index}"
