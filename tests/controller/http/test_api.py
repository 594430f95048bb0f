"""The controller's REST API in-process (httpx ASGITransport): SD, plans, rebalances, registry, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.controller.harness import READ_TOKEN, TOKEN, ControllerHarness, build, fleet


@pytest.fixture
def harness(tmp_path: Path) -> ControllerHarness:
    h = build(tmp_path)
    h.feed(fleet(6, region="r1") + fleet(3, region="r2", start=100))
    return h


@pytest.mark.asyncio
async def test_sd_serves_each_childs_targets_with_version(harness: ControllerHarness) -> None:
    assignment = harness.controller.state.assignment
    assert assignment is not None
    async with harness.client() as client:
        seen: set[str] = set()
        for shard in assignment.shards:
            response = await client.get(f"/v1/sd/{shard}/gpu")
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/json"
            assert response.headers["x-gpufed-assignment-version"] == str(
                harness.controller.state.assignment_version
            )
            groups = response.json()
            for group in groups:
                assert group["labels"]["region"] == assignment.shards[shard].region
                seen.update(group["targets"])
            assert (await client.get(f"/v1/sd/{shard}/node")).json() == []  # no node targets: [] not 404
            assert (await client.get(f"/v1/sd/{shard}")).json() == groups
        assert seen == {t.instance for t in fleet(6, region="r1") + fleet(3, region="r2", start=100)}
        missing = await client.get("/v1/sd/nope")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        assert (await client.get("/v1/sd/r1-0/nojob")).status_code == 404


@pytest.mark.asyncio
async def test_plan_then_rebalance_moves_and_repeat_is_noop(harness: ControllerHarness) -> None:
    before = harness.controller.state.assignment
    assert before is not None
    async with harness.client() as client:
        plan = (await client.post("/v1/plan", json={"add_shard": ["r1"]}, headers=harness.auth())).json()
        assert plan["added_shards"] == ["r1-2"]
        assert plan["counts"]["moved"] == len(plan["moves"]) >= 1
        assert harness.controller.state.assignment == before  # a plan applies nothing
        first = await client.post("/v1/rebalance", json={"version": plan["version"]}, headers=harness.auth())
        assert first.status_code == 200, first.text
        assert first.json()["applied"] is True
        moved = {m["identity"] for m in first.json()["moves"]}
        assert moved == {m["identity"] for m in plan["moves"]}
        again = await client.post("/v1/rebalance", json={"version": plan["version"]}, headers=harness.auth())
        assert again.status_code == 200
        assert again.json()["applied"] is False
        after = harness.controller.state.assignment
        assert after is not None and "r1-2" in after.shards
        assert sum(1 for i in after.targets if after.targets[i] != before.targets[i]) == len(moved)
        audit = (await client.get("/v1/audit")).json()["entries"]
        assert audit[0]["actor"] == "env" and audit[0]["action"] == "rebalance"
        assert audit[0]["moved"] == len(moved)
        assert TOKEN not in json.dumps(audit)


@pytest.mark.asyncio
async def test_two_plans_from_one_base_one_applies_one_conflicts(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        a = (await client.post("/v1/plan", json={"add_shard": ["r1"]}, headers=harness.auth())).json()
        b = (await client.post("/v1/plan", json={"drain": ["r1-0"]}, headers=harness.auth())).json()
        ok = await client.post("/v1/rebalance", json={"version": a["version"]}, headers=harness.auth())
        stale = await client.post("/v1/rebalance", json={"version": b["version"]}, headers=harness.auth())
    assert ok.status_code == 200
    assert stale.status_code == 409
    assert stale.headers["content-type"] == "application/problem+json"
    assert stale.json()["current_version"] == ok.json()["current_version"]


@pytest.mark.asyncio
async def test_drain_and_pin_are_plans(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        drain = (await client.post("/v1/shards/r1-0/drain", headers=harness.auth())).json()
        assert all(m["from_shard"] == "r1-0" for m in drain["moves"])
        assert drain["load_after"]["r1-0"] == 0
        identity = next(iter(harness.controller.state.assignment.targets))  # type: ignore[union-attr]
        shard = "r1-1" if harness.controller.state.assignment.targets[identity] == "r1-0" else "r1-0"  # type: ignore[union-attr]
        pin = await client.post(
            "/v1/pins", json={"identity": identity, "shard": shard}, headers=harness.auth()
        )
        assert pin.status_code == 200
        applied = await client.post(
            "/v1/rebalance", json={"version": pin.json()["version"]}, headers=harness.auth()
        )
        assert applied.status_code == 200
        why = (await client.get(f"/v1/targets/{identity}")).json()
        assert why["shard"] == shard and why["reason"] == "pinned" and why["pinned_to"] == shard
        assert why["handover"] is not None  # make-before-break: the old child still has it
        assert shard in why["handover"]["to_shard"]


@pytest.mark.asyncio
async def test_bad_bodies_are_problems_naming_the_field(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        cases = [
            ({"add_shard": ["mars"]}, 422, "mars"),
            ({"shard_counts": {"r1": 0}}, 422, "shard_counts.r1"),
            ({"drain": ["r9-9"]}, 422, "r9-9"),
            ({"pin": {"no-such-target": "r1-0"}}, 404, "no-such-target"),
            ({"weights": {"x": "heavy"}}, 422, "weights.x"),
            ({"surprise": 1}, 422, "surprise"),
            ([1, 2], 422, "body"),
        ]
        for body, status, needle in cases:
            response = await client.post("/v1/plan", json=body, headers=harness.auth())
            assert response.status_code == status, (body, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert needle in response.text, (body, response.text)
        bad_version = await client.post("/v1/rebalance", json={"version": "0-nope"}, headers=harness.auth())
        assert bad_version.status_code == 404
        huge = await client.post(
            "/v1/plan",
            content=b"{" + b" " * (2 << 20) + b"}",
            headers={**harness.auth(), "content-type": "application/json"},
        )
        assert huge.status_code == 413


@pytest.mark.asyncio
async def test_mutations_need_a_token_with_write_scope(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        f"tokens:\n  - {{name: ops, token: {TOKEN}, scopes: [read, write]}}\n"
        f"  - {{name: viewer, token: {READ_TOKEN}, scopes: [read]}}\n"
    )
    h = build(tmp_path, tokens_file=tokens, env={})
    h.feed(fleet(4))
    async with h.client() as client:
        assert (await client.post("/v1/plan", json={})).status_code == 401
        assert (
            await client.post("/v1/plan", json={}, headers=h.auth("wrong-token-0123456789"))
        ).status_code == 401
        forbidden = await client.post("/v1/plan", json={}, headers=h.auth(READ_TOKEN))
        assert forbidden.status_code == 403 and "viewer" in forbidden.text
        assert (await client.post("/v1/plan", json={}, headers=h.auth(TOKEN))).status_code == 200
        assert (await client.get("/v1/shards")).status_code == 200  # reads are open (children need SD)


def test_placeholder_or_missing_tokens_refuse_to_start(tmp_path: Path) -> None:
    from federation.controller.http.auth import TokenError

    with pytest.raises(TokenError, match="no write token"):
        build(tmp_path / "a", env={})
    with pytest.raises(TokenError, match="at least 16"):
        build(tmp_path / "b", env={"GPUFED_TOKEN": "short"})
    with pytest.raises(TokenError, match="placeholder"):
        build(tmp_path / "c", env={"GPUFED_TOKEN": "changeme-changeme-changeme"})
    dev = build(tmp_path / "d", env={}, dev=True)
    assert dev.service.auth.dev


@pytest.mark.asyncio
async def test_registry_validates_like_the_inventory(harness: ControllerHarness) -> None:
    entry = {"address": "10.9.9.9", "port": 9400, "job": "gpu", "node": "reg-1", "region": "r2", "gpus": 4}
    async with harness.client() as client:
        created = await client.put("/v1/registry/targets/10.9.9.9:9400", json=entry, headers=harness.auth())
        assert created.status_code == 201 and created.json()["identity"] == "10.9.9.9:9400"
        assert (
            await client.put("/v1/registry/targets/10.9.9.9:9400", json=entry, headers=harness.auth())
        ).status_code == 200
        harness.tick()
        assert "10.9.9.9:9400" in harness.controller.state.assignment.targets  # type: ignore[union-attr]
        listed = (await client.get("/v1/registry/targets")).json()["targets"]
        assert [t["identity"] for t in listed] == ["10.9.9.9:9400"]
        for bad, field in (
            ({**entry, "port": 70000}, "port"),
            ({**entry, "address": "10.0.0.1:9400"}, "address"),
            ({**entry, "region": ""}, "region"),
        ):
            response = await client.put(
                "/v1/registry/targets/10.9.9.9:9400", json=bad, headers=harness.auth()
            )
            assert response.status_code == 422 and field in response.json()["detail"], response.text
        mismatch = await client.put("/v1/registry/targets/other:1", json=entry, headers=harness.auth())
        assert mismatch.status_code == 422 and "identity" in mismatch.text
        assert (await client.put("/v1/registry/targets/10.9.9.9:9400", json=entry)).status_code == 401
        assert (
            await client.delete("/v1/registry/targets/10.9.9.9:9400", headers=harness.auth())
        ).status_code == 204
        assert (
            await client.delete("/v1/registry/targets/10.9.9.9:9400", headers=harness.auth())
        ).status_code == 404


@pytest.mark.asyncio
async def test_health_ready_metrics_and_openapi(tmp_path: Path) -> None:
    h = build(tmp_path)
    async with h.client() as client:
        assert (await client.get("/readyz")).status_code == 503  # no assignment yet
        h.feed(fleet(3))
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        await client.get("/v1/sd/r1-0/gpu")
        text = (await client.get("/metrics")).text
        assert 'gpufed_controller_targets{region="r1",shard="r1-0"}' in text
        assert 'gpufed_controller_sd_requests_total{code="200"} 1.0' in text
        assert "/v1/rebalance" in (await client.get("/openapi.json")).json()["paths"]
        targets = (await client.get("/v1/targets", params={"region": "r1", "limit": 2})).json()
        assert targets["total"] == 3 and len(targets["targets"]) == 2
        assert (await client.get("/v1/targets/nope:1")).status_code == 404


@pytest.mark.asyncio
async def test_ready_waits_for_the_sd_answers_not_only_the_commit(tmp_path: Path) -> None:
    """A first SD build of a large fleet runs after the commit; until it is published,
    /readyz says 503 (a readiness probe routes HTTP SD clients by it)."""
    h = build(tmp_path)
    publication = h.controller.publication
    publish = publication.publish
    publication.publish = lambda *args, **kwargs: None  # type: ignore[method-assign]
    async with h.client() as client:
        h.feed(fleet(3))
        assert h.controller.state.assignment is not None  # committed
        assert (await client.get("/readyz")).status_code == 503
        publication.publish = publish  # type: ignore[method-assign]
        publication.publish(h.controller.state, h.controller.reconciler.target_map)
        assert (await client.get("/readyz")).status_code == 200


def test_a_single_unfenced_replica_does_not_read_the_store_twice_at_start(tmp_path: Path) -> None:
    """``build`` restored already; the loop's first pass (take_over) must not re-read a
    million rows when no election runs. A fenced leader always re-reads (see test_replicas)."""
    h = build(tmp_path)
    reads: list[str] = []
    store = h.controller.store
    load = store.load
    store.load = lambda: reads.append("load") or load()  # type: ignore[method-assign]
    h.controller.take_over()
    assert reads == []
    h.controller.take_over()  # a second take-over (not at start) reads again
    assert reads == ["load"]
