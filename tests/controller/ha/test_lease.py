"""The Kubernetes Lease elector against kmock, with the optimistic lock scripted in.

Why kmock rather than ``federation/testing/standins/kube.py``: kmock is an aiohttp server the
official client talks to over HTTP, and it already serves GET, POST (create, with 409
when the object exists) and 404 on a missing object the way the API server does. What
it lacks for a Lease is exactly the part leader election rests on, and that is scripted
here in ~30 lines, visible next to the tests: it stores objects verbatim (no
``resourceVersion``) and has no PUT (replace) at all. :class:`LeaseStore` stamps one
cluster-wide revision on every create and replace (as etcd does) and answers a PUT
whose ``metadata.resourceVersion`` is not the stored one with the API server's 409
``Conflict`` Status. The stand-in in ``federation/testing/standins/kube.py`` serves
list/watch of nodes, pods and EndpointSlices; it would have needed all of
create/read/replace written from scratch.

Each replica gets its own monotonic clock (a ``Clock``), so the tests show that only the
local clock decides when a lease expired.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from collections.abc import Callable
from typing import Any

import kmock as kmock_lib
import kubernetes
import pytest
from kubernetes.client import CoordinationV1Api
from kubernetes.client.exceptions import ApiException

from federation.controller.ha.leader import LeaderElector
from federation.controller.ha.lease import ADDRESS_ANNOTATION, LeaseConfig, LeaseElector

LEASES = kmock_lib.resource("coordination.k8s.io", "v1", "leases")
NS, NAME = "monitoring", "gpufed-controller"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LeaseStore:
    """What kmock lacks for Leases: resourceVersion on every write, PUT with its 409."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.revision = itertools.count(100)
        self.conflicts = 0
        kmock["create", LEASES] << self.created
        kmock["put", LEASES] << self.replace

    def created(self, request: kmock_lib.Request) -> dict[str, Any]:
        stored = self.kmock.objects[LEASES, request.namespace or NS, request.data["metadata"]["name"]]
        stored.patch({"metadata": {"resourceVersion": str(next(self.revision))}})
        return copy.deepcopy(dict(stored.raw))

    def replace(self, request: kmock_lib.Request) -> dict[str, Any]:
        key = (LEASES, request.namespace, request.name)
        if key not in self.kmock.objects or self.kmock.objects[key].deleted:
            raise kmock_lib.KubernetesError(
                status=404, reason="NotFound", message=f'leases "{request.name}" not found'
            )
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != self.kmock.objects[key]["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise kmock_lib.KubernetesError(
                status=409,
                reason="Conflict",
                message=f'Operation cannot be fulfilled on leases.coordination.k8s.io "{request.name}": '
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        body = copy.deepcopy(request.data)
        body["metadata"]["resourceVersion"] = str(next(self.revision))
        self.kmock.objects[key] = body
        return body

    def lease(self) -> dict[str, Any]:
        return dict(self.kmock.objects[LEASES, NS, NAME].raw)


def api_for(kmock: Any) -> CoordinationV1Api:
    configuration = kubernetes.client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    return CoordinationV1Api(kubernetes.client.ApiClient(configuration))


def elector(kmock: Any, identity: str, clock: Clock, **config: Any) -> LeaseElector:
    settings = LeaseConfig(
        identity=identity, address=f"http://{identity}:8080", name=NAME, namespace=NS, **config
    )
    return LeaseElector(settings, api=api_for(kmock), monotonic=clock)


async def round_of(e: LeaseElector) -> bool:
    return await asyncio.to_thread(e.try_acquire_or_renew)


@pytest.mark.asyncio
async def test_the_first_replica_creates_the_lease_and_leads(kmock: Any) -> None:
    store = LeaseStore(kmock)
    a = elector(kmock, "ctl-a", Clock())
    assert isinstance(a, LeaderElector)
    assert not a.is_leader() and a.fence() is None
    assert await round_of(a)
    lease = store.lease()
    spec = lease["spec"]
    assert spec["holderIdentity"] == "ctl-a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == spec["renewTime"]
    assert spec["renewTime"].endswith("Z") or spec["renewTime"].endswith("+00:00")
    assert "." in spec["renewTime"]  # MicroTime: six fractional digits, always
    assert lease["metadata"]["annotations"] == {ADDRESS_ANNOTATION: "http://ctl-a:8080"}
    assert a.is_leader() and a.fence() == 0 and a.leader_address() == "http://ctl-a:8080"


@pytest.mark.asyncio
async def test_a_second_replica_follows_a_live_lease_and_names_the_leader(kmock: Any) -> None:
    LeaseStore(kmock)
    a, b = elector(kmock, "ctl-a", Clock()), elector(kmock, "ctl-b", Clock())
    assert await round_of(a)
    assert not await round_of(b)
    assert not b.is_leader() and b.fence() is None
    assert b.leader_address() == "http://ctl-a:8080"


@pytest.mark.asyncio
async def test_renewing_keeps_the_acquire_time_and_the_fencing_token(kmock: Any) -> None:
    store = LeaseStore(kmock)
    clock = Clock()
    a = elector(kmock, "ctl-a", clock)
    await round_of(a)
    first = store.lease()
    clock.advance(3)
    assert await round_of(a)
    second = store.lease()
    assert second["spec"]["acquireTime"] == first["spec"]["acquireTime"]
    assert second["spec"]["renewTime"] != first["spec"]["renewTime"]
    assert second["spec"]["leaseTransitions"] == 0 and a.fence() == 0
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])


