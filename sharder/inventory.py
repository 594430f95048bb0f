"""Targets: what the sharder assigns, and the small interface every source implements.

A ``Target`` is one scrape endpoint (an exporter on a node). Sources (static file here;
Consul and Kubernetes in their own client modules) produce lists of targets; they know
nothing of hashing. A source that can push changes calls ``on_change(targets)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sharder.spec import LABEL_NAME_RE

RESERVED_LABELS = frozenset({"cluster", "region", "shard", "replica", "job", "instance"})


class Target(BaseModel):
    """One scrape endpoint. ``identity`` is what is hashed: stable, never the label set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    job: str
    node: str = Field(min_length=1)
    region: str
    rack: str = ""
    team: str = ""
    gpus: int = Field(default=0, ge=0, le=64)
    metrics_path: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    explicit_identity: str | None = Field(default=None, alias="identity")

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not LABEL_NAME_RE.match(name) or name.startswith("__"):
                raise ValueError(f"not a valid label name: {name!r}")
            if name in RESERVED_LABELS:
                raise ValueError(f"label {name!r} is reserved (set by gpufed itself)")
        return labels

    @property
    def instance(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    @property
    def identity(self) -> str:
        return self.explicit_identity or self.instance

    @property
    def weight(self) -> int:
        """Load of scraping this target: its GPU count, at least 1."""
        return max(1, self.gpus)

    def target_labels(self) -> dict[str, str]:
        """Labels attached to the target in service discovery (file_sd / http_sd)."""
        labels = dict(self.labels)
        labels.update(node=self.node, region=self.region)
        if self.rack:
            labels["rack"] = self.rack
        if self.team:
            labels["team"] = self.team
        if self.gpus:
            labels["gpu_count"] = str(self.gpus)
        if self.metrics_path:
            labels["__metrics_path__"] = self.metrics_path
        return labels


OnChange = Callable[[list[Target]], None]


class TargetSource(Protocol):
    """Anything that lists targets. Push-capable sources also offer ``watch``."""

    def list_targets(self) -> list[Target]: ...


class WatchableSource(TargetSource, Protocol):
    def watch(self, on_change: OnChange) -> None:
        """Block, calling ``on_change`` with the full target list on every change."""
        ...


def sort_targets(targets: Iterable[Target]) -> list[Target]:
    return sorted(targets, key=lambda t: (t.region, t.job, t.identity))
