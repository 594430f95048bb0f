"""Reads cost what they return (issue 29, item 1): pages over an index kept per assignment,
a paged registry listing, ETags, and a budget for list reads without a ``read`` token.

Cost is counted in operations (rows built, indexes sorted), never in wall time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from federation.controller import views
from federation.controller.base import target_index
from federation.controller.base.options import ControllerOptions
from tests.controller.harness import ControllerHarness, build, fleet

FLEET = 600


@pytest.fixture
def harness(tmp_path: Path) -> ControllerHarness:
    h = build(tmp_path, options=ControllerOptions(debounce_s=0.0, grace_s=0.0, read_rate=1.0, read_burst=5))
    h.feed(fleet(FLEET // 2, region="r1") + fleet(FLEET // 2, region="r2", start=10_000))
    return h


class Counting:
    """How often the read path built a row and sorted an index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = self.builds = 0
        row, build = views.ReadViews._target_row, target_index.TargetIndex.build

        def counted_row(view: Any, *args: Any) -> Any:
            self.rows += 1
            return row(view, *args)

        def counted_build(*args: Any) -> Any:
            self.builds += 1
            return build(*args)

        monkeypatch.setattr(views.ReadViews, "_target_row", counted_row)
        monkeypatch.setattr(target_index.TargetIndex, "build", counted_build)


