"""Signing: against an independent computation and a fixed, hand-derived vector."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import parse_qs, quote_plus, urlsplit

from alertmanager.dingtalk.sign import sign, signed_url

from .payloads import SECRET

TIMESTAMP = 1_700_000_000_000
# Derived once with: base64(HMAC-SHA256(key=SECRET, msg=f"{TIMESTAMP}\n{SECRET}")), then
# urllib.parse.quote_plus; DingTalk's documented Python sample gives the same value.
EXPECTED = "loAs986iXlZUJyoAu2REiC16DMGrtdERSegy7jQ3Qtg%3D"


def test_sign_matches_independent_hmac() -> None:
    digest = hmac.new(SECRET.encode("utf-8"), f"{TIMESTAMP}\n{SECRET}".encode(), hashlib.sha256).digest()
    assert sign(SECRET, TIMESTAMP) == quote_plus(base64.b64encode(digest).decode())


def test_sign_matches_hard_coded_vector() -> None:
    assert sign(SECRET, TIMESTAMP) == EXPECTED


def test_signed_url_appends_timestamp_and_sign() -> None:
    url = signed_url("https://oapi.dingtalk.com/robot/send?access_token=t", SECRET, TIMESTAMP)
    query = parse_qs(urlsplit(url).query)
    assert query["access_token"] == ["t"]
    assert query["timestamp"] == [str(TIMESTAMP)]
    assert url.endswith(f"&sign={EXPECTED}")


def test_no_secret_leaves_url_alone() -> None:
    assert signed_url("https://x/robot/send?access_token=t", None, TIMESTAMP) == "https://x/robot/send?access_token=t"
