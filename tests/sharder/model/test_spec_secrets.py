"""Literal credentials are refused wherever the spec can hold them (issue 21, item 2); errors
name the field and the value's shape, never the value; the API's masking uses the same list."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from alertmanager.models import RobotSpec, WebhookSpec
from federation.controller.http.redact import RedactingFilter, redact_data, redact_file, redact_text
from federation.spec import load_gpufed_spec
from sharder.kernel import secrets
from sharder.kernel.errors import SpecError
from sharder.model.loading import load_spec

SECRET = "s3cr3t-Value-0123456789abcdef"

BASE: dict[str, Any] = {
    "cluster": "c1",
    "regions": [{"name": "r1", "shards": 1}],
    "jobs": [{"name": "gpu"}],
}


def spec_error(tmp_path: Path, **extra: Any) -> SpecError:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra}))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return caught.value


@pytest.mark.parametrize(
    ("write", "field", "says"),
    [
        ({"url": f"https://user:{SECRET}@receive.example/api/v1/receive"}, "url", "userinfo"),
        ({"url": f"https://receive.example/write?apikey={SECRET}"}, "url", "'apikey'"),
        ({"url": f"https://receive.example/write?X-Amz-Signature={SECRET}"}, "url", "Signature"),
        ({"url": "https://r.example/w", "headers": {"X-Api-Key": SECRET}}, "headers", "X-Api-Key"),
        ({"url": "https://r.example/w", "headers": {"X-Auth-Token": SECRET}}, "headers", "X-Auth-Token"),
        ({"url": "https://r.example/w", "headers": {"Private-Token": SECRET}}, "headers", "Private-Token"),
    ],
)
def test_remote_write_refuses_literal_credentials(
    tmp_path: Path, write: dict[str, Any], field: str, says: str
) -> None:
    error = spec_error(tmp_path, remote_write=[{"name": "w", **write}])
    assert error.field == f"remote_write[0].{field}"
    assert says in str(error) and secrets.LITERAL in str(error)
    assert f"{len(SECRET)}-character literal" in str(error)
    assert SECRET not in str(error)


def test_remote_write_credentials_come_from_files(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    ok = {"name": "w", "url": "https://r.example/w", "headers": {"X-Scope-OrgID": "gpu"}}
    path.write_text(
        yaml.safe_dump(
            {**BASE, "remote_write": [{**ok, "basic_auth": {"username": "u", "password_file": "/run/pw"}}]}
        )
    )
    assert load_spec(path).remote_write[0].basic_auth is not None
    error = spec_error(
        tmp_path, remote_write=[{**ok, "authorization": {"credentials_file": "relative/token"}}]
    )
    assert "absolute" in str(error)
    both = {
        "basic_auth": {"username": "u", "password_file": "/a"},
        "authorization": {"credentials_file": "/b"},
    }
    assert "not both" in str(spec_error(tmp_path, remote_write=[{**ok, **both}]))


def test_http_sd_url_may_not_carry_a_token(tmp_path: Path) -> None:
    error = spec_error(tmp_path, children={"http_sd_url": f"http://ctl:8080/?token={SECRET}"})
    assert error.field == "children.http_sd_url" and SECRET not in str(error)


def test_alerting_urls_and_robot_secrets_are_references(tmp_path: Path) -> None:
    robot = {"name": "bj", "url": "https://x/robot/send?access_token=${BJ_TOKEN}"}
    alerting = {
        "relay_url": "http://relay:8060",
        "replicas": [{"name": "am-0", "host": "am-0"}],
        "robots": [robot],
        "receivers": [{"name": "hook", "webhooks": [{"url": f"https://hooks.example/a?apikey={SECRET}"}]}],
        "default_receiver": "hook",
    }
    path = tmp_path / "gpufed.yaml"
    path.write_text(yaml.safe_dump({**BASE, "alerting": alerting}))
    with pytest.raises(SpecError) as caught:
        load_gpufed_spec(path)
    assert caught.value.field == "alerting.receivers[0].webhooks[0].url"
    assert "'apikey'" in str(caught.value) and SECRET not in str(caught.value)

    with pytest.raises(ValueError, match="literal credential"):
        RobotSpec(name="bj", url=f"https://oapi.dingtalk.com/robot/send?access_token={SECRET}")
    with pytest.raises(ValueError, match="robot secret"):
        RobotSpec(**robot, secret=SECRET)
    assert RobotSpec(**robot, secret="${BJ_SECRET}").secret == "${BJ_SECRET}"
    assert WebhookSpec(url="https://hooks.example/alert?team=gpu", credentials_file="/run/t").url


@given(
    st.sampled_from(
        [
            "X-Api-Key",
            "x-api-key",
            "Authorization",
            "apikey",
            "access_token",
            "X-Auth-Token",
            "client_secret",
            "password",
            "Signature",
            "sign",
        ]
    )
)
def test_secret_names_are_recognised_in_any_case(name: str) -> None:
    assert secrets.is_secret_name(name) and secrets.is_secret_name(name.upper())


@pytest.mark.parametrize("name", ["X-Scope-OrgID", "Content-Type", "team", "monkey", "region", "job"])
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not secrets.is_secret_name(name)


def test_get_masking_uses_the_same_list_as_the_spec() -> None:
    rendered = yaml.safe_dump(
        {
            "remote_write": [
                {
                    "url": f"https://u:{SECRET}@r.example/w?apikey={SECRET}&team=gpu",
                    "headers": {"X-Api-Key": SECRET, "X-Scope-OrgID": "gpu"},
                    "basic_auth": {"username": "u", "password_file": "/run/pw"},
                }
            ],
            "receivers": [{"webhook_configs": [{"url": f"https://h.example/a?token={SECRET}"}]}],
            "robot": {"secret": "${BJ_SECRET}"},
        }
    ).encode()
    masked = redact_file("prometheus.yml", rendered).decode()
    assert SECRET not in masked
    data = yaml.safe_load(masked)
    write = data["remote_write"][0]
    assert write["headers"] == {"X-Api-Key": "<redacted>", "X-Scope-OrgID": "gpu"}
    assert write["url"] == "https://<redacted>@r.example/w?apikey=<redacted>&team=gpu"
    assert write["basic_auth"]["password_file"] == "/run/pw"  # a path, not a secret
    assert data["robot"]["secret"] == "${BJ_SECRET}"  # a reference stays
    assert redact_data({"detail": {"reason": f"see http://x/?secret={SECRET}"}}) == {
        "detail": {"reason": "see http://x/?secret=<redacted>"}
    }
    assert redact_text("no url here") == "no url here"


def test_log_lines_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.secrets")
    record = logger.makeRecord(
        "tests.secrets",
        logging.WARNING,
        __file__,
        1,
        "posting to %s",
        (f"https://h.example/a?access_token={SECRET}",),
        None,
    )
    assert RedactingFilter().filter(record)
    assert SECRET not in record.getMessage() and "access_token=<redacted>" in record.getMessage()
