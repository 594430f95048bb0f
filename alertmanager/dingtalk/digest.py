"""The weekly digest: ``info`` alerts for a robot are batched into one message a period.

Why: an ``info`` alert is something to read, not something to act on now; one message a
week per group chat lists what happened instead of a message per alert (seed 002: info
goes to a weekly digest). Critical and warning alerts never enter a batch.

Where it sits: ``app.handle_webhook`` hands the ``info`` alerts of a notification to
``Digests.add`` (for the robot the notification was for) and sends the rest as before;
``app.flush_digests`` runs on a timer, takes each batch whose period ended (``due``) and
sends it as one message (``render_digest``). Periods run from an anchor in steps of the
period (``2024-01-01T09:00`` local time and 7 days by default: Monday 09:00), so a batch
opened on Wednesday is sent on the next Monday whatever the relay's uptime. Nothing is
sent for a period in which no info alert arrived.

A batch keeps one entry per alert (its fingerprint): HA copies and Alertmanager's repeats
of the same alert fold into it; a new episode (a later ``startsAt``) counts once more.
Batches are plain rows (``snapshot``/``restore``) that ``memory`` keeps in the relay's
memory file, so a restart in mid-week keeps them. Time is the relay's injected clock
(seconds since the epoch), so tests drive a week without sleeping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from alertmanager.dingtalk.config import DigestConfig, RobotConfig
from alertmanager.dingtalk.labels import lead
from alertmanager.dingtalk.payload import LATEST, ZERO_TIME, Alert
from alertmanager.dingtalk.render import Part, finish

Clock = Callable[[], float]
DIGEST_SEVERITY = "info"
#: The batch of ``digest.email`` beside the robots' (a name no robot can have: ``@``):
#: every robot's info alerts, each alert once.
EMAIL = "@email"
#: A batch the smarthost deferred (4xx) for some recipients while taking it for the others,
#: kept for those alone: ``"@email>" + ",".join(recipients)`` (an address has no comma).
EMAIL_RETRY = EMAIL + ">"
#: Alerts one batch keeps in full; more are counted, not listed (a flood must not grow the
#: memory file without bound).
MAX_ENTRIES = 500
_SUMMARY_MAX = 160
_LATEST = LATEST.timestamp()


@dataclass(frozen=True)
class Entry:
    """One alert of a batch: what the digest line shows."""

    alertname: str
    where: str
    summary: str
    firing: bool
    starts_at: float
    ends_at: float | None
    episodes: int = 1

    def seen(self, alert: Alert) -> Entry:
        """This entry after another notification of the same alert: a later episode or a
        later state of this one replaces it; an older one (an HA copy late) changes nothing."""
        starts = alert.startsAt.timestamp()
        firing = alert.status == "firing"
        if starts < self.starts_at or (starts == self.starts_at and firing and not self.firing):
            return self
        return replace(self, firing=firing, starts_at=starts, ends_at=None if firing else _end(alert),
                       episodes=self.episodes + (starts > self.starts_at),
                       summary=_summary(alert) or self.summary)


@dataclass
class Batch:
    """The info alerts one robot collected in one period."""

    opened: float
    due: float
    entries: dict[str, Entry] = field(default_factory=dict)
    dropped: int = 0

    def add(self, alert: Alert) -> None:
        key = alert.identity()
        entry = self.entries.get(key)
        if entry is not None:
            self.entries[key] = entry.seen(alert)
        elif len(self.entries) >= MAX_ENTRIES:
            self.dropped += 1
        else:
            self.entries[key] = Entry(
                alertname=alert.labels.get("alertname", "?"), where=lead(alert.labels),
                summary=_summary(alert), firing=alert.status == "firing",
                starts_at=alert.startsAt.timestamp(), ends_at=_end(alert))

    def merged(self, later: Batch) -> Batch:
        """A batch that failed to send, with what arrived while it was being sent."""
        entries = dict(self.entries)
        entries.update(later.entries)
        return Batch(opened=self.opened, due=self.due, entries=entries, dropped=self.dropped + later.dropped)


def email_retry(recipients: Iterable[str]) -> str:
    """The batch key of an e-mail digest to retry for ``recipients`` only."""
    return EMAIL_RETRY + ",".join(sorted(recipients))


def retry_recipients(key: str) -> list[str]:
    """The recipients of an ``email_retry`` key."""
    return key.removeprefix(EMAIL_RETRY).split(",")


def is_email(key: str) -> bool:
    """The e-mail digest's batch, or one of its retries for deferred recipients."""
    return key == EMAIL or key.startswith(EMAIL_RETRY)


