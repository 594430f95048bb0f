"""The newest state the relay has sent per alert group: no notification moves a group back.

Why: Alertmanager HA replicas share a notification log, not their alerts. A replica that
restarts, or that missed a resolve, can send ``[FIRING]`` for a group its peer has just
sent ``[RESOLVED]`` for; the relay's dedup (``dedup``) drops only identical copies, so
DingTalk showed the older state last. This module keeps, per robot and group
(``groupKey``) and per alert in it (its fingerprint), the newest state accepted for
sending, and filters a notification against it.

Which state is older, per alert (fingerprint):

* a FIRING is older than a recorded RESOLVED when it began at or before that resolve's
  ``endsAt`` (the same episode, or an earlier one); a FIRING that began after it is a new
  episode;
* a RESOLVED is older than a recorded FIRING that began after this resolve's ``endsAt``
  (the end of an earlier episode, arriving after the next one fired).

Only ``endsAt`` against ``startsAt`` is compared, never two ``startsAt``: replicas that
were sent an alert without ``startsAt`` (not by Prometheus) each stamp their own. An
older alert is left out of the message; a notification with only older alerts is
dropped and counted by the caller.

The state is recorded when a notification is accepted, before it is queued: the robot's
sender delivers in submission order, so what is recorded is what DingTalk shows last.

Memory: in the relay process only. A restart forgets it, so the first notification of a
group after a restart is sent whatever it says (as before this module); the replicas'
next notifications re-establish the order. Entries expire ``retention`` seconds after
they were last recorded (a resolved group is not resent by Alertmanager after its
``resolve_timeout``; the default keeps a day).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

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

    def older_than(self, seen: AlertState) -> bool:
        """This state, arriving after ``seen`` was sent, would move the alert back."""
        if self.firing and not seen.firing:
            return self.starts_at <= seen.ends_at
        if not self.firing and seen.firing:
            return seen.starts_at > self.ends_at
        return False


@dataclass(frozen=True)
class Verdict:
    """What to send of a notification, and what was left out as older than already sent."""

    fresh: tuple[Alert, ...]
    stale: tuple[Alert, ...]


class GroupStates:
    """(robot, groupKey, fingerprint) -> newest ``AlertState`` accepted for sending."""

    def __init__(self, *, retention: float = DEFAULT_RETENTION_S, clock: Clock = time.monotonic) -> None:
        self.retention = retention
        self._clock = clock
        self._states: dict[tuple[str, str, str], tuple[AlertState, float]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def _expire(self, now: float) -> None:
        old = [key for key, (_, at) in self._states.items() if at <= now - self.retention]
        for key in old:
            del self._states[key]

    def check(self, robot: str, group: str, alerts: Sequence[Alert]) -> Verdict:
        """Split ``alerts`` into those at or after the recorded state and the stale ones."""
        self._expire(self._clock())
        fresh: list[Alert] = []
        stale: list[Alert] = []
        for alert in alerts:
            seen = self._states.get((robot, group, alert.identity()))
            if seen is not None and AlertState.of(alert).older_than(seen[0]):
                stale.append(alert)
            else:
                fresh.append(alert)
        return Verdict(fresh=tuple(fresh), stale=tuple(stale))

    def record(self, robot: str, group: str, alerts: Sequence[Alert]) -> None:
        """The alerts of a notification accepted for sending become the group's newest state."""
        now = self._clock()
        for alert in alerts:
            key = (robot, group, alert.identity())
            state = AlertState.of(alert)
            seen = self._states.get(key)
            if seen is None or not state.older_than(seen[0]):
                self._states[key] = (state, now)
