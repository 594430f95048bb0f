"""``POST /v1/registry/batch``: every entry validated like a PUT, all or nothing, deltas downstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controller.harness import ControllerHarness, build


def entry(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "identity": f"node-{i}:9400",
        "address": f"10.7.{i // 250}.{i % 250 + 1}",
        "port": 9400,
        "job": "gpu",
        "node": f"node-{i}",
        "region": "r1",
        "gpus": 8,
        **extra,
    }


@pytest.mark.asyncio
async def test_a_batch_registers_and_deletes_and_reaches_sd(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        first = await client.post(
            "/v1/registry/batch", json={"put": [entry(i) for i in range(50)]}, headers=harness.auth()
        )
        assert first.status_code == 200, first.text
        assert first.json() == {"put": 50, "created": 50, "deleted": 0, "expires_in_s": 90.0}
        harness.tick()
        assignment = harness.controller.state.assignment
        assert assignment is not None
        served = set()
        for shard in assignment.shards:
            for group in (await client.get(f"/v1/sd/{shard}/gpu")).json():
                served.update(group["targets"])
        assert {f"10.7.0.{i + 1}:9400" for i in range(50)} <= served
        second = await client.post(
            "/v1/registry/batch",
            json={"put": [entry(0), entry(60)], "delete": ["node-1:9400", "never-registered"]},
            headers=harness.auth(),
        )
        assert second.json() == {"put": 2, "created": 1, "deleted": 1, "expires_in_s": 90.0}
        harness.tick()
        targets = harness.controller.state.assignment.targets  # type: ignore[union-attr]
        assert "node-60:9400" in targets and "node-1:9400" not in targets
        listed = (await client.get("/v1/registry/targets")).json()["targets"]
        assert len(listed) == 50


@pytest.mark.asyncio
async def test_one_bad_entry_applies_nothing_and_each_is_named(harness: ControllerHarness) -> None:
    body = {
        "put": [entry(0), entry(1, port=70000), "not a mapping", entry(3, region=""), entry(0)],
        "delete": [7, "node-0:9400"],
    }
    async with harness.client() as client:
        response = await client.post("/v1/registry/batch", json=body, headers=harness.auth())
        assert response.status_code == 422
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        named = [(e["section"], e["index"], e["identity"], e["field"]) for e in problem["errors"]]
        assert named == [
            ("put", 1, "node-1:9400", "port"),
            ("put", 2, None, "body"),
            ("put", 3, "node-3:9400", "region"),
            ("put", 4, "node-0:9400", "identity"),
            ("delete", 0, None, "delete"),
            ("delete", 1, "node-0:9400", "delete"),
        ]
        assert problem["errors"][0]["value"] == "70000"
        assert problem["invalid"] == 6 and "nothing was applied" in problem["detail"]
        assert (await client.get("/v1/registry/targets")).json()["targets"] == []


@pytest.mark.asyncio
async def test_the_batch_takes_the_register_scope(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"name": "reader", "token": "reader-token-0123456789abcdef", "scopes": ["read"]},
                    {"name": "fleet", "token": "fleet-token-0123456789abcdefgh", "scopes": ["register"]},
                ]
            }
        )
    )
    h = build(tmp_path, tokens_file=tokens, env={})
    body = {"put": [entry(0)]}
    async with h.client() as client:
        assert (await client.post("/v1/registry/batch", json=body)).status_code == 401
        denied = await client.post(
            "/v1/registry/batch", json=body, headers=h.auth("reader-token-0123456789abcdef")
        )
        assert denied.status_code == 403
        ok = await client.post(
            "/v1/registry/batch", json=body, headers=h.auth("fleet-token-0123456789abcdefgh")
        )
        assert ok.status_code == 200
        unknown = await client.post(
            "/v1/registry/batch", json={"puts": []}, headers=h.auth("fleet-token-0123456789abcdefgh")
        )
        assert unknown.status_code == 422 and "puts" in unknown.text


@pytest.mark.asyncio
async def test_a_batch_above_the_single_request_limit_is_accepted(harness: ControllerHarness) -> None:
    body = {"put": [entry(i, labels={"pad": "x" * 200}) for i in range(6000)]}
    async with harness.client() as client:
        response = await client.post("/v1/registry/batch", json=body, headers=harness.auth())
        assert response.status_code == 200, response.text[:300]
        too_big = await client.put(
            "/v1/registry/targets/node-0:9400",
            json={**entry(0), "labels": {"pad": "x" * (2 << 20)}},
            headers=harness.auth(),
        )
        assert too_big.status_code == 413