def period_end(now: float, *, period: float, anchor: float) -> float:
    """The end of the period ``now`` lies in: the first ``anchor + k * period`` after now."""
    return anchor + (math.floor((now - anchor) / period) + 1) * period


def is_digested(alert: Alert) -> bool:
    return alert.labels.get("severity") == DIGEST_SEVERITY


class Digests:
    """robot -> open ``Batch``; ``config`` may change on reload (new batches use it)."""

    def __init__(self, config: DigestConfig, *, zone: str, clock: Clock) -> None:
        self.config = config
        self.zone = zone
        self._clock = clock
        self._batches: dict[str, Batch] = {}

    def anchor(self) -> float:
        return datetime.fromisoformat(self.config.anchor).replace(tzinfo=ZoneInfo(self.zone)).timestamp()

    def add(self, robot: str, alerts: Sequence[Alert]) -> None:
        if not alerts:
            return
        batch = self._batches.get(robot)
        if batch is None:
            now = self._clock()
            batch = Batch(opened=now, due=period_end(now, period=self.config.period, anchor=self.anchor()))
            self._batches[robot] = batch
        for alert in alerts:
            batch.add(alert)

    def pending(self, robot: str) -> Batch | None:
        return self._batches.get(robot)

    def due(self) -> list[str]:
        now = self._clock()
        return sorted(robot for robot, batch in self._batches.items() if batch.due <= now)

    def take(self, robot: str) -> Batch | None:
        return self._batches.pop(robot, None)

    def give_back(self, robot: str, batch: Batch) -> None:
        """A batch whose message failed: kept (with anything newer) for the next try."""
        newer = self._batches.get(robot)
        self._batches[robot] = batch if newer is None else batch.merged(newer)

    def forget(self, keep: Iterable[str]) -> list[str]:
        """Drop the batches of robots no longer configured (the e-mail's retries go with
        ``EMAIL``); returns their names."""
        kept = set(keep)
        gone = sorted(k for k in self._batches if k not in kept and not (is_email(k) and EMAIL in kept))
        for robot in gone:
            del self._batches[robot]
        return gone

    def snapshot(self) -> dict[str, Any]:
        """Plain data for the memory file: robot -> opened, due, dropped, entry rows."""
        return {robot: {"opened": b.opened, "due": b.due, "dropped": b.dropped,
                        "alerts": [[key, e.alertname, e.where, e.summary, e.firing, e.starts_at, e.ends_at,
                                    e.episodes] for key, e in b.entries.items()]}
                for robot, b in self._batches.items()}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Batches from ``snapshot``; ``ValueError`` on anything malformed (nothing kept)."""
        if not isinstance(data, Mapping):
            raise ValueError("digest must be an object of robot -> batch")
        batches: dict[str, Batch] = {}
        for robot, raw in data.items():
            if not isinstance(raw, Mapping) or not isinstance(raw.get("alerts"), list):
                raise ValueError(f"digest batch of {robot!r} must be an object with an alerts list")
            batch = Batch(opened=_number(raw.get("opened")), due=_number(raw.get("due")),
                          dropped=int(_number(raw.get("dropped", 0))))
            for row in raw["alerts"]:
                if not isinstance(row, list) or len(row) != 8:
                    raise ValueError("a digest row has 8 items")
                key, alertname, where, summary, firing, starts, ends, episodes = row
                if not all(isinstance(v, str) for v in (key, alertname, where, summary)):
                    raise ValueError("a digest row's fingerprint, alertname, where and summary are strings")
                counted = isinstance(episodes, int) and not isinstance(episodes, bool)
                if not isinstance(firing, bool) or not counted:
                    raise ValueError("a digest row's firing is a boolean and episodes an integer")
                batch.entries[key] = Entry(alertname=alertname, where=where, summary=summary, firing=firing,
                                           starts_at=_number(starts),
                                           ends_at=None if ends is None else _number(ends), episodes=episodes)
            batches[str(robot)] = batch
        self._batches = batches


def render_digest(robot: RobotConfig, batch: Batch, *, period: float, zone: str, limit: int) -> Part:
    """One markdown message listing the batch, under ``limit`` bytes ("+N more" when cut).

    The robot's keyword is added (DingTalk refuses a message without it); nobody is
    @-mentioned, a digest is not a page.
    """
    when = _clock(zone)
    entries = _ordered(batch)
    total = len(entries) + batch.dropped
    start = batch.due - period
    title = f"[DIGEST:{total}] info alerts"
    head = (f"#### [DIGEST] {total} info alert(s), {when(start)} to {when(batch.due)}\n\n"
            f"{sum(e.firing for e in entries)} still firing, {sum(not e.firing for e in entries)} resolved")
    quiet = robot.model_copy(update={"mentions": robot.mentions.model_copy(
        update={"mobiles": [], "user_ids": [], "all_on_critical": False})})
    lines = [f"- {_line(entry, when, bold=True)}" for entry in entries]

    def part(shown: int) -> Part:
        more = total - shown
        tail = [f"- (+{more} more)"] if more else []
        text = "\n".join([head, "", *lines[:shown], *tail])
        return finish(quiet, title=title, text=text, alerts=[])

    # Each line costs its JSON-escaped bytes and a newline; keep the longest prefix that
    # fits beside the head, the "+N more" line and the keyword, then confirm for real.
    budget = limit - part(0).size() - 32
    shown = used = 0
    for line in lines:
        cost = len(json.dumps(line, ensure_ascii=False).encode()) - 1
        if used + cost > budget:
            break
        used += cost
        shown += 1
    message = part(shown)
    while message.size() > limit and shown > 0:
        shown -= 1
        message = part(shown)
    return replace(message, alerts=total)


def render_email(batch: Batch, *, period: float, zone: str) -> tuple[str, str]:
    """The e-mail digest: a subject and a plain-text body listing every alert of the batch
    (no size limit to keep under but ``MAX_ENTRIES``; dropped ones are counted)."""
    when = _clock(zone)
    entries = _ordered(batch)
    total = len(entries) + batch.dropped
    start = batch.due - period
    subject = f"[gpufed] {total} info alert(s), {when(start)} to {when(batch.due)}"
    firing = sum(e.firing for e in entries)
    lines = [f"{total} info alert(s) from {when(start)} to {when(batch.due)} ({zone}): "
             f"{firing} still firing, {len(entries) - firing} resolved.", ""]
    lines += [f"- {_line(entry, when, bold=False)}" for entry in entries]
    if batch.dropped:
        lines.append(f"- (+{batch.dropped} more, not kept: a batch lists at most {MAX_ENTRIES})")
    return subject, "\n".join(lines) + "\n"


def _clock(zone: str) -> Callable[[float], str]:
    """Seconds since the epoch as the relay's local ``YYYY-MM-DD HH:MM``."""
    tz = ZoneInfo(zone)
    return lambda seconds: datetime.fromtimestamp(seconds, tz).strftime("%Y-%m-%d %H:%M")


