"""Changes through the API, plan first: a plan names a version, a rebalance applies it.

Drains, pins and their undoing are plans too (``POST /v1/rebalance`` applies them); every
write needs a ``write`` token; the audit log pages newest first.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from federation.controller.base import plans
from federation.controller.base.changing import MAX_ID, ChangeRequest
from federation.controller.http.api_deps import Ctl, Writer
from federation.controller.http.read_guard import Reader, metered
from federation.controller.http.redact import redact_data

router = APIRouter()


class RebalanceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(min_length=1, max_length=100, description="the version POST /v1/plan answered")


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    identity: str = Field(min_length=1, max_length=MAX_ID)
    shard: str = Field(min_length=1, max_length=200)
    reason: str = Field(default="", max_length=500)


@router.post("/v1/plan", tags=["changes"], summary="What a change would move; nothing is applied")
def plan(change: ChangeRequest, caller: Writer, controller: Ctl) -> dict[str, Any]:
    return plans.dump_plan(controller.plan(change))


@router.post("/v1/rebalance", tags=["changes"], summary="Apply a plan by its version")
def rebalance(body: RebalanceRequest, caller: Writer, controller: Ctl) -> dict[str, Any]:
    result = controller.apply(body.version, actor=caller.name)
    out: dict[str, Any] = {
        "applied": result.applied,
        "version": result.version,
        "message": result.message,
        "current_version": controller.current_version(),
        "assignment_version": controller.state.assignment_version,
    }
    if result.plan is not None:
        out["counts"] = result.plan.counts.model_dump(mode="json")
        out["moves"] = [m.model_dump(mode="json") for m in result.plan.moves]
    return out


@router.post("/v1/shards/{shard}/drain", tags=["changes"], summary="Plan to empty a shard")
def drain(shard: Annotated[str, Path(max_length=MAX_ID)], caller: Writer, controller: Ctl) -> dict[str, Any]:
    return plans.dump_plan(controller.plan(ChangeRequest(drain=[shard])))


@router.post("/v1/shards/{shard}/undrain", tags=["changes"], summary="Plan to use a drained shard again")
def undrain(
    shard: Annotated[str, Path(max_length=MAX_ID)], caller: Writer, controller: Ctl
) -> dict[str, Any]:
    return plans.dump_plan(controller.plan(ChangeRequest(undrain=[shard])))


@router.post("/v1/pins", tags=["changes"], summary="Plan to pin a target to a shard")
def pin(body: PinRequest, caller: Writer, controller: Ctl) -> dict[str, Any]:
    return plans.dump_plan(
        controller.plan(ChangeRequest(pin={body.identity: body.shard}, reason=body.reason))
    )


@router.delete("/v1/pins/{identity:path}", tags=["changes"], summary="Plan to unpin a target")
def unpin(
    identity: Annotated[str, Path(max_length=MAX_ID)], caller: Writer, controller: Ctl
) -> dict[str, Any]:
    return plans.dump_plan(controller.plan(ChangeRequest(unpin=[identity])))


@router.get("/v1/audit", tags=["changes"])
@metered
def audit(
    controller: Ctl,
    budget: Reader,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> dict[str, Any]:
    entries = controller.audit(limit=limit, before_id=before)
    budget.charge(len(entries))
    return {"entries": [redact_data(e.model_dump(mode="json")) for e in entries]}
