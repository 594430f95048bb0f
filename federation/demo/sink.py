"""A local DingTalk: the robot endpoint the demo's relay posts to, printing what a group sees.

``POST /robot/send?access_token=..&timestamp=..&sign=..`` answers like DingTalk's custom
robot (HTTP 200 with an ``errcode``): it knows each robot's token and signing secret
(the demo generates both and hands them to the relay through its environment), checks
the signature (HMAC-SHA256 of ``"{timestamp}\\n{secret}"``, timestamp within an hour)
and the 20,000-byte limit, and records and prints every accepted message as the group
would read it. ``POST /heartbeat`` takes the Watchdog notifications Alertmanager sends
to the heartbeat receiver (a dead man's switch stand-in). ``GET /messages`` lists what
arrived, for tests and curious users.

The signature check is written here again on purpose rather than calling the relay's
signer: the sink checks the relay, so it must not share its code.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer

MAX_BYTES = 20_000
MAX_REQUEST = 1 << 20


@dataclass(frozen=True)
class Robot:
    name: str
    token: str
    secret: str


@dataclass(frozen=True)
class Message:
    robot: str
    at: float
    title: str
    text: str


@dataclass
class Inbox:
    messages: list[Message] = field(default_factory=list)
    rejected: list[tuple[str, int, str]] = field(default_factory=list)
    heartbeats: int = 0


def signature(secret: str, timestamp: str) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def as_group_sees_it(message: Message) -> str:
    """A message the way the group's chat window shows it: robot, time, then the text."""
    clock = time.strftime("%H:%M:%S", time.localtime(message.at))
    lines = message.text.strip().splitlines() or [message.title]
    body = "\n".join(f"  │ {line}" for line in lines)
    return f"  ┌─ DingTalk group of robot {message.robot} · {clock}\n{body}\n  └─"


class DingTalkSink:
    """Use as a context manager: ``with DingTalkSink(robots, port=p, on_message=print) as sink``."""

    def __init__(
        self,
        robots: Mapping[str, Robot],
        *,
        port: int = 0,
        on_message: Callable[[Message], None] = lambda message: None,
    ) -> None:
        self.robots = {robot.token: robot for robot in robots.values()}
        self.on_message = on_message
        self.inbox = Inbox()
        self.lock = threading.Lock()
        self._server = LoopbackHTTPServer(_handler(self), port=port, name="sink")

    @property
    def port(self) -> int:
        return self._server.port

    def snapshot(self) -> Inbox:
        with self.lock:
            return Inbox(list(self.inbox.messages), list(self.inbox.rejected), self.inbox.heartbeats)

    def robot_send(self, query: str, body: bytes) -> tuple[int, str]:
        """DingTalk's answer to one robot request: (errcode, errmsg)."""
        params = {k: v[0] for k, v in parse_qs(query).items()}
        robot = self.robots.get(params.get("access_token", ""))
        if robot is None:
            return 300001, "token is not exist"
        code, why = self._check(robot, params, body)
        if code:
            with self.lock:
                self.inbox.rejected.append((robot.name, code, why))
            return code, why
        doc = json.loads(body)
        kind = doc.get("msgtype", "")
        content = doc.get(kind, {}) if isinstance(doc.get(kind), dict) else {}
        text = str(content.get("text") or content.get("content") or "")
        message = Message(robot=robot.name, at=time.time(), title=str(content.get("title", "")), text=text)
        with self.lock:
            self.inbox.messages.append(message)
        self.on_message(message)
        return 0, "ok"

    def _check(self, robot: Robot, params: dict[str, str], body: bytes) -> tuple[int, str]:
        timestamp, sign = params.get("timestamp", ""), params.get("sign", "")
        if not timestamp.isdigit() or not sign:
            return 310000, "sign not match: timestamp/sign missing"
        if abs(int(timestamp) - time.time() * 1000) > 3_600_000:
            return 310000, "sign not match: timestamp more than an hour off"
        if not hmac.compare_digest(signature(robot.secret, timestamp), sign):
            return 310000, "sign not match"
        if len(body) > MAX_BYTES:
            return 460101, "message too long"
        try:
            doc = json.loads(body)
        except ValueError:
            return 40035, "invalid JSON"
        if not isinstance(doc, dict) or "msgtype" not in doc:
            return 40035, "missing msgtype"
        return 0, ""

    def heartbeat(self, body: bytes) -> None:
        with self.lock:
            self.inbox.heartbeats += 1

    def messages_document(self) -> dict[str, Any]:
        inbox = self.snapshot()
        return {
            "messages": [vars(m) for m in inbox.messages],
            "rejected": [{"robot": r, "errcode": c, "errmsg": w} for r, c, w in inbox.rejected],
            "heartbeats": inbox.heartbeats,
        }

    def __enter__(self) -> DingTalkSink:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _handler(sink: DingTalkSink) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST:
                self.reply(413, {"errcode": 413, "errmsg": "too large"})
                return
            body = self.rfile.read(length)
            if parts.path == "/robot/send":
                code, msg = sink.robot_send(parts.query, body)
                self.reply(200, {"errcode": code, "errmsg": msg})
            elif parts.path == "/heartbeat":
                sink.heartbeat(body)
                self.reply(200, {"status": "ok"})
            else:
                self.reply(404, {"errcode": 404, "errmsg": "not found"})

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/messages":
                self.reply(200, sink.messages_document())
            elif path == "/healthz":
                self.reply(200, {"status": "ok"})
            else:
                self.reply(404, {"errcode": 404, "errmsg": "not found"})

    return Handler
