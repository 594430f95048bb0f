"""Channel specs beside DingTalk robots: WeCom receivers and the relay's info digest.

Part of the ``alerting`` section (``alertmanager.models`` composes them into
``ReceiverSpec.wecom`` and ``AlertingSpec.info_digest``); ``alertmanager.render`` writes
WeCom as Alertmanager's ``wechat_configs`` and the digest into the relay's robots file.
docs/alerting.md describes both. Pure models: nothing here reads a file or a secret.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from sharder.kernel import prometheus_versions, secrets
from sharder.kernel.models import StrictModel, parse_duration

_SMARTHOST = re.compile(r"^(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})$")
_ADDRESS = re.compile(r"^[^\s@<>,;\"]+@[^\s@<>,;\"]+$")


def _email_address(value: str) -> str:
    """A bare ``user@host`` (no display name, no header injection), or ValueError."""
    if not _ADDRESS.match(value):
        raise ValueError(f"must be an address like ops@example.com, got {value[:80]!r}")
    return value


def _smarthost(value: str) -> str:
    """``host:port`` of an SMTP server (Alertmanager's ``smarthost``), or ValueError."""
    match = _SMARTHOST.match(value)
    if match is None or not 0 < int(match.group("port")) < 65536:
        raise ValueError(f"smarthost must be host:port (e.g. smtp.example.com:587), got {value[:80]!r}")
    return value


#: The e-mail digest's fields, checked the same way in the spec and in the relay's config.
EmailAddress = Annotated[str, AfterValidator(_email_address)]
Smarthost = Annotated[str, AfterValidator(_smarthost)]


def local_anchor(value: str, *, zone: str) -> str:
    """A digest period's anchor: a local ISO date and time (no offset: ``zone`` applies) in
    years a clock can hold; the spec and the relay's config check it the same way."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(
            f"anchor is a local ISO date and time such as 2024-01-01T09:00:00, got {value!r}") from exc
    if parsed.tzinfo is not None:
        raise ValueError(f"anchor is a local time ({zone} applies); drop the offset")
    if not 1971 <= parsed.year < 9000:
        raise ValueError("anchor must lie between 1971 and 9000")
    return value

ENV_REF = "${"


def no_env_ref(value: str, what: str) -> str:
    # Alertmanager reads its file verbatim: a ${VAR} here would be sent as is.
    if ENV_REF in value:
        raise ValueError(f"{what} cannot hold ${{ENV}} references: Alertmanager does not expand them")
    return value


WECOM_API_URL = "https://qyapi.weixin.qq.com/cgi-bin/"
#: Alertmanager reads ``api_secret_file`` from 0.31.0 on (CHANGELOG 0.31.0, #4734); 0.28.1's
#: amtool refuses the field ("field api_secret_file not found").
WECOM_SECRET_FILE_SINCE = prometheus_versions.Release(0, 31)


class WeComSpec(StrictModel):
    """A WeCom (WeChat Work) application message: Alertmanager's ``wechat_configs``.

    Alertmanager fetches a token (``GET <api_url>gettoken?corpid=&corpsecret=``) and posts
    to ``<api_url>message/send``. The application secret is only ever a file Alertmanager
    reads (``api_secret_file``), never a value in the rendered config.
    """

    corp_id: str = Field(min_length=1)
    agent_id: str = Field(description="the application's AgentId, digits")
    api_secret_file: str = Field(description="absolute path of a file holding the application secret")
    to_user: str | None = Field(default=None, description="user ids joined by '|', or @all")
    to_party: str | None = Field(default=None, description="department ids joined by '|'")
    to_tag: str | None = Field(default=None, description="tag ids joined by '|'")
    api_url: str = WECOM_API_URL
    message_type: Literal["text", "markdown"] = "text"
    send_resolved: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: object) -> object:
        if isinstance(data, dict) and ("api_secret" in data or "secret" in data):
            key = "api_secret" if "api_secret" in data else "secret"
            raise ValueError(
                f"{key}: WeCom secrets are files only; write api_secret_file: /path/to/secret"
                " (mounted into every Alertmanager replica)"
            )
        return data

    @field_validator("agent_id", mode="before")
    @classmethod
    def _agent_id(cls, value: object) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not text.isdigit():
            raise ValueError(f"agent_id is the application's AgentId, digits such as 1000002, got {value!r}")
        return text

    @field_validator("corp_id", "to_user", "to_party", "to_tag")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return None if value is None else no_env_ref(value, "WeCom settings")

    @field_validator("api_secret_file")
    @classmethod
    def _secret_file(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"api_secret_file must be an absolute path, got {value[:64]!r}")
        return no_env_ref(value, "api_secret_file")

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"api_url must start with http:// or https://, got {value[:64]!r}")
        if not value.endswith("/"):
            # Alertmanager appends "gettoken" and "message/send" to the path as is.
            raise ValueError(f"api_url must end with '/' (such as {WECOM_API_URL}), got {value[:64]!r}")
        if "?" in value or "#" in value:
            raise ValueError("api_url takes no query or fragment")
        return no_env_ref(value, "api_url")

    @model_validator(mode="after")
    def _someone(self) -> WeComSpec:
        if not (self.to_user or self.to_party or self.to_tag):
            raise ValueError(
                "a WeCom message needs to_user, to_party or to_tag (to_user: '@all' for everyone)")
        return self


class DigestEmailSpec(StrictModel):
    """The digest also as one e-mail a period, sent by the relay over SMTP (seed 002: info
    alerts to a weekly e-mail digest); every robot's info alerts, each listed once."""

    to: list[EmailAddress] = Field(min_length=1)
    sender: EmailAddress = Field(alias="from")
    smarthost: Smarthost = Field(description="host:port of the SMTP server")
    require_tls: bool = True
    auth_username: str | None = None
    auth_password: str | None = Field(default=None, description="${NAME}: the relay expands it")

    @field_validator("auth_password")
    @classmethod
    def _password(cls, value: str | None) -> str | None:
        if value is not None and not secrets.is_reference(value):
            raise ValueError(f"{secrets.LITERAL}: the SMTP password is {secrets.shape(value)};"
                             " write ${NAME} (the relay expands it)")
        return value

    @model_validator(mode="after")
    def _login(self) -> DigestEmailSpec:
        if (self.auth_username is None) != (self.auth_password is None):
            raise ValueError("email.auth_username and email.auth_password go together")
        return self


class InfoDigestSpec(StrictModel):
    """The relay's digest: ``info`` alerts to a robot are batched into one message a period.

    Periods run from ``anchor`` (a local time in ``alerting.timezone``; 2024-01-01 was a
    Monday, so the default sends on Monday mornings) in steps of ``period``.
    """

    period: str = "7d"
    anchor: str = Field(default="2024-01-01T09:00:00", description="ISO local date and time, no offset")
    email: DigestEmailSpec | None = Field(default=None, description="also one e-mail a period")

    @field_validator("period")
    @classmethod
    def _period(cls, value: str) -> str:
        if not 60 <= parse_duration(value) <= 366 * 86400:
            raise ValueError(f"period must be a Prometheus duration from a minute to a year, got {value!r}")
        return value

    @field_validator("anchor")
    @classmethod
    def _anchor(cls, value: str) -> str:
        return local_anchor(value, zone="alerting.timezone")

    def period_seconds(self) -> float:
        return parse_duration(self.period)
