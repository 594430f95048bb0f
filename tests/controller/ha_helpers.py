"""Helpers for the shared-state and election tests: the Consul stand-in, clients, states."""

from __future__ import annotations

import consul

from federation.controller.base.state import ControllerState
from federation.controller.stores.consul_store import ConsulStore
from federation.testing.standins.consul.agent import FakeConsulAgent
from sharder.engine.assignment import Assignment, ShardInfo


def client(agent: FakeConsulAgent) -> consul.Consul:
    c = consul.Consul(host="127.0.0.1", port=agent.port)
    c.http.connections_timeout = 10
    return c


def store(agent: FakeConsulAgent, **kwargs: object) -> ConsulStore:
    return ConsulStore(client(agent), where=f"consul://{agent.address}", **kwargs)  # type: ignore[arg-type]


def assignment(targets: int, *, shards: int = 4, salt: str = "") -> Assignment:
    """A big assignment: ``targets`` identities spread over ``shards`` shards of one region."""
    infos = {f"r1-{i}": ShardInfo(region="r1", index=i) for i in range(shards)}
    return Assignment(
        algorithm="bounded-ring",
        algorithm_version=1,
        shards=infos,
        targets={f"node-{i:06d}{salt}.dc.example:9400": f"r1-{i % shards}" for i in range(targets)},
        weights={f"node-{i:06d}{salt}.dc.example:9400": 1 + i % 8 for i in range(targets)},
    )


def state(targets: int = 10, **update: object) -> ControllerState:
    return ControllerState(assignment=assignment(targets), assignment_version=1).model_copy(update=update)
