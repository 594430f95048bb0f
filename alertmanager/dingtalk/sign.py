"""DingTalk custom-robot request signing ("加签").

DingTalk's rule: string_to_sign = f"{timestamp_ms}\\n{secret}", HMAC-SHA256 keyed with the
secret, base64, then URL-encoded; ``&timestamp=..&sign=..`` is appended to the robot URL.
The timestamp must be within an hour of DingTalk's clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import quote_plus


def sign(secret: str, timestamp_ms: int) -> str:
    """The URL-encoded ``sign`` query value for one request."""
    to_sign = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), to_sign, hashlib.sha256).digest()
    return quote_plus(base64.b64encode(digest))


def signed_url(url: str, secret: str | None, timestamp_ms: int) -> str:
    """Robot URL with timestamp and sign appended (unchanged when there is no secret)."""
    if not secret:
        return url
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}timestamp={timestamp_ms}&sign={sign(secret, timestamp_ms)}"
