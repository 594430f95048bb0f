"""Replicas sharing the Consul stand-in, in one process: followers serve the leader's state and
refuse writes with 503 naming the leader; a take-over moves nothing and finishes the
hand-overs in flight; a deposed leader's write is refused, never merged."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from federation.controller.base.changing import ChangeRequest
from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.options import ControllerOptions
from federation.controller.controller import Controller
from federation.controller.ha.replicating import Replication
from federation.controller.http.service import (
    ServeSettings,
    Service,
    SettingsError,
    build_service,
    parse_store_url,
)
from federation.controller.stores.store import FencedOut, StoreConflict
from federation.testing.standins.consul.agent import FakeConsulAgent
from tests.conftest import wait_for
from tests.controller.ha_helpers import store
from tests.controller.harness import TOKEN, fleet, write_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Api:
    """Synchronous calls into an app in-process (ASGI, no sockets)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)


@pytest.fixture
def agent() -> Iterator[FakeConsulAgent]:
    with FakeConsulAgent() as running:
        yield running


def write_inventory(path: Path, count: int) -> Path:
    targets = [
        {
            "address": t.address,
            "port": t.port,
            "job": t.job,
            "node": t.node,
            "region": t.region,
            "gpus": t.gpus,
        }
        for t in fleet(count)
    ]
    path.write_text(yaml.safe_dump({"targets": targets}))
    return path


@dataclass
class Replica:
    name: str
    service: Service
    api: Api

    @property
    def leading(self) -> bool:
        return self.service.controller.replica_status()["role"] == "leader"

    def status(self) -> dict[str, Any]:
        return dict(self.api.get("/v1/status").json())


@pytest.fixture
def replicas(agent: FakeConsulAgent, tmp_path: Path) -> Iterator[list[Replica]]:
    spec = write_spec(tmp_path / "spec.yaml")
    inventory = write_inventory(tmp_path / "inventory.yaml", 12)
    started: list[Replica] = []
    for name in ("a", "b"):
        settings = ServeSettings(
            spec=spec,
            data_dir=tmp_path / name,
            inventory=inventory,
            check_configs=False,
            options=ControllerOptions(
                debounce_s=0.1, grace_s=0.0, refresh_interval_s=0.2, handover_window_s=3.0
            ),
            env={"GPUFED_TOKEN": TOKEN},
            store_url=f"consul://{agent.address}/test",
            election="consul",
            advertise_url=f"http://{name}.example:8080",
            lock_ttl_s=10,
            lock_delay_s=0,
        )
        service = build_service(settings)
        service.start()
        started.append(Replica(name=name, service=service, api=Api(service.app)))
    yield started
    for replica in started:
        replica.service.stop()


def leader_and_follower(replicas: list[Replica]) -> tuple[Replica, Replica]:
    def split() -> tuple[Replica, Replica] | None:
        leading = [r for r in replicas if r.leading]
        if len(leading) != 1:
            return None
        return leading[0], next(r for r in replicas if r is not leading[0])

    return wait_for(split, timeout=30, what="one leader and one follower")


def same_sd(replicas: list[Replica], child: str) -> bytes | None:
    bodies = {r.api.get(f"/v1/sd/{child}").content for r in replicas}
    return bodies.pop() if len(bodies) == 1 and b"targets" in next(iter(bodies)) else None


def test_a_follower_serves_the_leaders_state_and_refuses_writes_naming_the_leader(
    replicas: list[Replica],
) -> None:
    leader, follower = leader_and_follower(replicas)
    wait_for(lambda: same_sd(replicas, "r1-0"), timeout=30, what="both replicas serving one SD answer")
    status = follower.status()
    assert status["role"] == "follower" and status["leader"] == "http://a.example:8080".replace(
        "a", leader.name, 1
    )
    assert status["state_age_s"] is not None and status["state_age_s"] < 5
    assert leader.status()["role"] == "leader" and leader.status()["fence"] > 0
    assert follower.api.get("/v1/targets").json()["total"] == 12  # reads come from the shared state

    refused = follower.api.post("/v1/plan", json={"add_shard": ["r1"]}, headers=AUTH)
    assert refused.status_code == 503
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["leader"] == leader.service.elector.leader_address()
    registered = follower.api.put(
        "/v1/registry/targets/10.9.9.9:9400",
        json={"address": "10.9.9.9", "port": 9400, "job": "gpu", "node": "late", "region": "r1"},
        headers=AUTH,
    )
    assert registered.status_code == 503
    assert follower.api.post("/v1/plan", json={}).status_code == 401  # no token: 401 before 503
    assert leader.api.post("/v1/plan", json={"add_shard": ["r1"]}, headers=AUTH).status_code == 200