@pytest.mark.asyncio
async def test_a_lease_not_renewed_for_its_duration_passes_to_a_follower(kmock: Any) -> None:
    store = LeaseStore(kmock)
    clock_a, clock_b = Clock(), Clock(50_000.0)  # the replicas' clocks need not agree
    a, b = elector(kmock, "ctl-a", clock_a), elector(kmock, "ctl-b", clock_b)
    await round_of(a)
    assert not await round_of(b)  # b first sees this version of the record now
    clock_a.advance(14.9)
    clock_b.advance(14.9)
    assert not await round_of(b)  # a stopped renewing, but 15 s have not passed on b's clock
    assert not a.is_leader()  # a's renew deadline (10 s) passed long ago
    clock_b.advance(0.2)
    assert await round_of(b)
    assert b.is_leader() and b.fence() == 1
    assert store.lease()["spec"]["holderIdentity"] == "ctl-b"
    assert store.lease()["spec"]["leaseTransitions"] == 1
    assert not await round_of(a)  # a wakes up: b holds a live lease
    assert a.fence() is None and a.leader_address() == "http://ctl-b:8080"


@pytest.mark.asyncio
async def test_a_paused_leader_stops_leading_before_anyone_can_take_over(kmock: Any) -> None:
    LeaseStore(kmock)
    clock = Clock()
    a = elector(kmock, "ctl-a", clock)
    await round_of(a)
    clock.advance(9.9)
    assert a.is_leader() and a.fence() == 0
    clock.advance(0.2)  # SIGSTOP past the renew deadline: 10 s < the 15 s a follower waits
    assert not a.is_leader() and a.fence() is None
    assert await round_of(a)  # nobody took it meanwhile: a renews, with the same token
    assert a.is_leader() and a.fence() == 0


@pytest.mark.asyncio
async def test_two_replicas_racing_for_a_free_lease_one_wins_by_resource_version(kmock: Any) -> None:
    store = LeaseStore(kmock)
    old = elector(kmock, "ctl-old", Clock())
    await round_of(old)
    await asyncio.to_thread(old.resign)
    a, b = elector(kmock, "ctl-a", Clock()), elector(kmock, "ctl-b", Clock())
    b_api = b._api

    class ReadThenLetARun:
        """b's reads go to the server; right after b's read, a runs a whole round."""

        def __getattr__(self, name: str) -> Callable[..., Any]:
            return getattr(b_api, name)  # type: ignore[no-any-return]

        def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            seen = b_api.read_namespaced_lease(*args, **kwargs)
            assert a.try_acquire_or_renew()
            return seen

    b._api = ReadThenLetARun()  # type: ignore[assignment]
    assert not await round_of(b)
    assert store.conflicts == 1
    assert a.is_leader() and not b.is_leader()
    assert store.lease()["spec"]["holderIdentity"] == "ctl-a"
    assert store.lease()["spec"]["leaseTransitions"] == 1  # one acquisition, not two


@pytest.mark.asyncio
async def test_two_replicas_creating_the_lease_at_once_one_gets_409(kmock: Any) -> None:
    store = LeaseStore(kmock)
    a, b = elector(kmock, "ctl-a", Clock()), elector(kmock, "ctl-b", Clock())
    b_api = b._api

    class CreateAfterA:
        def __getattr__(self, name: str) -> Callable[..., Any]:
            return getattr(b_api, name)  # type: ignore[no-any-return]

        def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            assert a.try_acquire_or_renew()  # a's create lands between b's 404 and b's create
            return b_api.create_namespaced_lease(*args, **kwargs)

    b._api = CreateAfterA()  # type: ignore[assignment]
    assert not await round_of(b)
    assert a.is_leader() and not b.is_leader()
    assert store.lease()["spec"]["holderIdentity"] == "ctl-a"


