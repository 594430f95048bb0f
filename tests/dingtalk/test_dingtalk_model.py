"""The relay against a reference model of Alertmanager's notifications (hypothesis stateful).

The model: one alert in one group goes through episodes (FIRING, then RESOLVED, then a new
FIRING with a later ``startsAt``...). Each state reaches the relay first from whichever
Alertmanager sends it (the ``timeline``); Alertmanager sends one group's states in order,
and retries a state the relay answered 503 for. Besides, the relay receives:

* HA copies and resends of the newest state, within the dedup window of its first send
  (replica ``n`` sends ``n * peer_timeout`` after the first unless gossip says it was sent;
  a sender that timed out retries at once);
* late copies of any older state, at any time (a replica that was partitioned or restarted
  sends what it knew);
* a RESOLVED that a partitioned replica sends with its own ``endsAt`` (it timed the alert
  out itself), at any time after the episode's RESOLVED;
* restarts of the relay, which keeps its memory in a data dir;
* DingTalk failing a send once (the relay answers 503 and Alertmanager sends the state again).

What is not in the model, because no relay can tell it from a real notification: a copy of
the newest state arriving later than the dedup window is a ``repeat_interval`` reminder and
is shown again.

Invariant after every step: DingTalk has shown exactly the timeline so far, each state once,
in order, so no older state ever after a newer one. Time is a fake clock; no sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from alertmanager.dingtalk.app import Relay, build_relay, handle_webhook
from alertmanager.dingtalk.config import RobotConfig
from alertmanager.dingtalk.errors import RelayError, TransientDeliveryError
from alertmanager.dingtalk.render import Part, Renderer

from .payloads import alert, relay_config, webhook

ROBOT = "cn-bj"
START = 1_800_000_000.0
#: DingTalk's limit is 20 a minute: a new state at least every 3.5 s never waits for a slot.
STEP = 3.5
_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


class FakeDingTalk:
    """The relay's ``Sender``: records what it shows, fails when told to."""

    def __init__(self) -> None:
        self.shown: list[Part] = []
        self.fail_next = False

    async def send(self, robot: RobotConfig, part: Part) -> None:
        del robot
        if self.fail_next:
            self.fail_next = False
            raise TransientDeliveryError("DingTalk busy (-1)", reason="errcode_-1")
        self.shown.append(part)


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RelayModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.data_dir = Path(tempfile.mkdtemp(prefix="relay-model-"))
        self.now = START
        self.dingtalk = FakeDingTalk()
        self.config = relay_config(timezone="UTC", max_wait="2s", grafana_url=None,
                                   robot={"rate_per_minute": 20})
        self.renderer = Renderer(self.config)  # compiled once: a restart reads the same config
        self.relay = self._start()
        #: (status, startsAt, endsAt) of each state in the order Alertmanager first sent it.
        self.timeline: list[tuple[str, float, float]] = []
        self.first_sent_at = 0.0
        self.answers: list[str] = []

    def _start(self) -> Relay:
        return build_relay(self.config, client=self.dingtalk, clock=lambda: self.now, data_dir=self.data_dir,
                           renderer=self.renderer)

    def _post(self, state: tuple[str, float, float], *, replica: int) -> str:
        status, starts, ends = state
        body = webhook([{**alert(1, status=status), "startsAt": stamp(starts),
                         "endsAt": stamp(ends) if status == "resolved" else "0001-01-01T00:00:00Z"}])
        body["externalURL"] = f"http://alertmanager-{replica}:9093"
        try:
            answer: dict[str, Any] = self.loop.run_until_complete(
                handle_webhook(self.relay, ROBOT, json.dumps(body).encode()))
        except RelayError as exc:
            return f"error {exc.status}"
        self.answers.append(answer["status"])
        return str(answer["status"])

    def _first_send(self, state: tuple[str, float, float]) -> None:
        self.timeline.append(state)
        self.first_sent_at = self.now
        while self._post(state, replica=0) == "error 503":  # Alertmanager retries until 200
            self.now += STEP

    # ---- Alertmanager -----------------------------------------------------------------------

    @rule(wait=st.floats(STEP, 900))
    def next_state(self, wait: float) -> None:
        """The alert resolves, or a new episode fires; the first copy reaches the relay."""
        self.now += wait
        at = float(int(self.now))  # the payload's times are whole seconds
        if self.timeline and self.timeline[-1][0] == "firing":
            _, starts, _ = self.timeline[-1]
            self._first_send(("resolved", starts, at))
        else:
            self._first_send(("firing", at, 0.0))

    @precondition(lambda self: bool(self.timeline))
    @rule(delay=st.floats(0, 59), replica=st.integers(0, 2))
    def copy_of_newest(self, delay: float, replica: int) -> None:
        """Another replica's copy, or a resend, of the newest state, inside the window."""
        assume(self.now + delay < self.first_sent_at + self.config.dedup_window)
        self.now += delay
        assert self._post(self.timeline[-1], replica=replica) == "duplicate"

    @precondition(lambda self: len(self.timeline) > 1)
    @rule(data=st.data(), delay=st.floats(0, 3600))
    def late_copy(self, data: st.DataObject, delay: float) -> None:
        """A copy of an older state, from a replica that was away."""
        self.now += delay
        index = data.draw(st.integers(0, len(self.timeline) - 2), label="older state")
        assert self._post(self.timeline[index], replica=1) in {"duplicate", "stale"}

    @precondition(lambda self: any(status == "resolved" for status, _, _ in self.timeline))
    @rule(data=st.data(), delay=st.floats(0, 3600), later=st.integers(1, 300))
    def resolve_timed_out_by_a_replica(self, data: st.DataObject, delay: float, later: int) -> None:
        """A RESOLVED a partitioned replica sends when the alert times out there: the same
        episode, its own (later) ``endsAt``, so not a copy byte for byte."""
        self.now += delay
        ends = [state for state in self.timeline if state[0] == "resolved"]
        status, starts, end = data.draw(st.sampled_from(ends), label="resolved state")
        assert self._post((status, starts, end + later), replica=1) in {"duplicate", "stale"}

    @rule()
    def dingtalk_fails_once(self) -> None:
        self.dingtalk.fail_next = True

    # ---- the relay --------------------------------------------------------------------------

    @rule(delay=st.floats(0, 30))
    def restart(self, delay: float) -> None:
        self.loop.run_until_complete(self._close())
        self.now += delay
        self.relay = self._start()

    async def _close(self) -> None:
        for sender in self.relay.senders.values():
            await sender.aclose()

    # ---- what DingTalk shows ----------------------------------------------------------------

    @invariant()
    def shown_is_the_timeline_once_in_order(self) -> None:
        shown = []
        for part in self.dingtalk.shown:
            status = "firing" if part.title.startswith("[FIRING") else "resolved"
            times = _TIME.findall(part.text)
            starts = datetime.strptime(times[0], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
            ends = (datetime.strptime(times[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
                    if status == "resolved" else 0.0)
            shown.append((status, starts, ends))
        assert shown == self.timeline

    def teardown(self) -> None:
        self.loop.run_until_complete(self._close())
        self.loop.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


RelayModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
test_relay_model = RelayModel.TestCase
