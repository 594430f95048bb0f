"""Alertmanager webhook payload (version "4"), validated at the relay's edge.

Pure model layer. ``dedup_key`` is here because it is a property of the payload: the
same notification sent by several Alertmanager replicas yields the same key.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from alertmanager.dingtalk.errors import PayloadError

#: Alertmanager writes this for "no end yet"; templates treat it as unset.
ZERO_TIME = datetime.fromisoformat("0001-01-01T00:00:00+00:00")
#: Any other time must lie in this range: the relay shows it in a time zone and opens a
#: logs window around it, which overflows Python's calendar near years 1 and 9999.
EARLIEST = datetime.fromisoformat("1970-01-01T00:00:00+00:00")
LATEST = datetime.fromisoformat("9000-01-01T00:00:00+00:00")


def _in_range(value: datetime) -> datetime:
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"{value.isoformat()} is outside 1970..9000")
    return value


def _in_range_or_zero(value: datetime) -> datetime:
    if value != ZERO_TIME and not EARLIEST <= value < LATEST:
        raise ValueError(f"{value.isoformat()} is outside 1970..9000 and not Go's zero time "
                         "(0001-01-01T00:00:00Z, no end yet)")
    return value


Start = Annotated[AwareDatetime, AfterValidator(_in_range)]
End = Annotated[AwareDatetime, AfterValidator(_in_range_or_zero)]


class Alert(BaseModel):
    """One alert; camelCase names mirror Alertmanager's JSON so no aliases are needed."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    # RFC 3339 with an offset, as Alertmanager writes them: a time without one cannot be
    # ordered against the others (and is refused with 422 naming the field).
    startsAt: Start
    endsAt: End = ZERO_TIME
    generatorURL: str = ""
    fingerprint: str = ""

    def identity(self) -> str:
        """Alertmanager's fingerprint, or a stable hash of the labels when it is absent."""
        if self.fingerprint:
            return self.fingerprint
        blob = json.dumps(self.labels, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class WebhookMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4"]
    groupKey: str
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[Alert] = Field(min_length=1)


def parse_webhook(body: bytes) -> WebhookMessage:
    """Body bytes -> payload; 400 when not JSON, 422 naming the first bad field."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body: not JSON: {exc}", field="body", status=400) from exc
    except RecursionError as exc:  # nesting deeper than the interpreter's stack
        raise PayloadError("body: JSON nested too deeply", field="body", status=400) from exc
    try:
        return WebhookMessage.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise PayloadError(f"{field}: {first['msg']}", field=field) from exc


def dedup_key(robot: str, message: WebhookMessage) -> str:
    """robot + groupKey + status + each alert's identity, state and episode: equal across HA
    replicas for the same notification, different for the next episode of the same alerts.

    An episode is named by its ``startsAt`` (and, once resolved, its ``endsAt``): Prometheus
    sends both replicas the same times, and a new episode after a resolve starts later. A
    firing alert's ``endsAt`` is left out: Alertmanager sends it zeroed, and a sender that
    fills it in moves it forward on every resend.
    """
    prints = sorted(
        "|".join([alert.identity(), alert.status, _instant(alert.startsAt),
                  _instant(alert.endsAt) if alert.status == "resolved" else ""])
        for alert in message.alerts
    )
    blob = "\x1f".join([robot, message.groupKey, message.status, *prints])
    return hashlib.sha256(blob.encode()).hexdigest()


def _instant(value: datetime) -> str:
    """The same instant written with any UTC offset gives the same text."""
    return value.isoformat() if value.tzinfo is None else value.astimezone(UTC).isoformat()
