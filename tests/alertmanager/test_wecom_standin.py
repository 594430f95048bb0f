"""The WeCom stand-in answers as WeCom documents: a token for the right corp and secret, the
documented errcodes otherwise (HTTP 200 with ``errcode`` in every case)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from federation.testing.standins.wecom import FakeWeCom

CORP, SECRET, AGENT = "ww-standin", "app-secret-1", "1000002"


@pytest.fixture
def api() -> Iterator[FakeWeCom]:
    with FakeWeCom() as server:
        server.add_app(CORP, secret=SECRET, agent_id=AGENT)
        yield server


def token(api: FakeWeCom, corp: str = CORP, secret: str = SECRET) -> dict[str, Any]:
    response = httpx.get(f"{api.api_url}gettoken", params={"corpid": corp, "corpsecret": secret}, timeout=5)
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


def send(api: FakeWeCom, access_token: str, body: dict[str, Any] | bytes) -> int:
    url = f"{api.api_url}message/send"
    params = {"access_token": access_token} if access_token else {}
    if isinstance(body, bytes):
        response = httpx.post(url, params=params, content=body, timeout=5)
    else:
        response = httpx.post(url, params=params, json=body, timeout=5)
    assert response.status_code == 200
    return int(response.json()["errcode"])


MESSAGE = {"touser": "@all", "msgtype": "text", "agentid": AGENT, "text": {"content": "hi"}, "safe": "0"}


def test_token_then_message(api: FakeWeCom) -> None:
    answer = token(api)
    assert answer["errcode"] == 0 and answer["expires_in"] == 7200 and answer["access_token"]
    assert send(api, answer["access_token"], MESSAGE) == 0
    assert api.messages(CORP) == [MESSAGE]


def test_refusals(api: FakeWeCom) -> None:
    assert token(api, corp="ww-other")["errcode"] == 40013
    wrong = token(api, secret="nope")
    assert wrong["errcode"] == 40001 and "access_token" not in wrong
    good = token(api)["access_token"]
    assert send(api, "", MESSAGE) == 41001
    assert send(api, "forged", MESSAGE) == 40014
    assert send(api, good, {**MESSAGE, "agentid": "1000003"}) == 40056
    assert send(api, good, {**MESSAGE, "msgtype": "news"}) == 40008
    assert send(api, good, {**MESSAGE, "text": {"content": ""}}) == 44004
    assert send(api, good, {**MESSAGE, "touser": ""}) == 82001
    assert send(api, good, b"{not json") == 40058
    api.expire_tokens()
    assert send(api, good, MESSAGE) == 42001
    assert api.messages(CORP) == []
