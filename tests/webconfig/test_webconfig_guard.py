"""``webconfig.guard``: the per-request decision, with an injected clock (no sleeping)."""

from __future__ import annotations

import base64

import bcrypt

from webconfig.guard import Guard
from webconfig.model import parse


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_rate_limit_is_a_token_bucket() -> None:
    now = [100.0]
    guard = Guard(parse("rate_limit:\n  interval: 500ms\n  burst: 2\n"), clock=lambda: now[0])
    verdicts = [guard.check(None) for _ in range(3)]
    assert verdicts[:2] == [None, None] and verdicts[2] is not None and verdicts[2][0] == 429
    now[0] += 0.5  # one interval: one more request
    assert guard.check(None) is None
    assert guard.check(None) is not None
    assert guard.refused["rate_limited"] == 2


def test_no_rate_limit_and_no_users_lets_everything_through() -> None:
    guard = Guard(parse(""))
    assert not guard.active
    assert all(guard.check(None) is None for _ in range(100))


def test_basic_auth_and_its_cache() -> None:
    hashed = bcrypt.hashpw(b"s3cret:with:colons", bcrypt.gensalt(4)).decode()
    guard = Guard(parse(f"basic_auth_users:\n  alice: '{hashed}'\n"))
    assert guard.check(_basic("alice", "s3cret:with:colons")) is None
    assert guard.check(_basic("alice", "s3cret:with:colons")) is None  # the cached verdict
    cases = [(_basic("alice", "wrong"), "bad_password"),
             (_basic("bob", "s3cret:with:colons"), "unknown_user"),
             ("Bearer x", "missing"), ("Basic !!!notbase64", "malformed"), (None, "missing"),
             ("Basic " + base64.b64encode(b"no-colon").decode(), "malformed")]
    for header, reason in cases:
        before = guard.refused.snapshot()
        refusal = guard.check(header)
        assert refusal is not None and refusal[0] == 401, header
        assert ("WWW-Authenticate", 'Basic realm="gpufed"') in refusal[1]
        assert guard.refused.snapshot() == {**before, reason: before[reason] + 1}, header


def test_headers_go_out_in_a_fixed_order_blank_ones_left_out() -> None:
    guard = Guard(parse("http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=1\n"
                        "    X-Frame-Options: ''\n    Content-Security-Policy: default-src 'self'\n"))
    assert guard.headers == [("Content-Security-Policy", "default-src 'self'"),
                             ("Strict-Transport-Security", "max-age=1")]
