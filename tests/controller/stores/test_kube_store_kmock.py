"""KubeStore against kmock (an aiohttp emulator of the API, a stand-in), as the Lease is.

kmock serves GET, POST (409 on an existing name), DELETE and LIST of ConfigMaps to the
official client. What it lacks is scripted here the way ``test_lease`` scripts it for
Leases: a resourceVersion stamped on every write and PUT answering 409 ``Conflict`` when
the body's resourceVersion is not the stored one. The same store then passes the core of
the contract (tests/controller/stores/test_store_contract.py runs all of it on
federation/testing/standins/kube.py).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

import kmock as kmock_lib
import kubernetes
import pytest

from federation.controller.base.state import AuditEntry
from federation.controller.stores.kube_store import KubeStore
from federation.controller.stores.store import FencedOut, StoreConflict, StoreError
from tests.controller.ha_helpers import state

CONFIGMAPS = kmock_lib.resource("", "v1", "configmaps")
NS = "monitoring"


class ConfigMapLock:
    """What kmock lacks for ConfigMaps: resourceVersion on every write, PUT with its 409."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.revision = itertools.count(100)
        kmock["create", CONFIGMAPS] << self.created
        kmock["put", CONFIGMAPS] << self.replace

    def created(self, request: kmock_lib.Request) -> dict[str, Any]:
        stored = self.kmock.objects[CONFIGMAPS, request.namespace or NS, request.data["metadata"]["name"]]
        stored.patch({"metadata": {"resourceVersion": str(next(self.revision))}})
        return copy.deepcopy(dict(stored.raw))

    def replace(self, request: kmock_lib.Request) -> dict[str, Any]:
        key = (CONFIGMAPS, request.namespace, request.name)
        if key not in self.kmock.objects or self.kmock.objects[key].deleted:
            raise kmock_lib.KubernetesError(
                status=404, reason="NotFound", message=f'configmaps "{request.name}" not found'
            )
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != self.kmock.objects[key]["metadata"]["resourceVersion"]:
            raise kmock_lib.KubernetesError(
                status=409, reason="Conflict",
                message=f'Operation cannot be fulfilled on configmaps "{request.name}": modified meanwhile',
            )  # fmt: skip
        body = copy.deepcopy(request.data)
        body["metadata"]["resourceVersion"] = str(next(self.revision))
        self.kmock.objects[key] = body
        return body


def store_for(kmock: Any) -> KubeStore:
    configuration = kubernetes.client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    return KubeStore(kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration)), namespace=NS)


@pytest.mark.asyncio
async def test_save_load_conflict_and_fencing_on_kmock(kmock: Any) -> None:
    ConfigMapLock(kmock)
    a, b = store_for(kmock), store_for(kmock)
    assert await asyncio.to_thread(a.load) is None
    audit = AuditEntry(at=1.0, actor="ops", action="first")
    first = await asyncio.to_thread(
        lambda: a.save(state(30_000), expected_revision=None, audit=audit, fence=3)
    )
    assert await asyncio.to_thread(b.load) == first  # a second replica reads every part back
    second = await asyncio.to_thread(lambda: b.save(first, expected_revision=1, fence=4))
    with pytest.raises(StoreConflict) as lost:
        await asyncio.to_thread(lambda: a.save(first, expected_revision=1, fence=4))
    assert lost.value.found == 2
    with pytest.raises(FencedOut):
        await asyncio.to_thread(lambda: a.save(second, expected_revision=2, fence=3))
    assert await asyncio.to_thread(store_for(kmock).load) == second
    assert [e.action for e in await asyncio.to_thread(store_for(kmock).audit_log)] == ["first"]


@pytest.mark.asyncio
async def test_a_deleted_head_is_refused_on_kmock_and_init_starts_empty(kmock: Any) -> None:
    """Issue 29: with the head ConfigMap deleted the store no longer starts silently as a
    fresh one (revision 2 -> 1); ``--init`` is the way out."""
    ConfigMapLock(kmock)
    a = store_for(kmock)
    first = await asyncio.to_thread(
        lambda: a.save(state(100), expected_revision=None, audit=AuditEntry(at=1.0, actor="o", action="a"))
    )
    await asyncio.to_thread(lambda: a.save(first, expected_revision=1))
    kmock.objects[CONFIGMAPS, NS, "gpufed-state"].delete()
    with pytest.raises(StoreError, match=r"head gpufed-state is missing.*--init"):
        await asyncio.to_thread(store_for(kmock).load)
    fresh = store_for(kmock)
    fresh.init = True
    assert await asyncio.to_thread(fresh.load) is None
