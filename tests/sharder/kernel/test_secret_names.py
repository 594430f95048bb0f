"""Secrets by shape and name (issue 29, item 4): one list, case-insensitive and camelCase-aware,
used by the spec's refusals, the errors, the logs and the API's masking.

The names come from the upstream docs (each field those docs type ``<secret>``), read at:
prometheus/prometheus docs/configuration/configuration.md @ d15adb9ad7e5d9fbde3a9a8f30200593a5a14d86,
prometheus/alertmanager docs/configuration.md @ 68fb2d5759b3a92c0bb2a1a13d4ef7ff5b06256d,
thanos-io/objstore README.md @ 4e5fd4289b5052ec0fed3a27dc025c364a0e354e,
timonwong/prometheus-webhook-dingtalk config.example.yml @ 589d858c1f7c9409a67146d8c14e28a208bf34e7;
the headers are the usual credential headers of HTTP APIs a remote_write may reach.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

from federation.controller.http.redact import MASK, redact_file, redact_text
from federation.spec import load_gpufed_spec
from sharder.kernel import secrets
from sharder.kernel.errors import SharderError

PROMETHEUS = [
    "password", "client_secret", "secret_key", "credentials", "token", "auth_token", "application_secret",
    "application_credential_secret", "consumer_key", "key_passphrase", "certificate_password",
    "client_certificate_key", "key", "bearer_token",
]  # fmt: skip
ALERTMANAGER = [
    "smtp_auth_password", "smtp_auth_secret", "auth_password", "auth_secret", "api_key", "opsgenie_api_key",
    "victorops_api_key", "wechat_api_secret", "api_secret", "telegram_bot_token", "bot_token",
    "slack_app_token", "app_token", "rocketchat_token", "rocketchat_token_id", "token_id", "user_key",
    "routing_key", "service_key", "alert_source_token", "slack_api_url", "webhook_url",
    "mattermost_webhook_url",
]  # fmt: skip
OBJSTORE = [
    "access_key", "secret_key", "session_token", "storage_account_key", "application_credential_secret",
    "access_key_secret", "passphrase", "privatekey", "encryption_key", "client_secret",
]  # fmt: skip
DINGTALK = ["secret", "access_token"]
HEADERS = [
    "Authorization", "Proxy-Authorization", "X-Api-Key", "x-api-key", "X-API-KEY", "X-Auth-Token",
    "X-Honeycomb-Team", "X-Pass", "MyApiKey", "accessToken", "AccessToken", "Api-Key", "apikey", "ApiKey",
    "X-Vault-Token", "X-Amz-Security-Token", "Private-Token", "Cookie", "X-Goog-Api-Key",
    "Ocp-Apim-Subscription-Key", "X-Access-Token", "X-Gitlab-Token", "X-Client-Secret", "XAPIKey",
    "X-Shopify-Access-Token", "X-Sentry-Auth", "X-Password", "pwd", "passwd", "jwt", "pass", "sig",
    "X-Amz-Signature", "session", "clientSecret", "refresh_token", "id_token", "x_session_token",
]  # fmt: skip
NOT_SECRET = [
    "token_url", "password_file", "credentials_file", "key_file", "secret_key_file", "access_key_id",
    "kms_key_id", "X-Scope-OrgID", "Content-Type", "User-Agent", "X-Prometheus-Remote-Write-Version",
    "monkey", "bypass", "design", "region", "endpoint", "auth_type", "authentication_method",
    "token_file_path", "username", "bucket", "passing", "keys_count",
]  # fmt: skip
LITERAL = "S3cr3tValue42xyz"


@pytest.mark.parametrize("name", PROMETHEUS + ALERTMANAGER + OBJSTORE + DINGTALK + HEADERS)
def test_every_documented_secret_name_is_a_secret(name: str) -> None:
    assert secrets.is_secret_name(name)
    assert secrets.is_secret_name(name.upper()) and secrets.is_secret_name(name.lower())


@pytest.mark.parametrize("name", NOT_SECRET)
def test_names_that_say_where_or_which_are_not(name: str) -> None:
    assert not secrets.is_secret_name(name)


URLS = [
    f"https://user:{LITERAL}@h.example/p",
    f"https://{LITERAL}@h.example/p",
    f"https://h.example/p?accessToken={LITERAL}",
    f"https://h.example/p?access_token={LITERAL}",
    f"https://h.example/p?pass={LITERAL}",
    f"https://h.example/p?jwt={LITERAL}",
    f"https://h.example/p?api_key={LITERAL}",
    f"https://h.example/p?apikey={LITERAL}",
    f"https://h.example/p?sv=2020&sig={LITERAL}",
    f"https://h.example/p?X-Amz-Signature={LITERAL}",
    f"https://h.example/p?X-Amz-Security-Token={LITERAL}",
    f"https://h.example/p;token={LITERAL}",
    f"https://h.example/p#token={LITERAL}",
    f"https://h.example/p#state=1&access_token={LITERAL}",
    f"https://h.example/p?a=1;token={LITERAL}",
    f"https://h.example/p?acc%65ssToken={LITERAL}",
    f"https://oapi.dingtalk.com/robot/send?accessToken={LITERAL}",
]


@pytest.mark.parametrize("url", URLS)
def test_every_url_form_is_found_and_masked(url: str) -> None:
    why = secrets.url_secret(url)
    assert why is not None and LITERAL not in why
    assert LITERAL not in secrets.mask_url(url, MASK)
    line = f"sending to {url} failed"
    assert LITERAL not in redact_text(line)


@pytest.mark.parametrize(
    "url",
    [
        "https://h.example/p?access_token=${DINGTALK_TOKEN}",
        "https://h.example/p?token=$(TOKEN)",
        "https://h.example/p?region=cn&page=2",
        "https://h.example/p#section-2",
    ],
)
def test_references_and_plain_parameters_stay(url: str) -> None:
    assert secrets.url_secret(url) is None
    assert secrets.mask_url(url, MASK) == url


@pytest.mark.parametrize("name", PROMETHEUS + ALERTMANAGER + OBJSTORE + DINGTALK + HEADERS)
def test_a_get_masks_every_secret_name(name: str) -> None:
    document = f'{{"scrape_configs": [{{"x": {{"{name}": "{LITERAL}", "{name}_file": "/run/s"}}}}]}}'.encode()
    masked = redact_file("prometheus.json", document)
    assert LITERAL.encode() not in masked and b"/run/s" in masked


def _spec(tmp_path: Path, edit: Any) -> str:
    document = yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text())
    edited = copy.deepcopy(document)
    edit(edited)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(edited))
    with pytest.raises(SharderError) as refused:
        load_gpufed_spec(tmp_path / "spec.yaml")
    return str(refused.value)


def _remote_write_url(url: str) -> Any:
    def edit(d: dict[str, Any]) -> None:
        d["remote_write"][0]["url"] = url.replace("https://h.example/p", "http://m:9090/api/v1/write")

    return edit


def _robot_url(url: str) -> Any:
    def edit(d: dict[str, Any]) -> None:
        robots = d["alerting"]["robots"]
        first = robots[0] if isinstance(robots, list) else robots[next(iter(robots))]
        first["url"] = url

    return edit


SPEC_EDITS = {
    "bearer_token": lambda d: d["remote_write"][0].update(bearer_token=LITERAL),
    "auth_password": lambda d: d["remote_write"][0].update(auth_password=LITERAL),
    "MyApiKey": lambda d: d["remote_write"][0].update(headers={"MyApiKey": LITERAL}),
    "X-Honeycomb-Team": lambda d: d["remote_write"][0].update(headers={"X-Honeycomb-Team": LITERAL}),
    "X-Pass": lambda d: d["remote_write"][0].update(headers={"X-Pass": LITERAL}),
    "accessToken header": lambda d: d["remote_write"][0].update(headers={"accessToken": LITERAL}),
    **{f"url {i}": _remote_write_url(u) for i, u in enumerate(URLS)},
    "robot ?accessToken": _robot_url(f"https://oapi.dingtalk.com/robot/send?accessToken={LITERAL}"),
    "robot ?access_token": _robot_url(f"https://oapi.dingtalk.com/robot/send?access_token={LITERAL}"),
    "robot secret": lambda d: _robot_secret(d),
}


def _robot_secret(d: dict[str, Any]) -> None:
    robots = d["alerting"]["robots"]
    (robots[0] if isinstance(robots, list) else robots[next(iter(robots))])["secret"] = LITERAL


@pytest.mark.parametrize("case", sorted(SPEC_EDITS))
def test_the_spec_refuses_and_the_error_shows_the_shape_never_the_value(tmp_path: Path, case: str) -> None:
    message = _spec(tmp_path, SPEC_EDITS[case])
    assert LITERAL not in message, message
    assert f"{len(LITERAL)}-character" in message or "literal" in message, message


def test_a_literal_objstore_key_is_refused_without_its_value(tmp_path: Path) -> None:
    document = yaml.safe_load((ROOT / "tests" / "golden" / "thanos-s3-single" / "spec.yaml").read_text())
    document["thanos"]["objstore"]["config"]["access_key"] = LITERAL
    document["thanos"]["objstore"]["config"]["secret_key"] = LITERAL
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(SharderError) as refused:
        load_gpufed_spec(tmp_path / "spec.yaml")
    assert LITERAL not in str(refused.value) and "access_key" in str(refused.value)