@pytest.mark.asyncio
async def test_a_page_builds_only_its_rows_over_one_index_per_assignment(
    harness: ControllerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = Counting(monkeypatch)
    auth = harness.auth()
    async with harness.client() as client:
        last = await client.get("/v1/targets", params={"limit": 1, "offset": FLEET - 1}, headers=auth)
        assert last.status_code == 200
        assert last.json()["total"] == FLEET and len(last.json()["targets"]) == 1
        assert counting.rows == 1  # not FLEET
        nothing = await client.get("/v1/targets", params={"q": "nomatch", "limit": 1000}, headers=auth)
        assert nothing.json() == {
            "total": 0,
            "offset": 0,
            "limit": 1000,
            "version": harness.controller.state.assignment_version,
            "next_cursor": None,
            "targets": [],
        }
        region = await client.get("/v1/targets", params={"region": "r2", "limit": 7}, headers=auth)
        assert region.json()["total"] == FLEET // 2
        assert [r["region"] for r in region.json()["targets"]] == ["r2"] * 7
        assert counting.rows == 8
        assert counting.builds == 1  # one sort for every read of this assignment
        harness.feed(fleet(FLEET // 2, region="r1") + fleet(FLEET // 2 - 1, region="r2", start=10_000))
        again = await client.get("/v1/targets", params={"region": "r2", "limit": 1}, headers=auth)
        assert again.json()["total"] == FLEET // 2 - 1
        assert counting.builds == 2  # a new assignment, a new index


@pytest.mark.asyncio
async def test_pages_are_the_sorted_list_sliced(harness: ControllerHarness) -> None:
    auth = harness.auth()
    async with harness.client() as client:
        pages = []
        for offset in range(0, FLEET, 250):
            answer = await client.get("/v1/targets", params={"offset": offset, "limit": 250}, headers=auth)
            pages += [row["identity"] for row in answer.json()["targets"]]
        assert pages == sorted(harness.controller.state.assignment.targets)
        q = await client.get("/v1/targets", params={"q": "R2-N1000", "limit": 1000}, headers=auth)
        assert q.json()["total"] == len(q.json()["targets"]) >= 1
        assert all("r2-n1000" in (r["node"] + r["identity"]).lower() for r in q.json()["targets"])


@pytest.mark.asyncio
async def test_list_reads_answer_304_while_nothing_changed(harness: ControllerHarness) -> None:
    auth = harness.auth()
    async with harness.client() as client:
        first = await client.get("/v1/targets", params={"limit": 5}, headers=auth)
        tag = first.headers["etag"]
        same = await client.get("/v1/targets", params={"limit": 5}, headers={**auth, "If-None-Match": tag})
        assert same.status_code == 304 and same.headers["etag"] == tag and same.content == b""
        other_page = await client.get(
            "/v1/targets", params={"limit": 6}, headers={**auth, "If-None-Match": tag}
        )
        assert other_page.status_code == 200
        harness.feed(fleet(3, region="r1"))
        changed = await client.get("/v1/targets", params={"limit": 5}, headers={**auth, "If-None-Match": tag})
        assert changed.status_code == 200 and changed.headers["etag"] != tag


@pytest.mark.asyncio
async def test_the_registry_listing_is_paged_with_an_etag(harness: ControllerHarness) -> None:
    auth = harness.auth()
    entries = [
        {"address": f"10.9.0.{i}", "port": 9400, "job": "gpu", "node": f"reg-{i:03d}", "region": "r1"}
        for i in range(1, 31)
    ]
    async with harness.client() as client:
        put = await client.post("/v1/registry/batch", json={"put": entries}, headers=auth)
        assert put.status_code == 200, put.text
        page = await client.get("/v1/registry/targets", params={"offset": 10, "limit": 5}, headers=auth)
        body = page.json()
        assert (body["total"], body["offset"], body["limit"]) == (30, 10, 5)
        everything = sorted(f"10.9.0.{i}:9400" for i in range(1, 31))
        assert [t["identity"] for t in body["targets"]] == everything[10:15]
        tag = page.headers["etag"]
        again = await client.get(
            "/v1/registry/targets", params={"offset": 10, "limit": 5}, headers={**auth, "If-None-Match": tag}
        )
        assert again.status_code == 304
        gone = await client.delete(f"/v1/registry/targets/{everything[0]}", headers=auth)
        assert gone.status_code == 204
        after = await client.get(
            "/v1/registry/targets", params={"offset": 10, "limit": 5}, headers={**auth, "If-None-Match": tag}
        )
        assert after.status_code == 200 and after.json()["total"] == 29
        assert [t["identity"] for t in after.json()["targets"]] == everything[11:16]
        too_big = await client.get("/v1/registry/targets", params={"limit": 5000}, headers=auth)
        assert too_big.status_code == 422


@pytest.mark.asyncio
async def test_list_reads_without_a_read_token_are_budgeted_per_client(harness: ControllerHarness) -> None:
    """Burst 5, rate 1/s: a 600-row page costs 1 + 6 units, so a tokenless loop meets 429 at
    once, with Retry-After; a read token and HTTP SD never do."""
    async with harness.client() as client:
        first = await client.get("/v1/targets", params={"limit": 600})
        assert first.status_code == 200
        refused = await client.get("/v1/targets", params={"limit": 1})
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert "--read-rate" in refused.json()["detail"]
        for path in ("/v1/registry/targets", "/v1/audit", "/v1/shards", "/v1/handovers"):
            assert (await client.get(path)).status_code == 429, path
        for _ in range(20):
            assert (
                await client.get("/v1/targets", params={"limit": 600}, headers=harness.auth())
            ).status_code == 200
            assert (await client.get("/v1/sd/r1-0")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200


def test_the_text_filter_finds_what_a_plain_scan_finds(tmp_path: Path) -> None:
    """``q`` runs ``str.find`` over one text of every line; it must keep exactly what a
    per-target substring test keeps, hits at line ends and across the tab included."""
    h = build(tmp_path)
    h.feed(fleet(300, region="r1") + fleet(200, region="r2", start=777))
    state, targets = h.controller.state, h.controller.reconciler.target_map
    index = target_index.TargetIndex.build(state.assignment, targets)
    for needle in ("n07", "0:9400", "R2-N0", "\t", ":9400\tr1", "1-n0001", "n0999", "zz", "10.0.", "4"):
        lowered = needle.lower()
        expected = tuple(i for i in index.order if lowered in i.lower() or lowered in targets[i].node.lower())
        if "\t" in needle:
            expected = ()
        assert tuple(index.select(region=None, shard=None, q=needle)) == expected, needle
        in_r2 = tuple(i for i in expected if targets[i].region == "r2")
        assert tuple(index.select(region="r2", shard=None, q=needle)) == in_r2, needle
