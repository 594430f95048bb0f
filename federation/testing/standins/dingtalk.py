"""In-process stand-in for DingTalk's custom-robot API (``POST /robot/send``).

A real HTTP server on a free loopback port, in a thread. Like DingTalk it answers HTTP
200 with an ``errcode``: it checks the access token, the signature (timestamp within an
hour, HMAC-SHA256 with the robot's secret), the keyword, the 20,000-byte limit and the
20-messages-a-minute limit (130101), records every accepted message, and can be scripted
to answer a given errcode next.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from federation.localrun.loopback import LOOPBACK, LoopbackHandler, LoopbackHTTPServer

MAX_BYTES = 20_000
PER_MINUTE = 20


@dataclass
class FakeRobot:
    token: str
    secret: str | None = None
    keywords: list[str] = field(default_factory=list)
    script: deque[int] = field(default_factory=deque)  # errcodes to answer next, then 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)


class FakeDingTalk:
    """``with FakeDingTalk() as api: url = api.add_robot("tok", secret="SEC...")``."""

    def __init__(self, *, enforce_rate_limit: bool = True, host: str = LOOPBACK, port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.robots: dict[str, FakeRobot] = {}
        self.enforce_rate_limit = enforce_rate_limit
        self.lock = threading.Lock()
        self._server = LoopbackHTTPServer(_handler_for(self), host=host, port=port, name="dingtalk-standin")
        self._tls = tls is not None
        if tls is not None:  # DingTalk's API is HTTPS only (the compose runner's stand-in for it)
            self._server.httpd.socket = tls.wrap_socket(self._server.httpd.socket, server_side=True)

    @property
    def base_url(self) -> str:
        return self._server.url.replace("http://", "https://", 1) if self._tls else self._server.url

    def add_robot(self, token: str, *, secret: str | None = None, keywords: list[str] | None = None) -> str:
        """Register a robot; returns its webhook URL (without timestamp/sign)."""
        self.robots[token] = FakeRobot(token=token, secret=secret, keywords=list(keywords or []))
        return f"{self.base_url}/robot/send?access_token={token}"

    def script(self, token: str, *errcodes: int) -> None:
        with self.lock:
            self.robots[token].script.extend(errcodes)

    def messages(self, token: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.robots[token].messages)

    def answer(self, query: str, body: bytes) -> tuple[int, str]:
        """DingTalk's decision for one request: (errcode, errmsg)."""
        params = {k: v[0] for k, v in parse_qs(query).items()}
        with self.lock:
            robot = self.robots.get(params.get("access_token", ""))
            if robot is None:
                return 300001, "token is not exist"
            if len(body) > MAX_BYTES:
                return self._reject(robot, 460101, "message too long")
            if robot.secret is not None:
                problem = _check_sign(robot.secret, params)
                if problem:
                    return self._reject(robot, 310000, f"sign not match: {problem}")
            message = json.loads(body)
            text = json.dumps(message.get(message.get("msgtype", ""), {}), ensure_ascii=False)
            if robot.keywords and not any(kw in text for kw in robot.keywords):
                return self._reject(robot, 310000, "keywords not in content")
            if robot.script:
                code = robot.script.popleft()
                if code:
                    return self._reject(robot, code, "scripted")
            now = time.monotonic()
            recent = [t for t in robot.received_at if t > now - 60]
            if self.enforce_rate_limit and len(recent) >= PER_MINUTE:
                return self._reject(robot, 130101, "send too fast, exceed 20 times per minute")
            robot.received_at.append(now)
            robot.messages.append(message)
            return 0, "ok"

    def _reject(self, robot: FakeRobot, code: int, why: str) -> tuple[int, str]:
        robot.rejected.append((code, why))
        return code, why

    def __enter__(self) -> FakeDingTalk:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _check_sign(secret: str, params: dict[str, str]) -> str | None:
    timestamp, sign = params.get("timestamp"), params.get("sign")
    if not timestamp or not sign:
        return "timestamp/sign missing"
    if abs(int(timestamp) - time.time() * 1000) > 3_600_000:
        return "timestamp more than an hour off"
    to_sign = f"{timestamp}\n{secret}".encode()
    expected = base64.b64encode(hmac.new(secret.encode(), to_sign, hashlib.sha256).digest()).decode()
    # parse_qs already URL-decoded the sign value.
    return None if hmac.compare_digest(expected, sign) else "signature mismatch"


def _handler_for(api: FakeDingTalk) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_GET(self) -> None:
            """``GET /v1/messages``: what every robot accepted and refused (read by a test from outside)."""
            if urlsplit(self.path).path != "/v1/messages":
                self.send_error(404)
                return
            with api.lock:
                body = {token: {"messages": r.messages, "rejected": r.rejected}
                        for token, r in api.robots.items()}
            self.reply(200, body)

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            body = self.body()
            if parts.path != "/robot/send":
                self.send_error(404)
                return
            code, msg = api.answer(parts.query, body)
            self.reply(200, {"errcode": code, "errmsg": msg}, content_type="application/json")

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Run the stand-in as its own process (the compose runner): serves until killed.

    ``--robots FILE``: a JSON list of ``{"token", "secret", "keywords"}``; ``--cert``/``--key``
    serve HTTPS as DingTalk does.
    """
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="DingTalk custom-robot API stand-in")
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--robots", type=Path, required=True)
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    args = parser.parse_args(argv)
    tls = None
    if args.cert is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.cert, args.key)
    api = FakeDingTalk(host=args.host, port=args.port, tls=tls)
    for robot in json.loads(args.robots.read_text()):
        api.add_robot(robot["token"], secret=robot.get("secret"), keywords=robot.get("keywords"))
    api.__enter__()
    print(api.base_url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
