"""A corpus of credential shapes is never served without a token (issue 38, item 4).

Every shape carries a unique marker; targets are registered with the shapes in their labels,
bad registrations quote them, a pin's reason names them (the audit). Then every route a
client without a token can reach is read, and errors are provoked: no marker may appear in
any body. The webhook formats are the services' documented ones (Feishu/Lark
``/open-apis/bot/v2/hook/<token>``, DingTalk ``/robot/send?access_token=``, WeCom
``/cgi-bin/webhook/send?key=``, Slack ``hooks.slack.com/services/T/B/<secret>``, Discord
``/api/webhooks/<id>/<token>``, Telegram ``/bot<token>/<method>``, Teams
``<org>.webhook.office.com/webhookb2/...`` and Workflows' ``logic.azure.com`` triggers).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from federation.controller.base.options import ControllerOptions
from tests.controller.harness import build

_n = itertools.count()


def _marker() -> str:
    return f"Zq{next(_n):03d}xSECRETx9f3"


SECRET_LABELS = (
    "password", "passwd", "pwd", "pass", "passphrase", "secret", "client_secret", "clientSecret",
    "token", "access_token", "accessToken", "refresh_token", "id_token", "token2", "tokens",
    "api_key", "apiKey", "apiKeys", "x_api_key", "x_api_key_2", "X_API_KEY", "apikey", "authkey",
    "auth", "authorization", "bearer", "credential", "credentials", "session", "session_key",
    "cookie", "jwt", "otp", "signature", "sig", "sign", "routing_key", "secret_key", "secretKey",
    "private_key", "privateKey", "access_key", "accesskey", "passkey", "passcode", "x_passcode",
    "hmac", "hmac_key", "db_password", "DB_PASSWORD", "mysql_root_password", "webhook_url",
    "slack_api_url", "x_honeycomb_team",
)  # fmt: skip

URL_SHAPES = (
    "https://admin:{m}@db.example:5432/x",
    "http://{m}@cache.example/",
    "https://api.example/v1?token={m}",
    "https://api.example/v1?api_key={m}&x=1",
    "https://api.example/v1?apiKey={m}",
    "https://api.example/v1?X-Api-Key-2={m}",
    "https://api.example/v1?apiKeys={m}",
    "https://api.example/v1?passcode={m}",
    "https://fn.example/api/run?code={m}",
    "https://blob.example/c/b?sv=2024&sig={m}",
    "https://api.example/v1?access_token={m}",
    "https://api.example/v1#access_token={m}",
    "https://api.example/v1;session={m}",
    "https://api.example/v1?password={m}",
    "https://api.example/v1?secret={m}",
    "https://api.example/v1?auth={m}",
    "https://open.feishu.cn/open-apis/bot/v2/hook/{m}",
    "https://open.larksuite.com/open-apis/bot/v2/hook/{m}",
    "https://www.feishu.cn/flow/api/trigger-webhook/{m}",
    "https://oapi.dingtalk.com/robot/send?access_token={m}",
    "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={m}",
    "https://hooks.slack.com/services/T0000/B0000/{m}",
    "https://hooks.slack.com/workflows/T0000/A0000/1234/{m}",
    "https://discord.com/api/webhooks/123456789/{m}",
    "https://discordapp.com/api/webhooks/123456789/{m}",
    "https://canary.discord.com/api/webhooks/123456789/{m}",
    "https://api.telegram.org/bot123456:{m}/sendMessage",
    "https://contoso.webhook.office.com/webhookb2/g@t/IncomingWebhook/{m}/o",
    "https://outlook.office.com/webhook/{m}/IncomingWebhook/a/b",
    "https://prod-01.westus.logic.azure.com:443/workflows/{m}/triggers/manual/paths/invoke?api-version=1",
    "https://prod-01.westus.logic.azure.com/workflows/abc/triggers/manual/paths/invoke?sp=x&sv=1.0&sig={m}",
    "https://alerts.example/hooks/{m}",
    "https://alerts.example/webhook/{m}",
    "https://api.example/v1?TOKEN={m}",
    "https://api.example/v1?Api-Key={m}",
    "https://api.example/v1?api%5Fkey={m}",
    "https://api.example/v1?private_token={m}",
    "https://api.example/v1?client_secret={m}",
    "https://s3.example/b/o?X-Amz-Credential=a&X-Amz-Signature={m}",
    "https://api.example/v1?jwt={m}",
    "https://api.example/v1?otp={m}",
    "https://api.example/v1?x=1&refresh_token={m}&y=2",
    "https://api.example/v1?session_key={m}",
    "https://api.example/v1?hmac={m}",
    "https://{m}:@registry.example/",
    "HTTPS://ADMIN:{m}@DB.EXAMPLE/",
    "https://open.feishu.cn/open-apis/bot/v1/hook/{m}",
    "http://hooks.slack.com/services/T1/B1/{m}",
    "https://ptb.discord.com/api/v10/webhooks/42/{m}",
    "https://oapi.dingtalk.com/robot/send?access_token={m}&timestamp=1&sign=abc",
    "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={m}&debug=1",
    "https://org.webhook.office.com/webhookb2/{m}@tenant/IncomingWebhook/a/b/c",
    "https://default.env.api.powerplatform.com/powerautomate/automations/direct/workflows/{m}/triggers",
    "admin:{m}@10.9.8.7",
    "user:{m}@db.example:5432",
)


def _corpus() -> list[tuple[str, str, str]]:
    """(label name, value, marker): secret names with literal values, then URL shapes under
    plain names (and under secret names, as a reference would not be)."""
    out = [(name, m, m) for name in SECRET_LABELS for m in [_marker()]]
    for i, shape in enumerate(URL_SHAPES):
        m = _marker()
        out.append((f"endpoint_{i}", shape.format(m=m), m))
    return out


CORPUS = _corpus()


def test_the_corpus_is_large_and_covers_the_webhooks() -> None:
    assert len(CORPUS) >= 100
    hosts = ("feishu", "larksuite", "dingtalk", "weixin", "slack", "discord", "telegram", "office", "azure")
    assert all(any(h in value for _, value, _ in CORPUS) for h in hosts)


@pytest.mark.asyncio
async def test_no_credential_shape_is_served_without_a_token(tmp_path: Path) -> None:
    h = build(tmp_path, options=ControllerOptions(debounce_s=0.0, grace_s=0.0, read_rate=0))
    entries = []
    for chunk in range(0, len(CORPUS), 10):
        labels = {name: value for name, value, _ in CORPUS[chunk : chunk + 10]}
        i = chunk // 10 + 1
        entries.append(
            {"address": f"10.7.0.{i}", "port": 9400, "job": "gpu", "node": f"c-{i:03d}", "region": "r1",
             "labels": labels}
        )  # fmt: skip
    markers = [m for _, _, m in CORPUS]
    bodies: dict[str, bytes] = {}
    async with h.client() as client:
        put = await client.post("/v1/registry/batch", json={"put": entries}, headers=h.auth())
        assert put.status_code == 200, put.text
        h.tick()
        assert (await client.get("/readyz")).status_code == 200
        reason = " ".join(value for _, value, _ in CORPUS if "://" in value or "@" in value)
        pin = await client.post(
            "/v1/pins", json={"identity": "10.7.0.1:9400", "shard": "r1-0", "reason": reason[:500]},
            headers=h.auth(),
        )  # fmt: skip
        if pin.status_code == 200:
            await client.post("/v1/rebalance", json={"version": pin.json()["version"]}, headers=h.auth())
        h.tick()
        h.controller.publication.publish_configs()
        publisher = h.controller.publisher
        assert publisher is not None
        receivers = [  # every shape where Alertmanager and the children's configs put URLs and headers
            {"name": f"r{i}", "webhook_configs": [{"url": value if value != m else f"https://x/?{name}={m}"}],
             "http_config": {"http_headers": {name: {"values": [value]}} if value == m else {}}}
            for i, (name, value, m) in enumerate(CORPUS)
        ]  # fmt: skip
        publisher.files = {
            **publisher.files,
            "alertmanager/alertmanager.yml": yaml.safe_dump({"receivers": receivers}).encode(),
            "children/extra.json": json.dumps({"remote_write": [{"url": v} for _, v, m in CORPUS if v != m]})
            .encode(),
        }
        # errors: each shape where a host, a port or a label is expected, one by one and in a batch
        for name, value, m in CORPUS:
            if value == m:  # a bare value is a secret by its label's name: sent as a label below
                bad_label = {"address": "10.7.9.8", "port": "x", "job": "gpu", "node": "b", "region": "r1",
                             "labels": {name: m}}  # fmt: skip
                path = "/v1/registry/targets/10.7.9.8:9400"
                answer = await client.put(path, json=bad_label, headers=h.auth())
                bodies[f"PUT label {name}"] = answer.content
                continue
            bad = {"address": value, "port": 9400, "job": "gpu", "node": "bad", "region": "r1"}
            answer = await client.put(f"/v1/registry/targets/{m}", json=bad, headers=h.auth())
            bodies[f"PUT address {name}"] = answer.content
            bad_port = {**bad, "address": "10.7.9.9", "port": value}
            answer = await client.put("/v1/registry/targets/10.7.9.9:9400", json=bad_port, headers=h.auth())
            bodies[f"PUT port {name}"] = answer.content
        batch = [
            {"address": v, "port": v, "job": "gpu", "node": "b", "region": "r1", "labels": {n: v}}
            for n, v, m in CORPUS
            if v != m
        ]
        batch += [{"address": "x y", "port": 1, "job": "gpu", "node": "b", "region": "r1", "labels": {n: v}}
                  for n, v, m in CORPUS if v == m]  # fmt: skip
        answer = await client.post("/v1/registry/batch", json={"put": batch}, headers=h.auth())
        assert answer.status_code == 422
        bodies["batch 422"] = answer.content
        # every route a client without a token reaches
        paths = [
            "/v1/registry/targets", "/v1/targets?limit=1000", "/v1/status", "/v1/audit?limit=1000",
            "/v1/shards", "/v1/handovers", "/v1/configs", "/v1/sd-children", "/readyz", "/metrics",
        ]  # fmt: skip
        paths += [f"/v1/targets/10.7.0.{chunk // 10 + 1}:9400" for chunk in range(0, len(CORPUS), 10)]
        paths += [f"/v1/sd/{child}" for child in h.controller.publication.sd.child_shard]
        files = h.controller.publisher.files if h.controller.publisher is not None else {}
        paths += [f"/v1/configs/{p}" for p in files]
        for path in paths:
            answer = await client.get(path)
            bodies[path] = answer.content
            assert answer.status_code in (200, 404), (path, answer.status_code)
    served = {path: [m for m in markers if m.encode() in body] for path, body in bodies.items()}
    leaked = {path: found for path, found in served.items() if found}
    assert not leaked, leaked
    registered = bodies["/v1/registry/targets"]
    assert registered.count(b"<redacted>") >= len(CORPUS)  # masked, not dropped
    assert any(p.startswith("/v1/sd/r1") and b"<redacted>" in b for p, b in bodies.items())
    assert b"<redacted>" in bodies["/v1/audit?limit=1000"]  # the pin's reason, masked
    assert b"-character literal" in bodies["batch 422"]  # shapes, not values
