"""Schemathesis over the controller's OpenAPI: every operation, arbitrary bodies and paths, never a 5xx,
and every error an ``application/problem+json`` body.

Driven through schemathesis' hypothesis strategies rather than its pytest plugin (which does
not run under pytest 9 here); bounded to a few examples per operation so the suite stays fast.
"""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.controller.harness import TOKEN, build, fleet

EXAMPLES = 12


def test_no_operation_answers_a_server_error(tmp_path: Path) -> None:
    harness = build(tmp_path)
    harness.feed(fleet(6, region="r1") + fleet(3, region="r2", start=100))
    schema = schemathesis.openapi.from_asgi("/openapi.json", harness.service.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    ran: list[tuple[str, int]] = []

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def one(case: schemathesis.Case) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {TOKEN}"}
            response = case.call()
            ran.append((f"{case.method} {case.path}", response.status_code))
            assert response.status_code < 500, (case.method, case.formatted_path, response.text[:500])
            if response.status_code >= 400:
                assert response.headers["content-type"][0].startswith("application/problem+json"), (
                    case.method,
                    case.formatted_path,
                    response.status_code,
                )

        one()
    print(
        f"schemathesis: {len(ran)} cases over {len(operations)} operations, "
        f"{sum(1 for _, code in ran if code >= 400)} refused with a problem, 0 server errors"
    )
    assert len({name for name, _ in ran}) == len(operations)


def test_bodies_of_arbitrary_json_never_crash_plan(tmp_path: Path) -> None:
    harness = build(tmp_path)
    harness.feed(fleet(4))
    import asyncio

    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=12,
    )

    @given(
        body=st.dictionaries(
            st.sampled_from(
                [
                    "add_shard",
                    "drain",
                    "pin",
                    "weights",
                    "shard_counts",
                    "unpin",
                    "undrain",
                    "remove_shard",
                    "x",
                ]
            ),
            json_values,
        )
    )
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def one(body: dict[str, object]) -> None:
        async def call() -> int:
            async with harness.client() as client:
                response = await client.post("/v1/plan", json=body, headers=harness.auth())
                return response.status_code

        status = asyncio.run(call())
        assert status in (200, 404, 422), (body, status)

    one()
