"""In-process stand-in for WeCom's (企业微信) application-message API, as Alertmanager calls it.

Two calls, per WeCom's server API documentation (developer.work.weixin.qq.com, "获取
access_token" and "发送应用消息"):

* ``GET  /cgi-bin/gettoken?corpid=ID&corpsecret=SECRET`` answers
  ``{"errcode": 0, "errmsg": "ok", "access_token": "...", "expires_in": 7200}``;
  an unknown corp id is 40013, a wrong secret 40001 (no token in the answer).
* ``POST /cgi-bin/message/send?access_token=TOKEN`` with
  ``{"touser", "toparty", "totag", "msgtype", "agentid", "text"|"markdown": {"content"}, "safe"}``
  answers ``{"errcode": 0, "errmsg": "ok", "invaliduser": "", ...}``; no token is 41001, an
  unknown one 40014, an expired one 42001 (``expire_tokens``), an agent id other than the
  application's 40056, a msgtype other than text/markdown 40008, empty content 44004, no
  recipient at all (``touser``, ``toparty`` and ``totag`` empty) 82001, and a body that is
  not a JSON object 40058 (WeCom's "parameter not as the API requires").

WeCom answers HTTP 200 with an ``errcode`` in every case above, and so does this. Each
accepted message is recorded (``messages``), each refusal too (``rejected``). A real
HTTP server on a loopback port, in a thread (``federation.localrun.loopback``).
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from federation.localrun.loopback import LOOPBACK, LoopbackHandler, LoopbackHTTPServer

API_PREFIX = "/cgi-bin/"
TOKEN_SECONDS = 7200


@dataclass
class FakeApp:
    """One corp's self-built application: the secret and agent id Alertmanager is given."""

    corp_id: str
    secret: str
    agent_id: str
    tokens: set[str] = field(default_factory=set)
    expired: set[str] = field(default_factory=set)
    messages: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    token_requests: int = 0


class FakeWeCom:
    """``with FakeWeCom() as api: api.add_app("ww1", secret="s", agent_id="1000002")``;
    ``api.api_url`` is what ``wechat_configs[].api_url`` takes."""

    def __init__(self, *, host: str = LOOPBACK, port: int = 0) -> None:
        self.apps: dict[str, FakeApp] = {}
        self.lock = threading.Lock()
        self._server = LoopbackHTTPServer(_handler_for(self), host=host, port=port, name="wecom-standin")

    @property
    def api_url(self) -> str:
        return f"{self._server.url}{API_PREFIX}"

    def add_app(self, corp_id: str, *, secret: str, agent_id: str) -> FakeApp:
        app = FakeApp(corp_id=corp_id, secret=secret, agent_id=agent_id)
        with self.lock:
            self.apps[corp_id] = app
        return app

    def messages(self, corp_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.apps[corp_id].messages)

    def expire_tokens(self) -> None:
        """Every token issued so far now answers 42001 (as after its 7200 s)."""
        with self.lock:
            for app in self.apps.values():
                app.expired |= app.tokens
                app.tokens.clear()

    def get_token(self, query: str) -> dict[str, Any]:
        params = {k: v[0] for k, v in parse_qs(query).items()}
        with self.lock:
            app = self.apps.get(params.get("corpid", ""))
            if app is None:
                return {"errcode": 40013, "errmsg": "invalid corpid"}
            app.token_requests += 1
            if params.get("corpsecret") != app.secret:
                app.rejected.append((40001, "invalid credential"))
                return {"errcode": 40001, "errmsg": "invalid credential"}
            token = secrets.token_urlsafe(24)
            app.tokens.add(token)
            return {"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": TOKEN_SECONDS}

    def send(self, query: str, body: bytes) -> dict[str, Any]:
        token = parse_qs(query).get("access_token", [""])[0]
        if not token:
            return {"errcode": 41001, "errmsg": "access_token missing"}
        with self.lock:
            app = next((a for a in self.apps.values() if token in a.tokens), None)
            if app is not None:
                return self._accept(app, body)
            stale = next((a for a in self.apps.values() if token in a.expired), None)
            if stale is not None:
                return self._reject(stale, 42001, "access_token expired")
            return {"errcode": 40014, "errmsg": "invalid access_token"}

    def _accept(self, app: FakeApp, body: bytes) -> dict[str, Any]:
        try:
            message = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self._reject(app, 40058, "invalid parameter, Warning: wrong json format.")
        if not isinstance(message, dict):
            return self._reject(app, 40058, "invalid parameter")
        if str(message.get("agentid", "")) != app.agent_id:
            return self._reject(app, 40056, "invalid agentid")
        kind = message.get("msgtype")
        if kind not in ("text", "markdown"):
            return self._reject(app, 40008, "invalid message type")
        content = (message.get(kind) or {}).get("content", "") if isinstance(message.get(kind), dict) else ""
        if not content:
            return self._reject(app, 44004, "empty content")
        if not any(message.get(key) for key in ("touser", "toparty", "totag")):
            return self._reject(app, 82001, "touser, toparty and totag are all empty")
        app.messages.append(message)
        return {"errcode": 0, "errmsg": "ok", "invaliduser": "", "invalidparty": "", "invalidtag": "",
                "msgid": secrets.token_hex(8)}

    @staticmethod
    def _reject(app: FakeApp, code: int, why: str) -> dict[str, Any]:
        app.rejected.append((code, why))
        return {"errcode": code, "errmsg": why}

    def __enter__(self) -> FakeWeCom:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _handler_for(api: FakeWeCom) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != f"{API_PREFIX}gettoken":
                self.send_error(404)
                return
            self.reply(200, api.get_token(parts.query), content_type="application/json")

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            body = self.body()
            if parts.path != f"{API_PREFIX}message/send":
                self.send_error(404)
                return
            self.reply(200, api.send(parts.query, body), content_type="application/json")

    return Handler
