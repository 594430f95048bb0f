"""ConsulLock against the Consul stand-in (real HTTP through py-consul): one leader, fencing
tokens that only grow, resign, session expiry, lock-delay, a paused leader's local lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from federation.controller.ha.consul_lock import ConsulLock
from federation.controller.ha.leader import AlwaysLeader, LeaderElector, LocalLease
from federation.testing.standins.consul.agent import FakeConsulAgent
from tests.conftest import wait_for
from tests.controller.ha_helpers import client

KEY = "gpufed/leader"


@pytest.fixture
def agent() -> Iterator[FakeConsulAgent]:
    with FakeConsulAgent() as running:
        yield running


@dataclass
class Running:
    lock: ConsulLock
    stop: threading.Event = field(default_factory=threading.Event)
    offset: list[float] = field(default_factory=lambda: [0.0])
    thread: threading.Thread | None = None

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)


@pytest.fixture
def electors(agent: FakeConsulAgent) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for running in started:
        running.halt()


def start(agent: FakeConsulAgent, started: list[Running], name: str, *, lock_delay_s: int = 0) -> Running:
    offset = [0.0]
    lock = ConsulLock(
        client(agent),
        key=KEY,
        address=f"http://{name}:8080",
        ttl_s=10,
        lock_delay_s=lock_delay_s,
        retry_s=0.1,
        clock=lambda: time.monotonic() + offset[0],
    )
    running = Running(lock=lock, offset=offset)
    running.thread = threading.Thread(target=lock.run, args=(running.stop,), daemon=True)
    running.thread.start()
    started.append(running)
    return running


def leaders(started: list[Running]) -> list[Running]:
    return [r for r in started if r.lock.is_leader()]


def one_leader(started: list[Running]) -> Running | None:
    found = leaders(started)
    return found[0] if len(found) == 1 else None


def test_both_electors_satisfy_the_protocol(agent: FakeConsulAgent) -> None:
    assert isinstance(AlwaysLeader(), LeaderElector)
    assert isinstance(ConsulLock(client(agent), key=KEY, address="http://a:1"), LeaderElector)


def test_exactly_one_of_three_leads_and_the_others_name_it(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    for name in ("a", "b", "c"):
        start(agent, electors, name)
    leader = wait_for(lambda: one_leader(electors), timeout=20, what="one leader")
    followers = [r for r in electors if r is not leader]
    wait_for(
        lambda: all(f.lock.leader_address() == leader.lock.address for f in followers),
        timeout=20,
        what="followers naming the leader",
    )
    _, entry = client(agent).kv.get(KEY)
    assert entry["Value"].decode() == leader.lock.address
    assert leader.lock.fence() == entry["ModifyIndex"]
    assert all(f.lock.fence() is None for f in followers)
    for _ in range(5):  # and it stays that way while everyone renews
        assert len(leaders(electors)) == 1
        time.sleep(0.2)


def test_a_resigning_leader_hands_over_at_once_with_a_larger_fence(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    start(agent, electors, "a", lock_delay_s=30)
    first = wait_for(lambda: one_leader(electors), timeout=20, what="a leader")
    old_fence = first.lock.fence()
    start(agent, electors, "b", lock_delay_s=30)
    first.halt()  # run() resigns: release then destroy, so no lock-delay applies
    assert not first.lock.is_leader()
    second = wait_for(lambda: one_leader(electors), timeout=10, what="the other replica leading")
    assert second is not first
    fence = second.lock.fence()
    assert old_fence is not None and fence is not None and fence > old_fence
    _, sessions = client(agent).session.list()
    assert len(sessions) == 1  # the resigned replica destroyed its session...
    assert [e["Service"]["Address"] for e in client(agent).health.service("gpufed-controller")[1]] == ["b"]


def test_a_dead_leaders_check_runs_out_in_one_ttl_and_frees_the_lock_after_its_lock_delay(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    first = start(agent, electors, "a", lock_delay_s=2)
    wait_for(lambda: first.lock.is_leader(), timeout=20, what="a leading")
    old_fence = first.lock.fence()
    second = start(agent, electors, "b")
    wait_for(lambda: second.lock.leader_address() == first.lock.address, timeout=20, what="b following a")
    first.stop.set()  # a dies without resigning: its check and session are never renewed again
    first.lock.resign = lambda: None  # type: ignore[method-assign]
    first.thread.join(10)  # type: ignore[union-attr]
    agent.advance(10.1)  # one TTL: the session alone would live on to 2 TTL, its check does not
    expired_at = time.monotonic()
    health = client(agent).health.service("gpufed-controller")[1]
    statuses = {e["Service"]["Address"]: e["Checks"][-1]["Output"] for e in health}
    assert statuses["a"] == "TTL expired"  # (b's jumped too: it recovers on its next heartbeat)
    wait_for(lambda: second.lock.is_leader(), timeout=20, what="b taking over")
    assert time.monotonic() - expired_at >= 2.0  # not before a's lock-delay ran out
    assert second.lock.fence() > old_fence  # type: ignore[operator]


def test_a_leader_whose_lease_ran_out_locally_stops_leading_before_consul_says_so(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    a = start(agent, electors, "a")
    wait_for(lambda: a.lock.is_leader(), timeout=20, what="a leading")
    a.offset[0] += 10.5  # as if the process was stopped (SIGSTOP) for longer than its TTL
    assert not a.lock.is_leader() and a.lock.fence() is None  # no network call needed
    assert a.lock.leader_address() is None  # not itself any more, and who is: not known yet
    # its session is still alive in Consul (reaped only at 2 TTL): the next renewal brings it back
    wait_for(lambda: a.lock.is_leader(), timeout=20, what="a renewing and leading again")


def test_a_deposed_leader_notices_its_lock_is_gone_and_follows(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    a = start(agent, electors, "a")
    wait_for(lambda: a.lock.is_leader(), timeout=20, what="a leading")
    b = start(agent, electors, "b")
    session = client(agent).kv.get(KEY)[1]["Session"]
    client(agent).session.destroy(session)  # an operator force-ends a's session
    wait_for(lambda: b.lock.is_leader() and not a.lock.is_leader(), timeout=20, what="b leading, a not")
    wait_for(lambda: a.lock.leader_address() == b.lock.address, timeout=20, what="a following b")


def test_checks_and_sessions_are_refreshed_every_third_of_the_ttl(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    a = start(agent, electors, "a")
    wait_for(lambda: a.lock.is_leader(), timeout=20, what="a leading")
    assert not any("/v1/session/renew/" in path for _, path in agent.requests)
    a.offset[0] += 3.4
    wait_for(
        lambda: any("/v1/session/renew/" in path for _, path in agent.requests), timeout=10, what="a renewal"
    )
    assert any(path.startswith("/v1/agent/check/pass/") for _, path in agent.requests)
    # the agent records the renewal before its answer reaches the lock, which then extends the lease
    wait_for(lambda: a.lock.is_leader() and a.lock.lease.remaining_s() > 9, timeout=10,
             what="the lease extended by the renewal")


def test_a_leader_cut_off_from_consul_leads_until_its_lease_runs_out(
    agent: FakeConsulAgent, electors: list[Running]
) -> None:
    a = start(agent, electors, "a")
    wait_for(lambda: a.lock.is_leader(), timeout=20, what="a leading")
    a.lock.client.http.connections_timeout = 1
    agent.kill()
    try:
        time.sleep(0.5)
        assert a.lock.is_leader()  # a blip is not a failover
        a.offset[0] += 10.5
        assert not a.lock.is_leader()
    finally:
        agent.revive()
    wait_for(lambda: a.lock.is_leader(), timeout=30, what="a leading again once Consul answers")


def test_bad_ttl_and_lock_delay_are_refused_naming_consuls_range(agent: FakeConsulAgent) -> None:
    with pytest.raises(ValueError, match="between 10 and 86400"):
        ConsulLock(client(agent), key=KEY, address="http://a:1", ttl_s=5)
    with pytest.raises(ValueError, match="between 0 and 60"):
        ConsulLock(client(agent), key=KEY, address="http://a:1", lock_delay_s=61)


def test_local_lease_counts_from_the_start_of_the_renewal() -> None:
    now = [100.0]
    lease = LocalLease(ttl_s=10, clock=lambda: now[0])
    assert not lease.valid()
    lease.renewed(95.0)  # the request went out at 95 and came back at 100
    assert lease.valid() and lease.remaining_s() == 5.0
    now[0] = 105.0
    assert not lease.valid()
    lease.renewed(105.0)
    lease.lost()
    assert not lease.valid()
