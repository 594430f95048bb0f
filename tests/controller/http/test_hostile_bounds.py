"""Issue 21 through the API: bounded changes, booleans refused, one endpoint per target."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.controller.base.changing import MAX_ENTRIES, MAX_SHARDS_PER_REGION, MAX_STEPS
from tests.controller.harness import ControllerHarness, build, fleet


@pytest.fixture
def harness(tmp_path: Path) -> ControllerHarness:
    h = build(tmp_path)
    h.feed(fleet(4, region="r1") + fleet(2, region="r2", start=100))
    return h


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"shard_counts": {"r1": True}}, "shard_counts.r1"),
        ({"weights": {"x": True}}, "weights.x"),
        ({"add_shard": ["r1"] * (MAX_STEPS + 1)}, "add_shard"),
        ({"drain": ["r1-0"] * (MAX_ENTRIES + 1)}, "drain"),
        ({"unpin": ["a"] * (MAX_ENTRIES + 1)}, "unpin"),
        ({"pin": {f"t{i}": "r1-0" for i in range(MAX_ENTRIES + 1)}}, "pin"),
    ],
)
async def test_changes_are_bounded_and_typed(harness: ControllerHarness, body: dict, field: str) -> None:
    async with harness.client() as client:
        response = await client.post("/v1/plan", json=body, headers=harness.auth())
        assert response.status_code == 422, response.text
        assert field in response.json()["detail"]


@pytest.mark.asyncio
async def test_add_shard_cannot_pass_the_region_maximum(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        near = await client.post(
            "/v1/plan", json={"shard_counts": {"r2": MAX_SHARDS_PER_REGION}}, headers=harness.auth()
        )
        assert near.status_code == 200, near.text
        over = await client.post(
            "/v1/plan",
            json={"shard_counts": {"r2": MAX_SHARDS_PER_REGION}, "add_shard": ["r2"]},
            headers=harness.auth(),
        )
        assert over.status_code == 422 and "add_shard[0]" in over.text


@pytest.mark.asyncio
async def test_registry_refuses_booleans_and_oversized_targets(harness: ControllerHarness) -> None:
    entry = {"address": "10.9.0.1", "port": 9400, "job": "gpu", "node": "reg-1", "region": "r1"}
    async with harness.client() as client:
        for bad, field in (
            ({**entry, "gpus": True}, "gpus"),
            ({**entry, "labels": {"blob": "x" * 1_000_000}}, "labels.blob"),
            ({**entry, "labels": {f"l{i}": "v" for i in range(2000)}}, "labels"),
        ):
            response = await client.put(
                "/v1/registry/targets/10.9.0.1:9400", json=bad, headers=harness.auth()
            )
            assert response.status_code == 422, response.text
            assert field in response.json()["detail"]
            assert len(response.content) < 2000  # the megabyte is not echoed back


@pytest.mark.asyncio
async def test_one_endpoint_one_target_through_the_registry(harness: ControllerHarness) -> None:
    served = fleet(4, region="r1")[0]  # from the "file" source
    twin = {
        "address": f"::ffff:{served.address}",
        "port": served.port,
        "job": served.job,
        "node": "someone-else",
        "region": "r1",
        "identity": "sneaky",
    }
    async with harness.client() as client:
        taken = await client.put("/v1/registry/targets/sneaky", json=twin, headers=harness.auth())
        assert taken.status_code == 409, taken.text
        assert served.identity in taken.json()["detail"] and "file" in taken.json()["detail"]

        own = {"address": "10.9.0.1", "port": 9400, "job": "gpu", "node": "reg-1", "region": "r1"}
        first = await client.put("/v1/registry/targets/10.9.0.1:9400", json=own, headers=harness.auth())
        assert first.status_code == 201
        second = await client.put(
            "/v1/registry/targets/other", json={**own, "identity": "other"}, headers=harness.auth()
        )
        assert second.status_code == 409 and "10.9.0.1:9400" in second.json()["detail"]

        mixed = {**own, "address": "GPU-7.Example", "identity": "GPU-7.Example:9400", "node": "g7"}
        created = await client.put(
            "/v1/registry/targets/GPU-7.Example:9400", json=mixed, headers=harness.auth()
        )
        assert created.status_code == 201 and created.json()["identity"] == "gpu-7.example:9400"
        again = await client.put(
            "/v1/registry/targets/gpu-7.example:9400",
            json={**mixed, "identity": "gpu-7.example:9400"},
            headers=harness.auth(),
        )
        assert again.status_code == 200  # the same target, not a second one

        batch = await client.post(
            "/v1/registry/batch",
            json={"put": [{**own, "identity": "batch-twin"}, {**twin, "identity": "batch-file-twin"}]},
            headers=harness.auth(),
        )
        assert batch.status_code == 422
        assert [e["field"] for e in batch.json()["errors"]] == ["address", "address"]
        # deleting the holder and re-using its endpoint in one batch is fine
        swap = await client.post(
            "/v1/registry/batch",
            json={"put": [{**own, "identity": "renamed"}], "delete": ["10.9.0.1:9400"]},
            headers=harness.auth(),
        )
        assert swap.status_code == 200, swap.text
        after = await client.put(
            "/v1/registry/targets/third", json={**own, "identity": "third"}, headers=harness.auth()
        )
        assert after.status_code == 409 and "'renamed'" in after.json()["detail"]  # the index follows
    harness.tick()
    placed = harness.controller.state.assignment
    assert placed is not None
    assert "sneaky" not in placed.targets and "renamed" in placed.targets
    assert "gpu-7.example:9400" in placed.targets
