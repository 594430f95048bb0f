"""What the controller keeps: desired state, the applied assignment, hand-overs, audit.

Plain pydantic models, no I/O. A store (``federation.controller.stores.store``) persists one
:class:`ControllerState` as a unit, so a crash leaves either the old or the new state.

Two counters matter:

* ``revision`` bumps on every stored change (discovery included): the store's
  check-and-set token, so two writers never overwrite each other.
* ``desired_revision`` bumps only on operator changes: plans are made against it, so a
  plan stays valid while discovery moves a target or two, and goes stale (409) only
  when another operator change landed first.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from federation.controller.base import audit_bounds
from sharder.engine.assignment import Assignment


class StateModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Desired(StateModel):
    """Operator overrides; see ``sharder.engine.overriding`` for what each one means."""

    shard_counts: dict[str, int] = Field(default_factory=dict)
    pins: dict[str, str] = Field(default_factory=dict)
    drained: list[str] = Field(default_factory=list)
    weights: dict[str, int] = Field(default_factory=dict)


class Handover(StateModel):
    """A moved target both children scrape until the new one has it (make-before-break)."""

    identity: str
    job: str
    from_shard: str
    to_shard: str
    started_at: float
    """Unix time the new child was first offered the target."""
    offered_at: float | None = None
    """Unix time a child of ``to_shard`` first fetched its targets after ``started_at`` (None: not
    yet; a new shard's child may not be running yet, and its window must not run out meanwhile)."""
    deadline: float
    """Unix time the old child lets go even if the new shard's child never showed up."""


class ControllerState(StateModel):
    revision: int = 0
    desired_revision: int = 0
    desired: Desired = Field(default_factory=Desired)
    assignment: Assignment | None = None
    assignment_version: int = 0
    last_plan: str | None = None
    """Version of the last applied plan: applying it again is a no-op, not a second move."""
    handovers: list[Handover] = Field(default_factory=list)


class AuditEntry(StateModel):
    id: int = 0
    """Assigned by the store; 0 before it is written."""
    at: float
    actor: str
    """The token's name (never the token)."""
    action: str
    detail: dict[str, Any] = Field(default_factory=dict)
    moved: int = 0

    @field_validator("detail")
    @classmethod
    def _bounded(cls, detail: dict[str, Any]) -> dict[str, Any]:
        """Long id lists kept as their first few and a count (``audit_bounds``), on write and
        on read of entries stored before the cap."""
        return audit_bounds.bounded(detail)


def overrides_of(desired: Desired) -> dict[str, Any]:
    """The operator's overrides as the reconcile loop's engine takes them."""
    return {
        "shard_counts": desired.shard_counts,
        "pins": desired.pins,
        "drained": desired.drained,
        "weights": desired.weights,
    }
