"""Masking is linear (issue 29, item 2): the URL scan behind ``redact_text`` looks at each
character a bounded number of times, counted in steps (operations), never in wall time.

Ten times the text costs at most about ten times the steps (the bound allows 20x), for
any text hypothesis draws, including the shape that was quadratic: long runs of scheme
characters that never reach ``://``. And the scan finds exactly what the old expression
found, so nothing that was masked goes unmasked.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from federation.controller.http import redact, url_scan

OLD_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s\"'<>]+", re.I)
PIECES = st.sampled_from(
    ["a", "Z", "9", "+", ".", "-", ":", "/", "://", " ", "\n", "'", '"', "<", ">", "@", "?", "&", "=",
     "http", "https://", "u:p@", "token=", "x", "é", "\udfff"]
)  # fmt: skip
TEXT = st.lists(PIECES, min_size=1, max_size=60).map("".join)


def steps(text: str) -> int:
    scanner = url_scan.UrlScanner()
    list(scanner.spans(text))
    return scanner.steps


@settings(max_examples=200, deadline=None, database=None)
@given(unit=TEXT, times=st.integers(min_value=10, max_value=40))
def test_ten_times_the_text_costs_at_most_twenty_times_the_steps(unit: str, times: int) -> None:
    small = unit * times
    large = unit * (times * 10)
    assert steps(large) <= 20 * max(steps(small), len(small)), (unit, times)
    assert steps(large) <= 3 * len(large) + 3


@settings(max_examples=20, deadline=None, database=None)
@given(char=st.sampled_from("aZ9+.-"), size=st.integers(min_value=1_000, max_value=8_000))
def test_a_long_scheme_run_is_looked_at_once(char: str, size: int) -> None:
    """The reproduction of the issue: a node of thousands of scheme characters, no '://'."""
    assert steps(char * size) <= size + 3
    node = "gpu-" + char * size + "://"  # reaches '://' with nothing after it
    assert steps(node) <= 3 * len(node)


@settings(max_examples=400, deadline=None, database=None)
@given(text=TEXT)
def test_the_scan_finds_what_the_old_expression_found(text: str) -> None:
    assert [m.span() for m in OLD_URL.finditer(text)] == list(url_scan.UrlScanner().spans(text))
    urls_masked = OLD_URL.sub(lambda m: redact.secrets.mask_url(m.group(0), redact.MASK), text)
    # then scheme-less user:password@host as well (issue 38: one masking for every surface)
    assert redact.redact_text(text) == redact.secrets.mask_userinfo(urls_masked, redact.MASK)


def test_credentials_in_text_are_still_masked() -> None:
    line = "GET https://u:s3cr3tpw@h.example/p?token=abc&x=1 then 'ftp://a:b@c' and <http://ok.example/>"
    masked = redact.redact_text(line)
    assert "s3cr3tpw" not in masked and "abc" not in masked and ":b@" not in masked
    assert "x=1" in masked and "http://ok.example/" in masked