@pytest.mark.asyncio
async def test_resigning_clears_the_holder_so_a_follower_takes_over_at_once(kmock: Any) -> None:
    store = LeaseStore(kmock)
    a, b = elector(kmock, "ctl-a", Clock()), elector(kmock, "ctl-b", Clock())
    await round_of(a)
    assert not await round_of(b)
    await asyncio.to_thread(a.resign)
    assert not a.is_leader()
    assert "holderIdentity" not in store.lease()["spec"] or store.lease()["spec"]["holderIdentity"] is None
    assert b.leader_address() == "http://ctl-a:8080"  # b has not looked again yet
    assert await round_of(b)  # no waiting out the lease
    assert b.fence() == 1


@pytest.mark.asyncio
async def test_a_restarted_replica_with_the_same_name_counts_as_a_new_leader(kmock: Any) -> None:
    store = LeaseStore(kmock)
    before = elector(kmock, "ctl-a", Clock())
    await round_of(before)
    after = elector(kmock, "ctl-a", Clock())  # same pod name, fresh memory
    assert await round_of(after)
    assert after.fence() == 1  # writes still in flight from the previous life are fenced out
    assert store.lease()["spec"]["leaseTransitions"] == 1


@pytest.mark.asyncio
async def test_a_recreated_lease_continues_above_the_highest_count_seen(kmock: Any) -> None:
    store = LeaseStore(kmock)
    a, b = elector(kmock, "ctl-a", Clock()), elector(kmock, "ctl-b", Clock())
    await round_of(a)
    await asyncio.to_thread(a.resign)
    await round_of(b)
    await asyncio.to_thread(b.resign)
    assert store.lease()["spec"]["leaseTransitions"] == 1
    del kmock.objects[LEASES, NS, NAME]  # an operator deletes the Lease
    assert await round_of(b)
    assert b.fence() == 2


@pytest.mark.asyncio
async def test_server_errors_leave_leadership_to_lapse_by_itself(kmock: Any) -> None:
    LeaseStore(kmock)
    clock = Clock()
    a = elector(kmock, "ctl-a", clock)
    await round_of(a)
    real = a._api

    class Failing:
        def __getattr__(self, name: str) -> Callable[..., Any]:
            return getattr(real, name)  # type: ignore[no-any-return]

        def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
            raise ApiException(status=500, reason="Internal Server Error")

    a._api = Failing()  # type: ignore[assignment]
    clock.advance(3)
    assert await round_of(a)  # still within the deadline of the last successful round
    clock.advance(7.5)
    assert not await round_of(a) and not a.is_leader()


@pytest.mark.asyncio
async def test_run_leads_until_stopped_then_resigns(kmock: Any) -> None:
    store = LeaseStore(kmock)
    config = LeaseConfig(identity="ctl-a", name=NAME, namespace=NS, lease_duration_s=3, renew_interval_s=0.2)
    a = LeaseElector(config, api=api_for(kmock))
    stop = threading.Event()
    runner = asyncio.create_task(asyncio.to_thread(a.run, stop))
    for _ in range(200):
        if a.is_leader():
            break
        await asyncio.sleep(0.05)
    assert a.is_leader()
    renewed = store.lease()["metadata"]["resourceVersion"]
    for _ in range(200):  # renewals keep coming
        if store.lease()["metadata"]["resourceVersion"] != renewed:
            break
        await asyncio.sleep(0.05)
    assert store.lease()["metadata"]["resourceVersion"] != renewed
    stop.set()
    await asyncio.wait_for(runner, timeout=10)
    assert not a.is_leader()
    assert not store.lease()["spec"].get("holderIdentity")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"identity": ""}, "identity is empty"),
        ({"identity": "a", "lease_duration_s": 1}, "lease_duration_s must be at least 2"),
        ({"identity": "a", "renew_deadline_s": 15}, "renew_deadline_s must be below lease_duration_s"),
        ({"identity": "a", "renew_interval_s": 12}, "renew_interval_s must be below the renew deadline"),
    ],
)
def test_config_refuses_bad_timings_naming_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeaseConfig(**config)
