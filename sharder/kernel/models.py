"""Primitives every renderer shares: strict models, durations, names, URLs, field paths.

The bottom of the sharder's shared kernel (``sharder.kernel``): the federation spec
(``sharder.model.spec``), the master tier, Thanos, Alertmanager and logs all build their
models from :class:`StrictModel` and validate durations, names and URLs here, so each
refuses the same input with the same words. Nothing here knows shards or targets.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from sharder.kernel import secrets
from sharder.kernel.errors import preview

# ASCII digits only (Python's \d also takes other scripts' digits, Go does not); \Z, not $,
# which would let a trailing newline through.
DURATION_RE = re.compile(
    r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?\Z"
)
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
# Shard ids become label values, directory names and URL path segments.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
# Go's time.Duration (int64 nanoseconds) ends just past 292 years; Prometheus refuses beyond.
MAX_DURATION_SECONDS = 290 * 365 * 86400


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1m30s``; ValueError when malformed."""
    match = DURATION_RE.match(text)
    if not text or not match:
        raise ValueError(f"not a Prometheus duration: {preview(text)} (examples: 15s, 1m, 2h)")
    y, w, d, h, m, s, ms = (int(match.group(i) or 0) for i in (2, 4, 6, 8, 10, 12, 14))
    seconds = ((((y * 365 + w * 7 + d) * 24 + h) * 60 + m) * 60 + s) + ms / 1000
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"duration {text!r} is longer than Prometheus allows (about 290 years)")
    return seconds


def host_port(url: str) -> str:
    """``HOST:PORT`` of an http(s) URL, the scheme's port where it names none: a scrape target."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def check_url(value: str) -> str:
    """An http(s) URL with a host, as Prometheus parses it; ValueError naming what is missing."""
    if not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("URL must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("URL must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("URL has no host (write e.g. http://master:9090/api/v1/write)")
    why = secrets.url_secret(value)
    if why is not None:
        raise ValueError(
            f"{secrets.LITERAL}: {why}; Prometheus reads credentials from files"
            " (remote_write: basic_auth.password_file or authorization.credentials_file)"
        )
    return value


def check_label_name(value: str) -> str:
    if not LABEL_NAME_RE.match(value):
        raise ValueError(f"not a valid label name: {preview(value)}")
    return value


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker: the mapping key itself is what is wrong
            out += " (key)"
        else:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
