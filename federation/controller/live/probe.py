"""What the controller asks child Prometheus servers: their active targets, and to reload.

The one module of the controller that calls children over HTTP, with an injected
``httpx.Client``. A child that does not answer is ``None`` (unknown), never an error:
hand-overs then finish by their window instead of by proof.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScrapeState:
    health: str
    last_scrape: float
    """Unix time of the last scrape (0 when none yet)."""


TargetKey = tuple[str, str, str]
"""(job, instance, node): how a child's active target is matched to a gpufed target."""


def parse_time(value: Any) -> float:
    """Prometheus' RFC 3339 ``lastScrape`` -> Unix seconds (0 for the zero time)."""
    from datetime import datetime

    if not isinstance(value, str) or value.startswith("0001-"):
        return 0.0
    text = value.replace("Z", "+00:00")
    if "." in text:  # Go prints up to nanoseconds; Python takes microseconds
        head, _, rest = text.partition(".")
        digits = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return 0.0


def parse_active_targets(body: Any) -> dict[TargetKey, ScrapeState]:
    """``/api/v1/targets`` JSON -> (job, instance, node) -> state; whatever does not have the
    documented shape is skipped (a child's answer is evidence, never a reason to fail)."""
    data = body.get("data") if isinstance(body, dict) else None
    active = data.get("activeTargets") if isinstance(data, dict) else None
    out: dict[TargetKey, ScrapeState] = {}
    for target in active if isinstance(active, list) else []:
        labels = target.get("labels") if isinstance(target, dict) else None
        if not isinstance(labels, dict):
            continue
        key = (str(labels.get("job", "")), str(labels.get("instance", "")), str(labels.get("node", "")))
        out[key] = ScrapeState(
            health=str(target.get("health", "unknown")), last_scrape=parse_time(target.get("lastScrape"))
        )
    return out


class ChildProbe:
    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def active_targets(self, url: str) -> dict[TargetKey, ScrapeState] | None:
        try:
            response = self._client.get(f"{url.rstrip('/')}/api/v1/targets", params={"state": "active"})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("child unreachable url=%s error=%s", url, exc)
            return None
        return parse_active_targets(body)

    def reload(self, url: str) -> bool:
        """POST ``/-/reload`` (children run with ``--web.enable-lifecycle``)."""
        try:
            return self._client.post(f"{url.rstrip('/')}/-/reload").status_code == 200
        except httpx.HTTPError:
            return False
