"""The one module that talks HTTP to DingTalk: signed POST, errors mapped at the boundary.

DingTalk answers most failures as HTTP 200 with a non-zero ``errcode``; the mapping is:

    errcode 0                         delivered
    130101 (send too fast)            ThrottledError: the robot's limiter backs off
    -1 (busy)                         TransientDeliveryError (Alertmanager retries)
    HTTP 5xx/429, network errors      TransientDeliveryError
    310000 (sign/keyword/IP), others  PermanentDeliveryError (retrying cannot help)
    HTTP 4xx                          PermanentDeliveryError
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Protocol

import httpx

from alertmanager.dingtalk.config import RobotConfig
from alertmanager.dingtalk.errors import PermanentDeliveryError, ThrottledError, TransientDeliveryError
from alertmanager.dingtalk.render import Part
from alertmanager.dingtalk.sign import signed_url

TOO_FAST = 130101
TRANSIENT_ERRCODES = frozenset({TOO_FAST, -1})
_SECRET_QUERY = re.compile(r"(access_token|sign)=[^&\s'\"]+")


def redact(text: str, robot: RobotConfig | None = None) -> str:
    """Strip tokens, signatures and the robot secret from anything that may be logged."""
    text = _SECRET_QUERY.sub(r"\1=<redacted>", text)
    if robot is not None and robot.secret is not None and robot.secret.get_secret_value():
        text = text.replace(robot.secret.get_secret_value(), "<redacted>")
    return text


class Sender(Protocol):
    """What ``sender`` needs from a DingTalk client (tests may supply their own)."""

    async def send(self, robot: RobotConfig, part: Part) -> None: ...


class DingTalkClient:
    """Posts markdown messages to robots through an injected ``httpx.AsyncClient``."""

    def __init__(self, http: httpx.AsyncClient, *, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._timeout = timeout
        self._clock = clock

    async def send(self, robot: RobotConfig, part: Part) -> None:
        secret = robot.secret.get_secret_value() if robot.secret else None
        url = signed_url(robot.url.get_secret_value(), secret, int(self._clock() * 1000))
        body = json.dumps(part.body(), ensure_ascii=False).encode()
        try:
            response = await self._http.post(
                url, content=body, headers={"Content-Type": "application/json; charset=utf-8"},
                timeout=self._timeout)
        except httpx.HTTPError as exc:
            detail = redact(f"{type(exc).__name__}: {exc}", robot)
            raise TransientDeliveryError(f"DingTalk unreachable: {detail}", reason="network") from exc
        code = response.status_code
        if code >= 500 or code == 429:
            raise TransientDeliveryError(f"DingTalk answered HTTP {code}", reason=f"http_{code}")
        if code >= 400:
            raise PermanentDeliveryError(f"DingTalk answered HTTP {code}", reason=f"http_{code}")
        try:
            answer = response.json()
            errcode = int(answer.get("errcode", 0))
            errmsg = str(answer.get("errmsg", ""))
        except (ValueError, AttributeError, TypeError) as exc:
            raise TransientDeliveryError("DingTalk answered non-JSON", reason="bad_response") from exc
        if errcode == 0:
            return
        detail = redact(f"DingTalk errcode {errcode}: {errmsg}", robot)
        if errcode == TOO_FAST:
            raise ThrottledError(detail, retry_after=0, reason=f"errcode_{errcode}")
        if errcode in TRANSIENT_ERRCODES:
            raise TransientDeliveryError(detail, reason=f"errcode_{errcode}")
        raise PermanentDeliveryError(detail, reason=f"errcode_{errcode}")