def _ordered(batch: Batch) -> list[Entry]:
    return sorted(batch.entries.values(), key=lambda e: (not e.firing, e.alertname, e.where, e.starts_at))


def _line(entry: Entry, when: Callable[[float], str], *, bold: bool) -> str:
    ended = f"resolved {when(entry.ends_at)}" if entry.ends_at else "resolved"
    state = "firing" if entry.firing else ended
    times = f" ({entry.episodes} times)" if entry.episodes > 1 else ""
    where = f" {entry.where}" if entry.where else ""
    summary = f": {entry.summary}" if entry.summary else ""
    name = f"**{entry.alertname}**" if bold else entry.alertname
    return f"{name}{times}{where}{summary} (since {when(entry.starts_at)}, {state})"


def _summary(alert: Alert) -> str:
    text = " ".join((alert.annotations.get("summary") or "").split())
    return text if len(text) <= _SUMMARY_MAX else text[: _SUMMARY_MAX - 1] + "…"


def _end(alert: Alert) -> float | None:
    return alert.endsAt.timestamp() if alert.status == "resolved" and alert.endsAt > ZERO_TIME else None


def _number(value: object) -> float:
    """Seconds since the epoch (or a count) from the memory file, in the payload's range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < _LATEST:
        raise ValueError(f"not a number of seconds in 1970..9000: {value!r}")
    return float(value)