def test_sd_fetches_served_by_a_follower_reach_the_leader(replicas: list[Replica]) -> None:
    leader, follower = leader_and_follower(replicas)
    wait_for(lambda: same_sd(replicas, "r1-0"), timeout=30, what="both replicas serving one SD answer")
    assert leader.service.controller.children.fetched("r1-1") is None
    assert follower.api.get("/v1/sd/r1-1").status_code == 200  # the child asked the follower
    wait_for(
        lambda: leader.service.controller.children.fetched("r1-1"),
        timeout=30,
        what="the leader learning of the fetch",
    )


def test_a_registration_at_the_leader_reaches_the_followers_sd(replicas: list[Replica]) -> None:
    leader, follower = leader_and_follower(replicas)
    body = {"address": "10.9.9.9", "port": 9400, "job": "gpu", "node": "late", "region": "r1"}
    assert leader.api.put("/v1/registry/targets/10.9.9.9:9400", json=body, headers=AUTH).status_code == 201

    def follower_lists_it() -> bool:
        return any(
            b"10.9.9.9:9400" in follower.api.get(f"/v1/sd/{child}").content
            for child in ("r1-0", "r1-1", "r2-0")
        )

    wait_for(follower_lists_it, timeout=30, what="the follower's SD listing the new target")


def test_a_take_over_moves_nothing_and_finishes_the_handovers_in_flight(replicas: list[Replica]) -> None:
    leader, follower = leader_and_follower(replicas)
    wait_for(lambda: same_sd(replicas, "r1-0"), timeout=30, what="both replicas serving one SD answer")
    planned = leader.api.post("/v1/plan", json={"add_shard": ["r1"]}, headers=AUTH).json()
    applied = leader.api.post("/v1/rebalance", json={"version": planned["version"]}, headers=AUTH).json()
    assert applied["applied"] and applied["moves"]
    in_flight = leader.service.controller.state.handovers
    assert in_flight  # no child proves it scrapes: they last the 3 s window
    wait_for(
        lambda: follower.service.controller.state.handovers == in_flight,
        timeout=30,
        what="follower sees them",
    )
    placement = leader.api.get("/v1/targets").json()["targets"]
    old_fence = leader.status()["fence"]

    leader.service.stop()  # resigns: the follower need not wait for the lock's TTL
    wait_for(lambda: follower.leading, timeout=30, what="the follower taking over")
    assert follower.api.get("/v1/targets").json()["targets"] == placement  # nothing moved
    assert follower.status()["fence"] > old_fence
    entries = follower.api.get("/v1/audit").json()["entries"]
    assert entries[0]["action"] == "lead" and entries[0]["detail"]["fence"] == follower.status()["fence"]
    for shard in {h.to_shard for h in in_flight}:  # the new shard's child fetches its list
        assert follower.api.get(f"/v1/sd/{shard}").status_code == 200
    wait_for(
        lambda: follower.service.controller.state.handovers == [], timeout=30, what="hand-overs finished"
    )
    assert follower.api.get("/v1/targets").json()["targets"] == placement
    assert follower.status()["assignment_version"] == applied["assignment_version"]


class Elector:
    """A hand-set elector: what the controller is told, right or wrong."""

    def __init__(self, *, leading: bool, fence: int) -> None:
        self.leading, self.token = leading, fence

    def is_leader(self) -> bool:
        return self.leading

    def fence(self) -> int | None:
        return self.token if self.leading else None


def controller(tmp_path: Path, agent: FakeConsulAgent, elector: Elector) -> Controller:
    from prometheus_client import CollectorRegistry

    tmp_path.mkdir(parents=True, exist_ok=True)
    shared, metrics = store(agent), ControllerMetrics(registry=CollectorRegistry())
    ctl = Controller(
        spec=write_spec(tmp_path / "spec.yaml"),
        store=shared,
        metrics=metrics,
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0),
        replication=Replication(
            store=shared,
            metrics=metrics,
            can_write=elector.is_leader,
            fence=elector.fence,
            leader=lambda: "http://new.example:8080",
        ),
    )
    ctl.restore()
    return ctl


