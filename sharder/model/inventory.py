"""Targets: what the sharder assigns, and the small interface every source implements.

A ``Target`` is one scrape endpoint (an exporter on a node). Sources (static file here;
Consul and Kubernetes in their own client modules) produce lists of targets; they know
nothing of hashing. A source that can push changes calls ``on_change(targets)``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Annotated, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from sharder.kernel.models import LABEL_NAME_RE
from sharder.model.addresses import host_port, normalise_host, normalise_identity
from sharder.model.spec import MAX_WEIGHT

RESERVED_LABELS = frozenset({"cluster", "region", "shard", "replica", "job", "instance"})
PLAIN_TEXT_PATTERN = r"^(?:[^\p{C}\p{Z}](?:[^\p{C}\p{Zl}\p{Zp}]*[^\p{C}\p{Z}])?)?\z"
PlainText = Annotated[str, StringConstraints(pattern=PLAIN_TEXT_PATTERN)]
"""Names and label values: no control characters, no leading or trailing whitespace.

Checked by pydantic-core's regex engine (a Python validator per field costs 800k calls
per 400k-node inventory); ``sharder.model.loading`` words the mismatch for people.
"""


class Target(BaseModel):
    """One scrape endpoint. ``identity`` is what is hashed: stable, never the label set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    port: int = Field(ge=1, le=65535)
    job: PlainText = Field(min_length=1)
    node: PlainText = Field(min_length=1)
    region: PlainText = Field(min_length=1)
    rack: PlainText = ""
    team: PlainText = ""
    gpus: int = Field(default=0, ge=0, le=64)
    metrics_path: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    explicit_identity: PlainText | None = Field(default=None, alias="identity", min_length=1)
    explicit_weight: int | None = Field(default=None, alias="weight", ge=1, le=MAX_WEIGHT)

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        return normalise_host(address)

    @field_validator("explicit_identity")
    @classmethod
    def _identity(cls, identity: str | None) -> str | None:
        return normalise_identity(identity) if identity is not None else None

    @field_validator("metrics_path")
    @classmethod
    def _metrics_path(cls, path: str | None) -> str | None:
        if path is not None and (not path.startswith("/") or not path.isprintable() or " " in path):
            raise ValueError("metrics_path is a URL path: it starts with '/' and has no spaces")
        if path is not None and ("?" in path or "#" in path):
            raise ValueError("metrics_path must not carry a query or fragment")
        return path

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not LABEL_NAME_RE.match(name) or name.startswith("__"):
                raise ValueError(f"not a valid label name: {name!r}")
            if name in RESERVED_LABELS:
                raise ValueError(f"label {name!r} is reserved (set by gpufed itself)")
        for name, value in labels.items():
            try:
                value.encode("utf-8")  # a lone surrogate (JSON "\udfff") is no UTF-8 at all
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"label {name!r} is not valid UTF-8 (a lone surrogate at character {exc.start})"
                ) from None
        return labels

    @model_validator(mode="after")
    def _shared(self) -> Target:
        """A controller holds up to a million targets for its lifetime: share what they
        repeat. Names (job, region, rack, team; node and address across a node's exporters)
        are interned, and the fields-set pydantic keeps per instance (a 700-byte ``set``)
        is one shared object per distinct set, and so is an empty ``labels`` dict. Neither is
        mutated in place: the model is frozen, ``model_copy`` copies the fields-set before it
        updates it, and nothing writes into a target's labels (``target_labels`` copies)."""
        fields = self.__dict__
        for name in _INTERNED:
            fields[name] = sys.intern(fields[name])
        if not fields["labels"]:  # most targets have none: one shared empty dict, not 64 bytes each
            fields["labels"] = _NO_LABELS
        given = self.__pydantic_fields_set__
        object.__setattr__(self, "__pydantic_fields_set__", _FIELDS_SETS.setdefault(frozenset(given), given))
        return self

    @property
    def instance(self) -> str:
        return host_port(self.address, self.port)

    @property
    def identity(self) -> str:
        return self.explicit_identity or self.instance

    @property
    def weight(self) -> int:
        """What scraping this target costs its child, in load units (see ``JobSpec.weight``).

        The loaders set ``weight`` from the target's job: a GPU exporter's series grow with
        the node's GPUs, so it weighs its GPU count; a node exporter's do not, so it weighs
        1 whatever the node holds. A target built without a job rule (no spec at hand)
        falls back to its GPU count, at least 1.
        """
        return self.explicit_weight if self.explicit_weight is not None else max(1, self.gpus)

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


_INTERNED = ("address", "job", "node", "region", "rack", "team")
_NO_LABELS: dict[str, str] = {}
"""The ``labels`` of every target that has none (64 bytes a target at a million otherwise)."""
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}
"""One shared fields-set per distinct set of given fields (a handful in any fleet)."""

OnChange = Callable[[list[Target]], None]


class TargetSource(Protocol):
    """Anything that lists targets. Push-capable sources also offer ``watch``."""

    def list_targets(self) -> list[Target]: ...


class WatchableSource(TargetSource, Protocol):
    def watch(self, on_change: OnChange) -> None:
        """Block, calling ``on_change`` with the full target list on every change."""
        ...


def sort_targets(targets: Iterable[Target]) -> list[Target]:
    """By region, job, identity. Grouped first: sorting 800k plain strings is several times
    faster than sorting 800k tuples, and regions and jobs are few."""
    groups: dict[tuple[str, str], list[Target]] = {}
    for target in targets:
        groups.setdefault((target.region, target.job), []).append(target)
    ordered: list[Target] = []
    for key in sorted(groups):
        ordered.extend(sorted(groups[key], key=_identity))
    return ordered


def _identity(target: Target) -> str:
    return target.identity
