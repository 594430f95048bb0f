"""The ``logs:`` section of federation.yaml: typed, validated, nothing rendered here.

    logs:
      retention: 30d                 # Loki's limits_config.retention_period (whole days)
      storage_prefix: loki           # Loki's own prefix in the bucket thanos.objstore names
      journal: {max_age: 12h}
      units: [nvidia-fabricmanager.service, kubelet.service, containerd.service]

Loki stores its chunks and index in the Thanos bucket (``thanos.objstore``) under
``storage_prefix``; ``federation.spec`` refuses a ``logs`` section without a ``thanos`` one.
Two checks live here because Loki would start and then misbehave: a retention that is not
a whole number of index periods (24 h; the compactor deletes whole index tables) and a
prefix Loki's bucket client refuses (letters, digits and dashes only).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from sharder.kernel.models import StrictModel, parse_duration

#: Loki's bucket client: "may only contain digits, English alphabet letters and dashes"
#: (grafana/loki pkg/storage/bucket/client.go@044402b2, validPrefixCharactersRegex).
STORAGE_PREFIX_RE = re.compile(r"^[\da-zA-Z-]+\Z")
UNIT_RE = re.compile(r"^[A-Za-z0-9@._:-]+\.service\Z")
INDEX_PERIOD_S = 24 * 3600
#: systemd units whose journal GPU nodes ship beside the kernel ring (XID lines come from
#: the kernel transport, not from a unit).
DEFAULT_UNITS = (
    "nvidia-fabricmanager.service",
    "nvidia-persistenced.service",
    "kubelet.service",
    "containerd.service",
    "docker.service",
)


class JournalSpec(StrictModel):
    max_age: str = Field(default="12h", description="oldest entry Promtail reads on a first start")
    path: str = Field(
        default="",
        description="a journal directory; empty: libsystemd's own search, /var/log/journal (persistent)"
        " then /run/log/journal (volatile), both of which compose and the chart mount",
    )

    @field_validator("max_age")
    @classmethod
    def _age(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("max_age must be above zero")
        return value


class LokiSpec(StrictModel):
    """Where Loki runs: its address as Promtail and Grafana reach it, and its local paths."""

    host: str = Field(default="loki", description="compose service / DNS name of Loki (or its gateway)")
    http_port: int = Field(default=3100, ge=1, le=65535)
    grpc_port: int = Field(default=9095, ge=1, le=65535)
    data_dir: str = "/loki"
    tenant: str = Field(default="", description="X-Scope-OrgID; empty: auth_enabled false, one tenant")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


class RulerSpec(StrictModel):
    xid_window: str = Field(default="5m", description="range of the XID count")
    evaluation_interval: str = "1m"

    @field_validator("xid_window", "evaluation_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError("must be above zero")
        return value


class LogsSpec(StrictModel):
    agent: Literal["promtail"] = "promtail"
    retention: str = "30d"
    storage_prefix: str = "loki"
    journal: JournalSpec = Field(default_factory=JournalSpec)
    units: list[str] = Field(default_factory=lambda: list(DEFAULT_UNITS))
    containers: bool = Field(default=True, description="ship Docker and Kubernetes container logs")
    loki: LokiSpec = Field(default_factory=LokiSpec)
    ruler: RulerSpec = Field(default_factory=RulerSpec)
    promtail_port: int = Field(default=9080, ge=1, le=65535)
    config_dir: str = Field(default="/etc/gpufed/logs", description="where logs/ files are deployed")

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        seconds = parse_duration(value)
        # Loki's compactor applies retention per index table (one per period): below one
        # period, or not a multiple of it, Loki refuses to start.
        if seconds < INDEX_PERIOD_S or seconds % INDEX_PERIOD_S:
            raise ValueError(f"retention {value} must be whole days (a multiple of Loki's 24h index period)")
        return value

    @field_validator("storage_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not STORAGE_PREFIX_RE.match(value):
            raise ValueError(
                f"storage_prefix {value!r}: Loki allows only letters, digits and '-' in a bucket prefix"
            )
        return value

    @field_validator("units")
    @classmethod
    def _units(cls, values: list[str]) -> list[str]:
        for value in values:
            if not UNIT_RE.match(value):
                raise ValueError(f"not a systemd service unit name: {value!r}")
        if len(set(values)) != len(values):
            raise ValueError("units are listed twice")
        return values

    def retention_hours(self) -> str:
        """Loki's retention as whole hours (its duration parser takes d, but hours read plainly)."""
        return f"{int(parse_duration(self.retention) // 3600)}h"
