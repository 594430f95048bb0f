"""A local DingTalk: the custom-robot API (``POST /robot/send``) on this machine.

One server for everything that needs a DingTalk group here: the demo's relay posts to it
and it shows each message as the group reads it (``on_message``); the tests and benches
post to it and read back what it accepted and refused; the compose runner starts it as a
process of its own (``python -m federation.localrun.dingtalk``) serving HTTPS as
``oapi.dingtalk.com``.

Like DingTalk it answers HTTP 200 with an ``errcode`` and an ``errmsg``, checked in this order::

    300001  token is not exist            the access_token names no robot added here
    310000  sign not match: ...           timestamp/sign missing, more than an hour off, or the
                                          HMAC-SHA256 of "{timestamp}\\n{secret}" differs
                                          (robots added with a secret)
    460101  message too long              a body over 20,000 bytes
    40035   missing parameter: ...        a body that is not a JSON object with a msgtype
    310000  keywords not in content       none of the robot's keywords in the message
    any     scripted                      ``script(token, *errcodes)``: answered next, in order
    130101  send too fast, ...            a 21st message within a minute (``enforce_rate_limit``)
    0       ok                            accepted: recorded, and handed to ``on_message``

Routes that are not DingTalk's: ``POST /heartbeat`` counts the Watchdog notifications
Alertmanager sends the demo's heartbeat receiver (a dead man's switch stand-in);
``GET /v1/messages`` lists what arrived and what was refused (the demo prints its URL, the
compose runner reads it from outside the run); ``GET /healthz``.

The signature check is written here again on purpose rather than calling the relay's signer:
this server checks the relay, so it must not share its code.
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from federation.localrun.loopback import LOOPBACK, LoopbackHandler, LoopbackHTTPServer

MAX_BYTES = 20_000
PER_MINUTE = 20
MAX_REQUEST = 1 << 20


@dataclass(frozen=True)
class Message:
    """One accepted message: the robot's name, when (wall clock), its title and text as the
    group sees them, and ``body``, the JSON document DingTalk received."""

    robot: str
    at: float
    title: str
    text: str
    body: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Rejection:
    robot: str
    errcode: int
    errmsg: str


@dataclass(frozen=True)
class Inbox:
    messages: list[Message]
    rejected: list[Rejection]
    heartbeats: int


@dataclass
class _Robot:
    token: str
    name: str
    secret: str | None
    keywords: tuple[str, ...]
    script: deque[int] = field(default_factory=deque)  # errcodes to answer next, then 0
    sent: deque[float] = field(default_factory=deque)  # monotonic times of the last minute's messages


def signature(secret: str, timestamp: str) -> str:
    """DingTalk's ``sign``: base64 of the HMAC-SHA256, keyed by the secret, of "{timestamp}\\n{secret}"."""
    digest = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def as_group_sees_it(message: Message) -> str:
    """A message the way the group's chat window shows it: robot, time, then the text."""
    clock = time.strftime("%H:%M:%S", time.localtime(message.at))
    lines = message.text.strip().splitlines() or [message.title]
    body = "\n".join(f"  │ {line}" for line in lines)
    return f"  ┌─ DingTalk group of robot {message.robot} · {clock}\n{body}\n  └─"


