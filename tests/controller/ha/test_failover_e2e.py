"""Real ``gpufed serve`` processes against the Consul stand-in (its own process): one leader,
``kill -9`` of the leader, a leader frozen with SIGSTOP past its TTL.

Deadlines are generous (a loaded two-core machine); how fast a take-over is belongs to
``gpufed bench failover``. What is exact here: one leader, nothing moved, no SD error on a
surviving replica, no write from a deposed leader.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from federation.testing.benches.failover import SdPoller
from federation.testing.harnesses.replicas import ReplicaSet, Standin, kv_json, stopped, write_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TTL = 10  # Consul's smallest session TTL
SLACK = 30.0


@pytest.fixture
def standin() -> Iterator[Standin]:
    running = Standin.start()
    yield running
    running.stop()


def replica_set(tmp_path: Path, standin: Standin, count: int) -> ReplicaSet:
    spec, inventory = write_fleet(tmp_path, nodes=300, regions={"r1": 4, "r2": 2})
    rs = ReplicaSet(workdir=tmp_path, spec=spec, inventory=inventory, consul=standin.address, ttl_s=TTL)
    rs.start(count)
    return rs


def test_two_replicas_elect_one_leader_and_serve_the_same_sd(tmp_path: Path, standin: Standin) -> None:
    with replica_set(tmp_path, standin, 2) as rs:
        leader = rs.one_leader(timeout=60 + SLACK)
        rs.settled(timeout=60)
        (follower,) = [r for r in rs.replicas if r is not leader]
        for child in rs.children(leader):
            assert rs.sd(follower, child) == rs.sd(leader, child)
        assert rs.placement(follower) == rs.placement(leader)
        refused = rs.write(follower, "/v1/plan", {"add_shard": ["r1"]})
        assert refused.status_code == 503 and refused.json()["leader"] == leader.url
        assert rs.write(leader, "/v1/plan", {"add_shard": ["r1"]}).status_code == 200
        lock = kv_json(standin.address, "gpufed/leader")
        assert lock["Value"] == leader.url and lock["Session"]
        for _ in range(10):  # and it stays one leader while both renew
            assert [r.name for r in rs.leaders()] == [leader.name]
            time.sleep(0.3)


def test_kill_9_of_the_leader_of_three_moves_nothing_and_sd_never_fails(
    tmp_path: Path, standin: Standin
) -> None:
    with replica_set(tmp_path, standin, 3) as rs:
        leader = rs.one_leader(timeout=60 + SLACK)
        version = rs.settled(timeout=60)
        before = rs.placement(leader)
        children = rs.children(leader)
        expected = {child: rs.sd(leader, child) for child in children[:4]}
        survivors = [r for r in rs.replicas if r is not leader]
        poller = SdPoller(replicas=survivors, expected=expected, timeout_s=5.0).start()
        try:
            time.sleep(0.5)
            os.kill(leader.proc.pid, signal.SIGKILL)
            leader.proc.wait(10)
            new = rs.one_leader(timeout=TTL + SLACK)
            assert new is not leader
            time.sleep(2.0)  # the new leader ticks and settles while SD is still polled
        finally:
            poller.stop()
        assert poller.requests > 50
        assert (poller.errors, poller.changed) == (0, 0), poller.error_samples
        assert rs.placement(new) == before
        status = rs.status(new)
        assert status["assignment_version"] == version
        other = next(r for r in survivors if r is not new)
        assert rs.status(other)["leader"] == new.url


def test_a_leader_frozen_past_its_ttl_cannot_write_when_it_wakes(tmp_path: Path, standin: Standin) -> None:
    with replica_set(tmp_path, standin, 2) as rs:
        old = rs.one_leader(timeout=60 + SLACK)
        rs.settled(timeout=60)
        (new,) = [r for r in rs.replicas if r is not old]
        old_fence = rs.status(old)["fence"]
        with stopped(old):
            rs.one_leader(timeout=TTL + SLACK)  # the follower takes over while the old one sleeps
            assert rs.leaders() == [new]
            new_fence = rs.status(new)["fence"]
            assert new_fence > old_fence
            # discovery changes meanwhile: both replicas' loops see it, only one may write it
            inventory = rs.inventory.read_text()
            rs.inventory.write_text(inventory.replace("gpus: 8", "gpus: 4", 5))
            head = wait_head(
                standin, lambda h: h["Value"]["fence"] == new_fence and h["Value"]["audit"] is None
            )
        woke = rs.write(old, "/v1/plan", {})
        assert woke.status_code == 503  # its lease ran out while it was frozen: no call needed
        assert woke.json()["leader"] in (new.url, None)
        wait_for(lambda: rs.status(old)["role"] == "follower" and rs.status(old)["leader"] == new.url,
                 timeout=SLACK, interval=0.2, what="the woken replica following the new leader")
        time.sleep(3.0)  # give a stale writer every chance
        after = kv_json(standin.address, "gpufed/state")
        assert after["Value"]["fence"] == new_fence
        entries = rs.http.get(f"{new.url}/v1/audit").json()["entries"]
        leads = [e for e in entries if e["action"] == "lead"]
        assert leads[0]["detail"]["fence"] == new_fence  # the newest term is the new leader's
        assert after["ModifyIndex"] >= head["ModifyIndex"]
        assert rs.placement(old) == rs.placement(new)  # the woken one serves what was stored
        assert "fenced out" not in old.log.read_text()  # it did not even try: its lease had run out


def wait_head(standin: Standin, ok: object, timeout: float = SLACK) -> dict:  # type: ignore[type-arg]
    def matching() -> dict | None:  # type: ignore[type-arg]
        head = kv_json(standin.address, "gpufed/state")
        return head if head is not None and ok(head) else None  # type: ignore[operator]

    return wait_for(matching, timeout=timeout, interval=0.2, what="the stored head")  # type: ignore[no-any-return]
