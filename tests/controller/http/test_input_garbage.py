"""The controller's own parsers take garbage without a traceback: a child's /api/v1/targets
answer (evidence only: skipped when malformed) and the tokens file (one TokenError naming it)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.controller.http.auth import TokenError, load_tokens
from federation.controller.live.probe import ScrapeState, parse_active_targets, parse_time

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
targets_like = st.fixed_dictionaries(
    {
        "data": st.fixed_dictionaries(
            {
                "activeTargets": st.lists(
                    st.fixed_dictionaries(
                        {"labels": json_values, "health": json_values, "lastScrape": json_values}
                    ),
                    max_size=4,
                )
            }
        )
    }
)


@given(body=json_values | targets_like)
@settings(max_examples=300, deadline=None)
def test_any_targets_answer_parses_to_states_or_nothing(body: object) -> None:
    parsed = parse_active_targets(body)
    assert all(isinstance(k, tuple) and isinstance(v, ScrapeState) for k, v in parsed.items())


@given(
    text=st.text(max_size=40)
    | st.from_regex(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,12})?(Z|[+-]\d\d:\d\d)?")
)
@settings(max_examples=300, deadline=None)
def test_any_scrape_time_is_a_number(text: str) -> None:
    assert isinstance(parse_time(text), float)


def test_a_well_formed_answer_is_read() -> None:
    body = {
        "data": {
            "activeTargets": [
                {
                    "labels": {"job": "gpu", "instance": "10.0.0.1:9400", "node": "n1"},
                    "health": "up",
                    "lastScrape": "2026-11-24T04:05:01.123456789Z",
                },
                {"labels": "not a mapping", "health": "up"},
            ]
        }
    }
    assert parse_active_targets(body) == {
        ("gpu", "10.0.0.1:9400", "n1"): ScrapeState("up", 1795493101.123456)
    }


token_files = (
    st.binary(max_size=300)
    | json_values.map(lambda v: yaml.safe_dump(v).encode())
    | st.lists(
        st.fixed_dictionaries(
            {
                "name": json_values,
                "token": json_values | st.text(min_size=16, max_size=40),
                "scopes": json_values
                | st.lists(st.sampled_from(["read", "write", "register", "x"]) | json_values),
            }
        ),
        max_size=3,
    ).map(lambda entries: yaml.safe_dump({"tokens": entries}).encode())
)


@given(raw=token_files)
@settings(max_examples=300, deadline=None)
def test_any_tokens_file_loads_or_is_one_token_error(raw: bytes) -> None:
    path = Path(tempfile.mkdtemp()) / "tokens.yaml"
    path.write_bytes(raw)
    try:
        tokens = load_tokens(path, env={})
    except TokenError as exc:
        assert str(exc).startswith(str(path)) and "\n" not in str(exc)
    else:
        assert all(len(t.secret) >= 16 and t.scopes for t in tokens)


def test_unhashable_scopes_are_one_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - {name: a, token: abcdefghijklmnopqrstuvwxyz0123, scopes: [{}]}\n")
    try:
        load_tokens(path, env={})
    except TokenError as exc:
        assert "scopes" in str(exc)
    else:
        raise AssertionError("a mapping is not a scope")
