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


HOSTILE = [
    "\udfff",  # a lone surrogate: valid JSON ("\\udfff"), no UTF-8
    "a\ud800b",
    "x" * 100_000,
    "é" * 30_000,
    "gpu-" + "a" * 7_900 + "://",  # the shape that made masking quadratic
    "%ED%BF%BF",
    "\x00",
    "https://u:p@h/p?accessToken=abc;token=d#jwt=e",
]


def _hostile(value: object, pick: st.DataObject) -> object:
    """``value`` with its strings (keys too) swapped for hostile ones, each by a draw."""
    if isinstance(value, str):
        return pick.draw(st.sampled_from([value, *HOSTILE]))
    if isinstance(value, list):
        return [_hostile(v, pick) for v in value]
    if isinstance(value, dict):
        return {_hostile(k, pick): _hostile(v, pick) for k, v in value.items()}
    return value


def test_surrogates_and_very_long_strings_never_answer_a_server_error(tmp_path: Path) -> None:
    """The same operations with string leaves, keys and query values swapped for lone
    surrogates, 100 kB strings and URL-ish secrets: never a 5xx, and the server keeps
    answering reads afterwards (a stored surrogate once made every read a 500)."""
    import asyncio
    import json

    harness = build(tmp_path)
    harness.feed(fleet(6, region="r1") + fleet(3, region="r2", start=100))
    schema = schemathesis.openapi.from_asgi("/openapi.json", harness.service.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    ran: list[tuple[str, int]] = []

    async def send(method: str, path: str, query: dict[str, object], body: object, has_body: bool) -> int:
        async with harness.client() as client:
            response = await client.request(
                method,
                path,
                params={
                    k: v if isinstance(v, str | int | float) else json.dumps(v) for k, v in query.items()
                },
                content=json.dumps(body).encode() if has_body else None,  # ensure_ascii: "\udfff" escaped
                headers={**harness.auth(), "Content-Type": "application/json"},
            )
            if response.status_code >= 400:
                assert response.headers["content-type"].startswith("application/problem+json"), response.text
            return response.status_code

    for operation in operations:

        @given(case=operation.as_strategy(), pick=st.data())
        @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def one(case: schemathesis.Case, pick: st.DataObject) -> None:
            has_body = isinstance(case.body, dict | list | str | int | float) and case.method != "GET"
            body = _hostile(case.body, pick) if has_body else None
            query = {
                k: pick.draw(st.sampled_from([v, "x" * 4000, "é" * 2000, "%ED%BF%BF"]))
                if isinstance(v, str)
                else v
                for k, v in (case.query or {}).items()
            }
            status = asyncio.run(send(case.method, case.formatted_path, query, body, has_body))
            ran.append((f"{case.method} {case.path}", status))
            assert status < 500, (case.method, case.formatted_path, str(body)[:300])

        one()
    reads = [
        asyncio.run(send("GET", p, {}, None, False))
        for p in ("/v1/registry/targets", "/v1/targets", "/v1/audit")
    ]
    assert reads == [200, 200, 200]
    assert len({name for name, _ in ran}) == len(operations)
    print(f"hostile strings: {len(ran)} cases over {len(operations)} operations, 0 server errors")