def test_a_deposed_leader_that_still_believes_it_leads_cannot_write(
    tmp_path: Path, agent: FakeConsulAgent
) -> None:
    from federation.controller.base import errors

    old = controller(tmp_path / "old", agent, Elector(leading=True, fence=5))
    old.take_over()
    old.reconciler.on_change("file", fleet(8))
    old.tick(idle=False)
    planned = old.plan(ChangeRequest(add_shard=["r1"]))
    new = controller(tmp_path / "new", agent, Elector(leading=True, fence=9))
    new.take_over()  # records fence 9 in the store before anything else
    stored = store(agent).load()
    assert stored is not None and stored.assignment == old.state.assignment

    with pytest.raises(errors.Unavailable, match="lost the leadership") as refused:
        old.apply(planned.version, actor="stale")
    assert refused.value.leader == "http://new.example:8080"
    old.reconciler.on_change("file", fleet(9))
    with pytest.raises(FencedOut):
        old.tick(idle=False)
    after = store(agent).load()
    assert after is not None and after.revision == stored.revision  # nothing of the old leader landed
    assert after.assignment == stored.assignment


def test_store_and_election_settings_are_checked_naming_the_flag(tmp_path: Path) -> None:
    assert parse_store_url("consul://127.0.0.1:8500") == ("127.0.0.1:8500", "gpufed")
    assert parse_store_url("consul://c.example:8501/prod/gpufed/") == ("c.example:8501", "prod/gpufed")
    for bad in ("127.0.0.1:8500", "etcd://x:1", "consul://host:port", "consul://h:1/a?b"):
        with pytest.raises(SettingsError, match="--store"):
            parse_store_url(bad)
    spec = write_spec(tmp_path / "spec.yaml")
    base: dict[str, Any] = {"spec": spec, "data_dir": tmp_path / "d", "env": {"GPUFED_TOKEN": TOKEN}}
    with pytest.raises(SettingsError, match="--leader-election consul needs a shared store"):
        build_service(ServeSettings(**base, election="consul", advertise_url="http://a:1"))
    with pytest.raises(SettingsError, match="--advertise-url"):
        build_service(ServeSettings(**base, election="consul", store_url="consul://127.0.0.1:1"))
    with pytest.raises(SettingsError, match="--leader-election: expected kubernetes, consul or none"):
        build_service(ServeSettings(**base, election="zookeeper"))


def test_racing_writers_without_election_converge_through_cas(tmp_path: Path, agent: FakeConsulAgent) -> None:
    """Two writers on one base (no election: a misconfiguration CAS must survive): the
    second write loses, re-reads, serves the winner's state, then places its own news on it."""
    a = controller(tmp_path / "a", agent, Elector(leading=True, fence=0))
    b = controller(tmp_path / "b", agent, Elector(leading=True, fence=0))
    a.reconciler.on_change("file", fleet(8))
    a.tick(idle=False)
    b.refresh_from_store()
    base = store(agent).load()
    assert base is not None and b.state == base

    a.reconciler.on_change("file", fleet(9))  # both saw a change at once, from one base
    b.reconciler.on_change("file", [*fleet(8), *fleet(1, region="r2", start=500)])
    a.tick(idle=False)
    with pytest.raises(StoreConflict):
        b.tick(idle=False)
    won = store(agent).load()
    assert won is not None and won.revision == base.revision + 1
    assert b.state == won  # the loser serves what was stored...
    assert b.publication.sd.version == won.assignment_version
    b.tick(idle=False)  # ...and its next tick applies its own view on top of the winner's
    final = store(agent).load()
    assert final is not None and final.revision == won.revision + 1
    assert final.assignment is not None and won.assignment is not None
    seen_by_b = {t.identity for t in [*fleet(8), *fleet(1, region="r2", start=500)]}
    assert set(final.assignment.targets) == seen_by_b  # b's view, built on the winner's placement
    kept = set(won.assignment.targets) & seen_by_b
    assert all(final.assignment.targets[i] == won.assignment.targets[i] for i in kept)  # nothing moved


def test_a_new_leader_whose_registry_is_down_keeps_the_last_known_targets(
    tmp_path: Path, agent: FakeConsulAgent
) -> None:
    old = controller(tmp_path / "old", agent, Elector(leading=True, fence=3))
    old.take_over()
    old.reconciler.on_change("consul/gpufed-exporter@dc1", fleet(10))
    old.tick(idle=False)  # places them and saves the sets (the Consul source's among them)
    placed = store(agent).load()
    assert placed is not None and placed.assignment is not None and len(placed.assignment.targets) == 10

    new = controller(tmp_path / "new", agent, Elector(leading=True, fence=7))
    new.reconciler.on_error("consul/gpufed-exporter@dc1", "connection refused")  # its registry is down
    new.take_over()
    assert sum(new.publication.sd.targets_of(child) for child in ("r1-0", "r1-1", "r2-0")) == 10
    assert new.tick(idle=False) is None  # nothing to re-place: the stored set stands in
    after = store(agent).load()
    assert after is not None and after.assignment == placed.assignment
