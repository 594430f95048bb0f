"""The newest state the relay has sent per alert group: no notification moves a group back.

Why: Alertmanager HA replicas share a notification log, not their alerts. A replica that
restarts, or that missed a resolve, can send ``[FIRING]`` for a group its peer has just
sent ``[RESOLVED]`` for; the relay's dedup (``dedup``) drops only identical copies, so
DingTalk showed the older state last. This module keeps, per robot and group
(``groupKey``) and per alert in it (its fingerprint), the newest state accepted for
sending, and filters a notification against it.

Which state is older, per alert (fingerprint). An episode is one firing of the alert, from
its ``startsAt`` to the ``endsAt`` of its RESOLVED; a new episode starts after the previous
one ended. Besides the newest state sent, the relay keeps the latest ``endsAt`` of a
RESOLVED it sent (``resolved_until``):

* a FIRING is older when it began at or before ``resolved_until`` (an episode that has
  ended: the same one, or an earlier one), or before the FIRING already sent (an earlier
  episode whose RESOLVED the relay never saw);
* a RESOLVED is older when the newest episode sent began after this resolve's ``endsAt``
  (the end of an earlier episode, arriving after the next one fired or ended).

A FIRING is compared with an ``endsAt``, so replicas that were sent an alert without
``startsAt`` (not by Prometheus) and each stamped their own a few ms apart still agree on
the episode. Two FIRINGs are compared by ``startsAt``: the earlier-stamped copy of an
episode already announced as firing is left out, which loses nothing. An older alert is
left out of the message; a notification with only older alerts is dropped and counted by
the caller, and so is one whose only news would be a RESOLVED that already reached DingTalk
(a replica that timed the alert out itself sends it with its own ``endsAt``, so its own
dedup key). A state equal to the newest is sent (a group's notification repeats the alerts
whose state did not change, and ``repeat_interval`` reminders must reach DingTalk);
identical copies are the dedup's business.

The state is recorded when a notification is accepted, before it is queued: the robot's
sender delivers in submission order, so what is recorded is what DingTalk shows last. What
reached DingTalk is recorded after delivery (``announce``), so a RESOLVED whose send failed
is not taken for a repeat when Alertmanager retries it.

Memory: ``snapshot``/``restore`` turn it into plain rows, which ``memory`` keeps in a file
under the relay's ``--data-dir`` so a restart remembers the order; without a data dir a
restart forgets, and the first notification of a group after it is sent whatever it says.
Entries expire ``retention`` seconds after they were last recorded (a resolved group is not
resent by Alertmanager after its ``resolve_timeout``; the default keeps a day).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from alertmanager.dingtalk.payload import Alert

Clock = Callable[[], float]
DEFAULT_RETENTION_S = 86400.0


@dataclass(frozen=True)
class AlertState:
    firing: bool
    starts_at: datetime
    ends_at: datetime

    @classmethod
    def of(cls, alert: Alert) -> AlertState:
        return cls(firing=alert.status == "firing", starts_at=alert.startsAt, ends_at=alert.endsAt)


@dataclass(frozen=True)
class Seen:
    """What the relay sent of one alert: its newest state and the latest end it announced."""

    newest: AlertState
    resolved_until: datetime | None
    at: float
    #: The latest ``endsAt`` of a RESOLVED that reached DingTalk (``resolved_until`` counts
    #: one accepted for sending, which may still fail and be retried).
    announced_until: datetime | None = None

    def superseded(self, state: AlertState) -> bool:
        """``state``, arriving now, would move the alert back."""
        if state.firing:
            if self.resolved_until is not None and state.starts_at <= self.resolved_until:
                return True
            return self.newest.firing and state.starts_at < self.newest.starts_at
        return self.newest.starts_at > state.ends_at

    def repeats(self, state: AlertState) -> bool:
        """``state`` is a RESOLVED of an episode whose end was already announced: the same
        resolve from a replica that timed the alert out itself (another ``endsAt``, so
        another dedup key). Alertmanager never re-sends a RESOLVED, so it is news to no one."""
        until = self.announced_until
        return not state.firing and until is not None and state.starts_at <= until

    def after(self, state: AlertState, at: float) -> Seen:
        """This memory once ``state`` (not superseded) was accepted for sending."""
        until = self.resolved_until
        if not state.firing:
            until = state.ends_at if until is None else max(until, state.ends_at)
        return Seen(newest=state, resolved_until=until, at=at, announced_until=self.announced_until)


@dataclass(frozen=True)
class Verdict:
    """What to send of a notification, and what was left out as older than already sent."""

    fresh: tuple[Alert, ...]
    stale: tuple[Alert, ...]
    #: How many of ``fresh`` repeat a RESOLVED already announced (``Seen.repeats``).
    repeats: int = 0

    @property
    def news(self) -> bool:
        """Something in the notification DingTalk has not shown yet."""
        return len(self.fresh) > self.repeats


Key = tuple[str, str, str]
#: One remembered alert as plain data: robot, group, fingerprint, firing, startsAt,
#: endsAt, resolved_until (microseconds since the epoch; None: no RESOLVED accepted yet),
#: recorded at (clock seconds), announced_until (None: no RESOLVED delivered yet).
Row = tuple[str, str, str, bool, int, int, int | None, float, int | None]


class GroupStates:
    """(robot, groupKey, fingerprint) -> what was last accepted for sending (``Seen``)."""

    def __init__(self, *, retention: float = DEFAULT_RETENTION_S, clock: Clock = time.monotonic) -> None:
        self.retention = retention
        self._clock = clock
        self._states: dict[Key, Seen] = {}

    def __len__(self) -> int:
        return len(self._states)

    def _expire(self, now: float) -> None:
        old = [key for key, seen in self._states.items() if seen.at <= now - self.retention]
        for key in old:
            del self._states[key]

    def check(self, robot: str, group: str, alerts: Sequence[Alert]) -> Verdict:
        """Split ``alerts`` into those at or after the recorded state and the stale ones."""
        self._expire(self._clock())
        fresh: list[Alert] = []
        stale: list[Alert] = []
        repeats = 0
        for alert in alerts:
            seen = self._states.get((robot, group, alert.identity()))
            state = AlertState.of(alert)
            if seen is not None and seen.superseded(state):
                stale.append(alert)
            else:
                fresh.append(alert)
                repeats += seen is not None and seen.repeats(state)
        return Verdict(fresh=tuple(fresh), stale=tuple(stale), repeats=repeats)

    def record(self, robot: str, group: str, alerts: Sequence[Alert]) -> None:
        """The alerts of a notification accepted for sending become the group's newest state."""
        now = self._clock()
        for alert in alerts:
            key = (robot, group, alert.identity())
            state = AlertState.of(alert)
            seen = self._states.get(key)
            if seen is None:
                self._states[key] = Seen(newest=state, at=now, resolved_until=(
                    None if state.firing else state.ends_at))
            elif not seen.superseded(state):
                self._states[key] = seen.after(state, now)

    def announce(self, robot: str, group: str, alerts: Sequence[Alert]) -> None:
        """The alerts of a notification reached DingTalk: their RESOLVEDs are announced."""
        for alert in alerts:
            key = (robot, group, alert.identity())
            seen = self._states.get(key)
            if seen is None or alert.status != "resolved":
                continue
            until = alert.endsAt if seen.announced_until is None else max(seen.announced_until, alert.endsAt)
            self._states[key] = replace(seen, announced_until=until)

    def snapshot(self) -> list[Row]:
        """Every remembered alert as plain rows (``Row``)."""
        return [(*key, seen.newest.firing, _micros(seen.newest.starts_at), _micros(seen.newest.ends_at),
                 _maybe_micros(seen.resolved_until), seen.at, _maybe_micros(seen.announced_until))
                for key, seen in self._states.items()]

    def restore(self, rows: Iterable[Row]) -> None:
        """Remember ``rows`` (from ``snapshot``); raises ``ValueError`` on a malformed row."""
        states: dict[Key, Seen] = {}
        for robot, group, fingerprint, firing, starts, ends, until, at, announced in rows:
            names = (robot, group, fingerprint)
            if not all(isinstance(v, str) for v in names) or not isinstance(firing, bool):
                raise ValueError("a row's robot, group and fingerprint are strings, firing a boolean")
            state = AlertState(firing=firing, starts_at=_instant(starts), ends_at=_instant(ends))
            states[(robot, group, fingerprint)] = Seen(
                newest=state, resolved_until=None if until is None else _instant(until), at=float(at),
                announced_until=None if announced is None else _instant(announced))
        self._states = states


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def _micros(value: datetime) -> int:
    """Microseconds since the epoch, exactly (a float would round them)."""
    return (value - _EPOCH) // _MICRO


def _maybe_micros(value: datetime | None) -> int | None:
    return None if value is None else _micros(value)


def _instant(micros: object) -> datetime:
    if not isinstance(micros, int) or isinstance(micros, bool):
        raise ValueError(f"not a time in microseconds: {micros!r}")
    return _EPOCH + micros * _MICRO
