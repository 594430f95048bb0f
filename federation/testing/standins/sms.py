"""Stand-in for an SMS gateway adapter: the webhook receiver Alertmanager posts pages to.

gpufed sends SMS through Alertmanager's generic ``webhook_configs``: the adapter that turns
a notification into text messages (and knows the phone numbers and the SMS vendor) is the
user's. This stand-in is the adapter's HTTP edge, as Alertmanager calls it: ``POST`` of the
webhook payload (``version`` "4", ``groupKey``, ``status``, ``receiver``, ``alerts`` with
``labels``/``annotations``/``startsAt``/``endsAt``/``fingerprint``), with the bearer token
of ``http_config.authorization.credentials_file`` when the receiver names one. It answers
401 to a wrong or missing token, 400 to a body that is not such a payload, 200 otherwise,
and records each accepted payload with the one-line text an adapter would send.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from federation.localrun.loopback import LOOPBACK, LoopbackHandler, LoopbackHTTPServer


def sms_text(alert: dict[str, Any]) -> str:
    """What a short message of one alert could say (an adapter's choice, shown for tests)."""
    labels = alert.get("labels", {})
    where = " ".join(f"{k}={labels[k]}" for k in ("region", "node", "gpu") if labels.get(k))
    return f"[{str(alert.get('status', '')).upper()}] {labels.get('alertname', '?')} {where}".strip()


class FakeSmsGateway:
    """``with FakeSmsGateway(token="t") as sms: url = sms.url``; ``payloads()`` once posted."""

    def __init__(self, *, token: str | None = None, host: str = LOOPBACK, port: int = 0) -> None:
        self.token = token
        self.lock = threading.Lock()
        self._payloads: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self.refused: list[int] = []
        self._server = LoopbackHTTPServer(_handler_for(self), host=host, port=port, name="sms-standin")

    @property
    def url(self) -> str:
        return f"{self._server.url}/alert"

    def payloads(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._payloads)

    def accept(self, authorization: str | None, body: bytes) -> int:
        if self.token is not None and authorization != f"Bearer {self.token}":
            return self._refuse(401)
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self._refuse(400)
        if not isinstance(payload, dict) or payload.get("version") != "4" or not isinstance(
                payload.get("alerts"), list):
            return self._refuse(400)
        with self.lock:
            self._payloads.append(payload)
            self.texts += [sms_text(a) for a in payload["alerts"] if isinstance(a, dict)]
        return 200

    def _refuse(self, status: int) -> int:
        with self.lock:
            self.refused.append(status)
        return status

    def __enter__(self) -> FakeSmsGateway:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _handler_for(gateway: FakeSmsGateway) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_POST(self) -> None:
            if self.path != "/alert":
                self.send_error(404)
                return
            status = gateway.accept(self.headers.get("Authorization"), self.body())
            self.reply(status, {"status": "ok" if status == 200 else "refused"})

    return Handler
