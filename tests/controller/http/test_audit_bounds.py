"""Bounded audit (issue 29, item 3): ids listed up to a cap with a count, oversized values
refused at the request, unpinning what is not pinned refused like pinning the unknown, and
an audit page that costs what it holds (old oversized rows are cut when read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from federation.controller.base.audit_bounds import AUDIT_CHARS, AUDIT_IDS
from federation.controller.base.state import AuditEntry
from tests.controller.harness import ControllerHarness, build, fleet

FLEET = 60


@pytest.fixture
def harness(tmp_path: Path) -> ControllerHarness:
    h = build(tmp_path)
    h.feed(fleet(FLEET, region="r1"))
    return h


async def _apply(client: Any, harness: ControllerHarness, change: dict[str, Any]) -> dict[str, Any]:
    plan = await client.post("/v1/plan", json=change, headers=harness.auth())
    assert plan.status_code == 200, plan.text
    applied = await client.post(
        "/v1/rebalance", json={"version": plan.json()["version"]}, headers=harness.auth()
    )
    assert applied.status_code == 200, applied.text
    return dict(applied.json())


@pytest.mark.asyncio
async def test_an_audit_entry_lists_ids_up_to_a_cap_with_their_count(harness: ControllerHarness) -> None:
    identities = sorted(harness.controller.state.assignment.targets)
    async with harness.client() as client:
        await _apply(client, harness, {"pin": {i: "r1-0" for i in identities}, "reason": "all to one"})
        (entry,) = (await client.get("/v1/audit", params={"limit": 1}, headers=harness.auth())).json()[
            "entries"
        ]
        change = entry["detail"]["change"]
        assert len(change["pin"]) == AUDIT_IDS and change["pin_count"] == FLEET
        assert change["reason"] == "all to one"
        await _apply(client, harness, {"unpin": identities})
        (entry,) = (await client.get("/v1/audit", params={"limit": 1}, headers=harness.auth())).json()[
            "entries"
        ]
        assert entry["detail"]["change"]["unpin"] == identities[:AUDIT_IDS]
        assert entry["detail"]["change"]["unpin_count"] == FLEET
    assert harness.controller.state.desired.pins == {}  # the state kept the whole change


@pytest.mark.asyncio
async def test_unpinning_what_is_not_pinned_is_refused_like_pinning_the_unknown(
    harness: ControllerHarness,
) -> None:
    known = sorted(harness.controller.state.assignment.targets)[0]
    async with harness.client() as client:
        for identity, words in ((known, "target"), ("never-seen:9400", "unknown target")):
            planned = await client.post("/v1/plan", json={"unpin": [identity]}, headers=harness.auth())
            assert planned.status_code == 404, planned.text
            assert f"{words} {identity!r} is not pinned" in planned.json()["detail"]
            deleted = await client.delete(f"/v1/pins/{identity}", headers=harness.auth())
            assert deleted.status_code == 404, deleted.text
        pinned = await client.post(
            "/v1/pins", json={"identity": known, "shard": "r1-1"}, headers=harness.auth()
        )
        assert pinned.status_code == 200
        await client.post("/v1/rebalance", json={"version": pinned.json()["version"]}, headers=harness.auth())
        assert (await client.delete(f"/v1/pins/{known}", headers=harness.auth())).status_code == 200


@pytest.mark.asyncio
async def test_oversized_values_are_refused_at_the_request(harness: ControllerHarness) -> None:
    huge = "x" * 100_000
    bodies = [
        {"pin": {huge: "r1-0"}},
        {"pin": {"10.0.0.2:9400": huge}},
        {"weights": {huge: 3}},
        {"shard_counts": {huge: 2}},
        {"add_shard": [huge]},
        {"unpin": [huge]},
        {"reason": huge},
    ]
    async with harness.client() as client:
        for body in bodies:
            answer = await client.post("/v1/plan", json=body, headers=harness.auth())
            assert answer.status_code == 422, (list(body), answer.status_code)
            assert huge not in answer.text
        long_id = huge[:20_000]  # what fits in a URL
        for method, path in (("DELETE", f"/v1/pins/{long_id}"), ("POST", f"/v1/shards/{long_id}/drain")):
            answer = await client.request(method, path, headers=harness.auth())
            assert answer.status_code == 422, (method, answer.status_code)
        assert (await client.get("/readyz")).status_code == 200


@pytest.mark.asyncio
async def test_an_old_oversized_row_is_cut_when_read(harness: ControllerHarness) -> None:
    """A row stored before the cap (built here without validation) reads back bounded."""
    controller = harness.controller
    raw = AuditEntry.model_construct(
        id=0,
        at=1.0,
        actor="old",
        action="rebalance",
        moved=0,
        detail={"change": {"unpin": [f"id-{i}-" + "y" * 990 for i in range(1000)], "reason": "z" * 5000}},
    )
    controller.pipeline.commit(controller.state, audit=raw)  # the one door: stored as it is
    async with harness.client() as client:
        (entry,) = (await client.get("/v1/audit", params={"limit": 1}, headers=harness.auth())).json()[
            "entries"
        ]
    change = entry["detail"]["change"]
    assert len(change["unpin"]) == AUDIT_IDS and change["unpin_count"] == 1000
    assert len(change["reason"]) < AUDIT_CHARS + 40 and change["reason"].endswith("(5000 characters)")
