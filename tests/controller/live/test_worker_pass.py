"""One pass of the controller's worker (``federation.controller.loop``), forward: a new
leader takes over before its first step, a leader steps and settles when due, a follower
refreshes from the store when due, a lost fence adopts the stored state, and in either role
the registry's expired entries go once a second (the registry has no thread of its own)."""

from __future__ import annotations

from typing import Any

import pytest

from federation.controller.base.options import ControllerOptions
from federation.controller.live.inbox import Inbox
from federation.controller.loop import Worker
from federation.controller.stores.store import FencedOut, StoreError


class Replication:
    def __init__(self) -> None:
        self.writes, self.leading, self.calls = True, False, []

    def may_write(self) -> bool:
        return self.writes

    def note_role(self, leading: bool) -> None:
        self.leading = leading

    def share_fetches(self, children: Any) -> None:
        self.calls.append("share")


class Recorder:
    def __init__(self, calls: list[str], fail: type[Exception] | None = None) -> None:
        self.calls, self.fail = calls, fail

    def __getattr__(self, name: str) -> Any:
        def call(**_: Any) -> int:
            self.calls.append(name)
            if self.fail is not None and name == "tick":
                raise self.fail("lost")
            return 0

        return call


def worker(*, fail: type[Exception] | None = None) -> tuple[Worker, Replication, list[str], list[float]]:
    clock = [100.0]
    replication = Replication()
    calls = replication.calls
    options = ControllerOptions(settle_interval_s=5.0, refresh_interval_s=2.0)
    inbox = Inbox(None, options, clock=lambda: clock[0])  # type: ignore[arg-type]
    made = Worker(
        inbox=inbox, route=Recorder(calls, fail), adoption=Recorder(calls),  # type: ignore[arg-type]
        replication=replication, children=None, registry=Recorder(calls),  # type: ignore[arg-type]
    )  # fmt: skip
    return made, replication, calls, clock


def test_a_new_leader_takes_over_once_then_steps_and_settles_when_due() -> None:
    w, replication, calls, clock = worker()
    w.one_pass(idle=False)
    assert calls == ["expire", "take_over", "tick", "share", "settle"] and replication.leading
    calls.clear()
    w.one_pass(idle=True)  # settling is not due again for 5 s, expiry for 1 s; no second take-over
    assert calls == ["tick"]
    clock[0] += 1
    calls.clear()
    w.one_pass(idle=True)
    assert calls == ["expire", "tick"]
    clock[0] += 4
    calls.clear()
    w.one_pass(idle=False)
    assert calls == ["expire", "tick", "share", "settle"]


def test_a_follower_refreshes_from_the_store_only_when_due() -> None:
    w, replication, calls, clock = worker()
    replication.writes = False
    w.one_pass(idle=True)
    assert calls == ["expire", "refresh_from_store", "share"] and not replication.leading
    calls.clear()
    w.one_pass(idle=True)
    assert calls == []
    clock[0] += 2
    w.one_pass(idle=True)
    assert calls == ["expire", "refresh_from_store", "share"]


@pytest.mark.parametrize("lost", [FencedOut, StoreError])
def test_a_lost_fence_adopts_the_stored_state_and_a_store_error_does_not(lost: type[Exception]) -> None:
    w, _, calls, _ = worker(fail=lost)
    with pytest.raises(lost):
        w.one_pass(idle=False)
    expected = ["expire", "take_over", "tick"] + (["resync"] if lost is FencedOut else [])
    assert calls == expected
