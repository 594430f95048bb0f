"""Relay config: the YAML the operator (or ``alertmanager.render``) writes for the relay.

Pure model layer: no I/O except ``load_config`` reading one file. ``${ENV}`` references
in string values are expanded before validation so tokens and secrets live in the
environment, not in the file; they are held as ``SecretStr`` and never printed.

    listen: 127.0.0.1:8060
    timezone: Asia/Shanghai
    alertmanager_url: http://alertmanager:9093
    grafana_url: http://grafana:3000
    dedup_window: 60s
    digest:                      # info alerts: one message a week per robot
      period: 7d
      anchor: "2024-01-01T09:00:00"
      email:                     # optional: the week's info alerts also as one e-mail
        to: [sre@example.com]
        from: gpufed@example.com
        smarthost: smtp.example.com:587
        auth_username: gpufed
        auth_password: ${SMTP_PASSWORD}
    robots:
      cn-beijing:
        url: https://oapi.dingtalk.com/robot/send?access_token=${DINGTALK_BJ_TOKEN}
        secret: ${DINGTALK_BJ_SECRET}
        keywords: [alert]
        rate_per_minute: 18
        mentions: {mobiles: ["13800000000"], user_ids: [], all_on_critical: false, label: dingtalk_at}
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from alertmanager.channels import EmailAddress, Smarthost, local_anchor
from alertmanager.dingtalk.errors import ConfigError

#: DingTalk rejects bodies over 20,000 bytes; we stay below with room for JSON framing.
DINGTALK_MAX_BYTES = 20_000
#: Seconds an identical notification (the same alerts in the same episodes) counts as an HA
#: copy: (replicas - 1) x Alertmanager's 15 s peer_timeout, with room (``dedup``'s docstring).
DEFAULT_DEDUP_WINDOW = 60.0
#: DingTalk throttles a robot for 10 minutes past 20 messages a minute.
DINGTALK_MAX_PER_MINUTE = 20

_PLACEHOLDERS = frozenset(
    {"", "changeme", "change-me", "change_me", "changethis", "secret", "password", "token", "xxx",
     "xxxx", "todo", "placeholder", "your-secret", "your_secret", "your-token", "your_token", "none"}
)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}
_ROBOT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def parse_duration(value: Any) -> float:
    """Seconds from ``5m``/``10s``/``500ms``/``1h``/``7d``/``1w`` or a bare number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if match is None:
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 10s, 5m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


def _refuse_placeholder(value: SecretStr | None, what: str) -> SecretStr | None:
    if value is None:
        return None
    raw = value.get_secret_value().strip()
    if raw.lower() in _PLACEHOLDERS or raw.startswith("<") or "${" in raw:
        raise ValueError(f"{what} is a placeholder; set the real value (e.g. via ${{ENV}})")
    return value


class Mentions(BaseModel):
    """Who a robot @-mentions: static lists plus mobiles read from an alert label."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mobiles: list[str] = Field(default_factory=list)
    user_ids: list[str] = Field(default_factory=list)
    all_on_critical: bool = False
    label: str = "dingtalk_at"


class RobotConfig(BaseModel):
    """One DingTalk custom robot (one group chat)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: SecretStr
    secret: SecretStr | None = None
    keywords: list[str] = Field(default_factory=list)
    rate_per_minute: int = Field(default=18, ge=1, le=DINGTALK_MAX_PER_MINUTE)
    mentions: Mentions = Field(default_factory=Mentions)
    template: Path | None = None

    @field_validator("url")
    @classmethod
    def _url_has_token(cls, value: SecretStr) -> SecretStr:
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("url must be an http(s) URL")
        tokens = parse_qs(parts.query).get("access_token", [])
        if not tokens:
            raise ValueError("url must carry ?access_token=...")
        _refuse_placeholder(SecretStr(tokens[0]), "access_token")
        return value

    @field_validator("secret")
    @classmethod
    def _secret_not_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        return _refuse_placeholder(value, "secret")


