"""The relay's one exception tree; ``app`` maps it to HTTP problems in one handler.

    RelayError
    ├── ConfigError            bad or unreadable relay config (reload keeps the old one)
    ├── PayloadError           webhook body is not JSON (400), not a v4 payload (422), or
    │                          over ``max_request_bytes`` (413)
    ├── UnknownRobotError      no robot of that name (404)
    └── DeliveryError          DingTalk did not take the message
        ├── TransientDeliveryError   worth a retry: 503 so Alertmanager retries
        │   └── ThrottledError       no rate-limit slot within max_wait, or DingTalk said
        │                            130101 and the robot backs off (503 + Retry-After)
        └── PermanentDeliveryError   retrying cannot help: 200 + counted metric
"""

from __future__ import annotations


class RelayError(Exception):
    """Base of every error the relay raises on purpose."""

    status = 500

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class ConfigError(RelayError):
    """The relay config cannot be loaded; ``field`` names the offending key."""


class PayloadError(RelayError):
    """The webhook body is unusable; ``status`` is 400 (not JSON) or 422 (bad field)."""

    def __init__(self, detail: str, *, field: str | None = None, status: int = 422) -> None:
        super().__init__(detail, field=field)
        self.status = status


class UnknownRobotError(RelayError):
    status = 404


class DeliveryError(RelayError):
    """DingTalk refused or could not be reached; ``reason`` labels the failure metric."""

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


class TransientDeliveryError(DeliveryError):
    status = 503


class ThrottledError(TransientDeliveryError):
    def __init__(self, detail: str, *, retry_after: float, reason: str = "throttled") -> None:
        super().__init__(detail, reason=reason)
        self.retry_after = retry_after


class PermanentDeliveryError(DeliveryError):
    status = 200
