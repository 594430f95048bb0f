"""The federation spec (``federation.yaml``): typed models and nothing else.

The spec is the one source every renderer reads: the child Prometheus configs
(``sharder.render``), and in later stages the master tier, Thanos and Alertmanager.
Loading from disk and mapping validation errors lives in ``sharder.loading``.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DURATION_RE = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Shard ids become label values, directory names and URL path segments.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1m30s``; ValueError when malformed."""
    match = DURATION_RE.match(text)
    if not text or not match:
        raise ValueError(f"not a Prometheus duration: {text!r} (examples: 15s, 1m, 2h)")
    y, w, d, h, m, s, ms = (int(match.group(i) or 0) for i in (2, 4, 6, 8, 10, 12, 14))
    return ((((y * 365 + w * 7 + d) * 24 + h) * 60 + m) * 60 + s) + ms / 1000


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


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


class JobSpec(StrictModel):
    name: str
    scrape_interval: str = "15s"
    scrape_timeout: str | None = None
    metrics_path: str = "/metrics"
    scheme: Literal["http", "https"] = "http"
    keep_metrics: list[str] = Field(default_factory=list, description="regexes on __name__ to keep")
    drop_metrics: list[str] = Field(default_factory=list, description="regexes on __name__ to drop")
    drop_labels: list[str] = Field(default_factory=list, description="label names removed after scrape")
    honor_labels: bool = False
    sample_limit: int = Field(default=0, ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("job names are lower-case letters, digits and '-'")
        return value

    @field_validator("scrape_interval", "scrape_timeout")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return None if value is None else _check_duration(value)

    @field_validator("keep_metrics", "drop_metrics")
    @classmethod
    def _regexes(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regex {value!r}: {exc}") from exc
        return values

    @field_validator("drop_labels")
    @classmethod
    def _labels(cls, values: list[str]) -> list[str]:
        for value in values:
            if not LABEL_NAME_RE.match(value):
                raise ValueError(f"not a valid label name: {value!r}")
        return values

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
    batch_send_deadline: str | None = None
    min_backoff: str | None = None
    max_backoff: str | None = None

    @field_validator("batch_send_deadline", "min_backoff", "max_backoff")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return None if value is None else _check_duration(value)


class RemoteWriteSpec(StrictModel):
    name: str
    url: str
    regions: list[str] = Field(default_factory=list, description="empty: every region")
    queue_config: QueueConfig = Field(default_factory=QueueConfig)
    remote_timeout: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("remote_write url must start with http:// or https://")
        return value


class ChildrenSpec(StrictModel):
    """How each child Prometheus is configured."""

    target_discovery: Literal["file_sd", "http_sd"] = "file_sd"
    http_sd_url: str = "http://127.0.0.1:8080"
    http_sd_refresh_interval: str = "30s"
    agent_mode: bool = False
    scrape_interval: str = "30s"
    evaluation_interval: str = "30s"


class FederationSpec(StrictModel):
    cluster: str
    regions: list[RegionSpec] = Field(min_length=1)
    sharding: ShardingSpec = Field(default_factory=ShardingSpec)
    jobs: list[JobSpec] = Field(min_length=1)
    remote_write: list[RemoteWriteSpec] = Field(default_factory=list)
    external_labels: dict[str, str] = Field(default_factory=dict)
    children: ChildrenSpec = Field(default_factory=ChildrenSpec)

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("cluster names are lower-case letters, digits and '-'")
        return value

    @field_validator("external_labels")
    @classmethod
    def _external_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        reserved = {"cluster", "region", "shard", "replica"} & labels.keys()
        if reserved:
            raise ValueError(f"{sorted(reserved)} are set by gpufed itself")
        for name in labels:
            if not LABEL_NAME_RE.match(name):
                raise ValueError(f"not a valid label name: {name!r}")
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


def shard_id(region: str, index: int) -> str:
    """Stable shard names: adding a shard adds a name and renames none."""
    return f"{region}-{index}"