class DigestEmailConfig(BaseModel):
    """The digest also as one e-mail a period: every robot's info alerts, each listed once.

    Sent by the relay itself over SMTP (STARTTLS unless ``require_tls`` is false, as
    Alertmanager's ``email_configs``); the password comes from the environment (``${ENV}``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    to: list[EmailAddress] = Field(min_length=1)
    sender: EmailAddress = Field(alias="from")
    smarthost: Smarthost
    require_tls: bool = True
    auth_username: str | None = None
    auth_password: SecretStr | None = None
    timeout: Duration = 10.0

    @field_validator("auth_password")
    @classmethod
    def _password(cls, value: SecretStr | None) -> SecretStr | None:
        return _refuse_placeholder(value, "email.auth_password")

    @model_validator(mode="after")
    def _login(self) -> DigestEmailConfig:
        if (self.auth_username is None) != (self.auth_password is None):
            raise ValueError("email.auth_username and email.auth_password go together")
        return self


class DigestConfig(BaseModel):
    """``info`` alerts batched into one message per robot and period (``digest``).

    Periods run from ``anchor``, a local time in the relay's ``timezone`` (2024-01-01 was a
    Monday: the default sends on Monday mornings), in steps of ``period``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    period: Annotated[float, BeforeValidator(parse_duration), Field(ge=60, le=366 * 86400)] = 7 * 86400.0
    anchor: str = "2024-01-01T09:00:00"
    # How often the relay looks for a period that ended; a digest is at most this late.
    check_every: Annotated[float, BeforeValidator(parse_duration), Field(ge=1)] = 60.0
    email: DigestEmailConfig | None = None

    @field_validator("anchor")
    @classmethod
    def _anchor(cls, value: str) -> str:
        return local_anchor(value, zone="the relay's timezone")


class RelayConfig(BaseModel):
    """The whole relay config; ``robots`` keys are the ``{robot}`` in ``/dingtalk/{robot}/send``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: str = "127.0.0.1:8060"
    timezone: str = "Asia/Shanghai"
    alertmanager_url: str | None = None
    grafana_url: str | None = None
    dedup_window: Duration = DEFAULT_DEDUP_WINDOW
    # Alertmanager gives a notification at least 10 s; answer 503 before it gives up.
    max_wait: Duration = 8.0
    request_timeout: Duration = 5.0
    max_message_bytes: int = Field(default=19_000, ge=2_000, lt=DINGTALK_MAX_BYTES)
    # A webhook body is read whole before validation; this bounds what one request may cost.
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # After DingTalk's 130101 ("too fast") a robot sends nothing for this long, doubling
    # on each consecutive 130101 up to ``throttle_backoff_max`` (DingTalk mutes for 10 min).
    throttle_backoff: Duration = 60.0
    throttle_backoff_max: Duration = 600.0
    template: Path | None = None
    digest: DigestConfig | None = None
    robots: dict[str, RobotConfig] = Field(min_length=1)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value

    @field_validator("robots")
    @classmethod
    def _robot_names(cls, value: dict[str, RobotConfig]) -> dict[str, RobotConfig]:
        bad = sorted(name for name in value if not _ROBOT_NAME.match(name))
        if bad:
            raise ValueError(f"robot names must match [A-Za-z0-9_.-]+: {bad}")
        return value


def expand_env(value: Any, env: Mapping[str, str]) -> Any:
    """Replace ``${NAME}`` in every string of a parsed YAML tree; unset names are errors."""
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise ConfigError(f"environment variable {name} is not set", field=name)
            return env[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {key: expand_env(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_env(item, env) for item in value]
    return value


def parse_config(data: Any, *, env: Mapping[str, str] | None = None) -> RelayConfig:
    """Validate a parsed YAML tree; errors become ``ConfigError`` naming the field."""
    try:
        return RelayConfig.model_validate(expand_env(data, os.environ if env is None else env))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{field}: {first['msg']}", field=field) from exc


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what a YAML error is, WITHOUT the source excerpt PyYAML prints.

    ``str(exc)`` quotes the offending line, and in this file that line may well be
    ``secret: ...`` or a robot URL with its access token; position and problem suffice.
    """
    if isinstance(exc, yaml.MarkedYAMLError):
        context, mark = exc.context, exc.problem_mark or exc.context_mark
        if context and exc.context_mark is not None and exc.context_mark is not mark:
            context += f" (from line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        what = "; ".join(part for part in (context, exc.problem) if part) or type(exc).__name__
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"YAML syntax error{where}: {what}"
    return f"YAML error ({type(exc).__name__})"


def load_config(path: Path, *, env: Mapping[str, str] | None = None) -> RelayConfig:
    """Read and validate the relay config file; relative template paths are file-relative."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {path}: {reason}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    config = parse_config(data, env=env)
    base = path.resolve().parent
    if config.template is not None and not config.template.is_absolute():
        config = config.model_copy(update={"template": base / config.template})
    robots = {
        name: robot.model_copy(update={"template": base / robot.template})
        if robot.template is not None and not robot.template.is_absolute() else robot
        for name, robot in config.robots.items()
    }
    return config.model_copy(update={"robots": robots})