class LocalDingTalk:
    """``with LocalDingTalk() as dingtalk: url = dingtalk.add_robot("tok", secret="SEC...")``."""

    def __init__(
        self,
        *,
        host: str = LOOPBACK,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        enforce_rate_limit: bool = True,
        on_message: Callable[[Message], None] | None = None,
    ) -> None:
        self.enforce_rate_limit = enforce_rate_limit
        self.on_message = on_message
        self._robots: dict[str, _Robot] = {}
        self._messages: list[Message] = []
        self._rejected: list[Rejection] = []
        self._heartbeats = 0
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(_handler(self), host=host, port=port, name="dingtalk")
        self._tls = tls is not None
        if tls is not None:  # DingTalk's API is HTTPS only (the compose runner's oapi.dingtalk.com)
            self._server.httpd.socket = tls.wrap_socket(self._server.httpd.socket, server_side=True)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base_url(self) -> str:
        return self._server.url.replace("http://", "https://", 1) if self._tls else self._server.url

    def add_robot(self, token: str, *, secret: str | None = None, keywords: Iterable[str] = (),
                  name: str | None = None) -> str:
        """Add (or replace) the robot ``token``, named ``name`` (the token when none is given) in
        what it records; returns its webhook URL, without timestamp and sign."""
        name = token if name is None else name
        with self._lock:
            if any(r.name == name and r.token != token for r in self._robots.values()):
                raise ValueError(f"robot name {name!r} is already taken by another token")
            self._robots[token] = _Robot(token=token, name=name, secret=secret, keywords=tuple(keywords))
        return f"{self.base_url}/robot/send?access_token={token}"

    def script(self, token: str, *errcodes: int) -> None:
        """The robot ``token`` answers these errcodes to its next requests that pass the checks."""
        with self._lock:
            self._robots[token].script.extend(errcodes)

    def messages(self, token: str) -> list[Message]:
        """What the robot ``token`` accepted, in order."""
        with self._lock:
            name = self._robots[token].name
            return [m for m in self._messages if m.robot == name]

    def rejected(self, token: str) -> list[Rejection]:
        """What the robot ``token`` refused, in order (an unknown token is nobody's refusal)."""
        with self._lock:
            name = self._robots[token].name
            return [r for r in self._rejected if r.robot == name]

    def snapshot(self) -> Inbox:
        """Every robot's messages and refusals in arrival order, and the heartbeats counted."""
        with self._lock:
            return Inbox(list(self._messages), list(self._rejected), self._heartbeats)

    def answer(self, query: str, body: bytes) -> tuple[int, str]:
        """DingTalk's answer to one ``POST /robot/send``: (errcode, errmsg)."""
        params = {k: v[0] for k, v in parse_qs(query).items()}  # parse_qs URL-decodes the sign
        with self._lock:
            robot = self._robots.get(params.get("access_token", ""))
            if robot is None:
                return 300001, "token is not exist"
            code, why, message = _judge(robot, params, body)
            if not code and robot.script:
                code, why = robot.script.popleft(), "scripted"
            now = time.monotonic()
            while robot.sent and robot.sent[0] <= now - 60:
                robot.sent.popleft()
            if not code and self.enforce_rate_limit and len(robot.sent) >= PER_MINUTE:
                code, why = 130101, "send too fast, exceed 20 times per minute"
            if code or message is None:
                self._rejected.append(Rejection(robot.name, code, why))
                return code, why
            robot.sent.append(now)
            self._messages.append(message)
        if self.on_message is not None:
            self.on_message(message)
        return 0, "ok"

    def heartbeat(self) -> None:
        with self._lock:
            self._heartbeats += 1

    def document(self) -> dict[str, Any]:
        """``GET /v1/messages``: the snapshot as JSON (tokens left out: robots go by name)."""
        inbox = self.snapshot()
        return {
            "messages": [{"robot": m.robot, "at": m.at, "title": m.title, "text": m.text, "body": m.body}
                         for m in inbox.messages],
            "rejected": [{"robot": r.robot, "errcode": r.errcode, "errmsg": r.errmsg}
                         for r in inbox.rejected],
            "heartbeats": inbox.heartbeats,
        }

    def __enter__(self) -> LocalDingTalk:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _judge(robot: _Robot, params: Mapping[str, str], body: bytes) -> tuple[int, str, Message | None]:
    """DingTalk's checks of one request to a known robot, before its script and rate limit."""
    if robot.secret is not None:
        problem = _sign_problem(robot.secret, params)
        if problem:
            return 310000, f"sign not match: {problem}", None
    if len(body) > MAX_BYTES:
        return 460101, "message too long, exceed 20000 bytes", None
    try:
        doc = json.loads(body)
    except ValueError:
        return 40035, "missing parameter: json", None
    if not isinstance(doc, dict) or not isinstance(doc.get("msgtype"), str):
        return 40035, "missing parameter: msgtype", None
    content = doc.get(doc["msgtype"])
    content = content if isinstance(content, dict) else {}
    shown = json.dumps(content, ensure_ascii=False)
    if robot.keywords and not any(keyword in shown for keyword in robot.keywords):
        return 310000, "keywords not in content", None
    text = str(content.get("text") or content.get("content") or "")
    title = str(content.get("title", ""))
    return 0, "", Message(robot=robot.name, at=time.time(), title=title, text=text, body=doc)


def _sign_problem(secret: str, params: Mapping[str, str]) -> str | None:
    timestamp, sign = params.get("timestamp", ""), params.get("sign", "")
    if not timestamp.isdigit() or not sign:
        return "timestamp/sign missing"
    if abs(int(timestamp) - time.time() * 1000) > 3_600_000:
        return "timestamp more than an hour off"
    return None if hmac.compare_digest(signature(secret, timestamp), sign) else "signature mismatch"


def _handler(dingtalk: LocalDingTalk) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST:
                self.reply(413, {"errcode": 413, "errmsg": "too large"})
                return
            body = self.rfile.read(length)
            if parts.path == "/robot/send":
                code, why = dingtalk.answer(parts.query, body)
                self.reply(200, {"errcode": code, "errmsg": why}, content_type="application/json")
            elif parts.path == "/heartbeat":
                dingtalk.heartbeat()
                self.reply(200, {"status": "ok"})
            else:
                self.reply(404, {"errcode": 404, "errmsg": "not found"})

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/v1/messages":
                self.reply(200, dingtalk.document())
            elif path == "/healthz":
                self.reply(200, {"status": "ok"})
            else:
                self.reply(404, {"errcode": 404, "errmsg": "not found"})

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until killed, as its own process (the compose runner's ``oapi.dingtalk.com``).

    ``--robots FILE``: a JSON list of ``{"token", "secret", "keywords", "name"}`` (all but the
    token optional); ``--cert``/``--key`` serve HTTPS, as DingTalk does.
    """
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description="A local DingTalk custom-robot API")
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
    dingtalk = LocalDingTalk(host=args.host, port=args.port, tls=tls)
    try:
        robots = json.loads(args.robots.read_text())
        for robot in robots:
            dingtalk.add_robot(robot["token"], secret=robot.get("secret"),
                               keywords=robot.get("keywords") or (), name=robot.get("name"))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        parser.error(f"--robots {args.robots}: want a JSON list of objects with a token ({exc!r})")
    with dingtalk:
        print(dingtalk.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
