"""Issue 21 item 3 (the registry's share): a cap on entries (429) and a per-token rate (429 with
Retry-After), a batch costing one per entry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.controller.base.options import ControllerOptions
from federation.controller.http.ratelimit import RateLimited, RateLimiter
from tests.controller.harness import READ_TOKEN, TOKEN, ControllerHarness, build


def body(i: int) -> dict[str, Any]:
    address = f"10.7.{i // 250}.{i % 250 + 1}"
    return {"address": address, "port": 9400, "job": "gpu", "node": f"n{i}", "region": "r1"}


def ident(i: int) -> str:
    return f"10.7.{i // 250}.{i % 250 + 1}:9400"


def limited(tmp_path: Path, **options: Any) -> ControllerHarness:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        "tokens:\n"
        f"  - {{name: fleet-a, token: {TOKEN}, scopes: [register]}}\n"
        f"  - {{name: fleet-b, token: {READ_TOKEN}, scopes: [register]}}\n"
    )
    return build(
        tmp_path, tokens_file=tokens, env={},
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0, **options),
    )


async def calls(harness: ControllerHarness, requests: list[tuple[str, str, Any, str]]) -> list[Any]:
    out = []
    async with harness.client() as client:
        for method, path, document, token in requests:
            response = await client.request(method, path, json=document, headers=harness.auth(token))
            out.append(response)
    return out


def test_a_token_over_its_rate_gets_429_with_retry_after_and_others_do_not(tmp_path: Path) -> None:
    harness = limited(tmp_path, registry_rate=0.5, registry_burst=3)
    requests = [("PUT", f"/v1/registry/targets/{ident(i)}", body(i), TOKEN) for i in range(4)]
    requests.append(("DELETE", f"/v1/registry/targets/{ident(0)}", None, TOKEN))
    requests.append(("PUT", f"/v1/registry/targets/{ident(9)}", body(9), READ_TOKEN))
    answers = asyncio.run(calls(harness, requests))
    assert [a.status_code for a in answers] == [201, 201, 201, 429, 429, 201]
    refused = answers[3]
    assert refused.headers["Retry-After"] == "2"  # one registration at 0.5/s
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "fleet-a" in refused.json()["detail"] and "--registry-rate" in refused.json()["detail"]
    assert sorted(t.identity for t in harness.controller.registry.targets()) == sorted(
        [ident(0), ident(1), ident(2), ident(9)]
    )


def test_a_batch_costs_one_per_entry(tmp_path: Path) -> None:
    harness = limited(tmp_path, registry_rate=1.0, registry_burst=10)
    big = {"put": [body(i) for i in range(8)]}
    twice = [("POST", "/v1/registry/batch", big, TOKEN)] * 2
    answers = asyncio.run(calls(harness, twice))
    assert [a.status_code for a in answers] == [200, 429]
    assert answers[1].headers["Retry-After"] == "6"  # 2 left of 10, 8 needed at 1/s


def test_a_full_registry_answers_429_naming_the_flag(tmp_path: Path) -> None:
    harness = limited(tmp_path, registry_max_entries=2)
    requests = [("PUT", f"/v1/registry/targets/{ident(i)}", body(i), TOKEN) for i in range(3)]
    requests.append(("POST", "/v1/registry/batch", {"put": [body(5)], "delete": [ident(0)]}, TOKEN))
    answers = asyncio.run(calls(harness, requests))
    assert [a.status_code for a in answers] == [201, 201, 429, 200]  # a swap fits
    assert "--registry-max-entries" in answers[2].json()["detail"]
    assert answers[2].headers["Retry-After"] == "90"  # one TTL: expiring entries make room
    assert len(harness.controller.registry.targets()) == 2


@given(
    steps=st.lists(
        st.tuples(st.floats(min_value=0, max_value=5), st.integers(min_value=1, max_value=30)), max_size=60
    ),
    rate=st.floats(min_value=0.1, max_value=50),
    burst=st.integers(min_value=1, max_value=40),
)
@settings(max_examples=200, deadline=None, database=None)
def test_a_bucket_never_lets_through_more_than_burst_plus_rate_times_time(
    steps: list[tuple[float, int]], rate: float, burst: int
) -> None:
    now = [0.0]
    limiter = RateLimiter(rate=rate, burst=burst, clock=lambda: now[0])
    spent = 0
    largest = 0
    for wait, cost in steps:
        now[0] += wait
        try:
            limiter.take("t", cost)
        except RateLimited as exc:
            assert exc.retry_after_s >= 1
            continue
        spent += cost
        largest = max(largest, cost)
        # A request larger than the bucket may go into debt once: allow that one overshoot.
        assert spent <= burst + rate * now[0] + max(0, largest - burst) + 1e-6


def test_a_bucket_refills_and_a_zero_rate_means_no_limit() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    limiter.take("a")
    limiter.take("a")
    with pytest.raises(RateLimited) as refused:
        limiter.take("a")
    assert refused.value.retry_after_s == 1
    now[0] = 0.5
    limiter.take("a")
    unlimited = RateLimiter(rate=0, burst=1)
    for _ in range(1000):
        unlimited.take("a", 100)
    with pytest.raises(ValueError, match="burst"):
        RateLimiter(rate=1, burst=0)
