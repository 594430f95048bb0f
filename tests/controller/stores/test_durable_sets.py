"""What the controller stores with each change, on the shared stores: a step's set changes
commit with its state, and a registry deletion is stored before it is answered with 204."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from federation.controller.base.options import ControllerOptions
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StateStore
from federation.testing.standins.consul.agent import FakeConsulAgent
from federation.testing.standins.kube import FakeKubeAPI
from tests.controller.ha_helpers import store as consul_store
from tests.controller.harness import TOKEN, write_spec
from tests.controller.store_backends import kube_store

BODY = {"address": "10.9.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r1", "gpus": 8}
IDENTITY = "10.9.0.1:9400"


def serve(tmp_path: Path, store: StateStore) -> Service:
    settings = ServeSettings(
        spec=write_spec(tmp_path / "spec.yaml"), data_dir=tmp_path / "data", check_configs=False,
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0), env={"GPUFED_TOKEN": TOKEN},
    )  # fmt: skip
    service = build_service(settings, store=store)
    service.controller.restore()
    return service


async def call(service: Service, method: str, path: str, **kwargs: object) -> httpx.Response:
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ctl") as client:
        return await client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"}, **kwargs)


def registered(store: StateStore) -> set[str]:
    return {t.identity for t in store.load_sets().get("registry", [])}


@pytest.mark.parametrize("backend", ["sqlite", "consul", "kubernetes"])
def test_a_registration_commits_its_set_and_a_deletion_is_stored_before_204(
    tmp_path: Path, backend: str
) -> None:
    with FakeConsulAgent() as agent, FakeKubeAPI() as fake:

        def open_store() -> StateStore:
            if backend == "sqlite":
                return SqliteStore(tmp_path / "state.db")
            return consul_store(agent) if backend == "consul" else kube_store(fake)

        service = serve(tmp_path, open_store())
        assert asyncio.run(
            call(service, "PUT", f"/v1/registry/targets/{IDENTITY}", json=BODY)
        ).status_code in (
            200,
            201,
        )
        step = service.controller.tick(idle=False)
        assert step is not None and IDENTITY in step.assignment.targets
        assert IDENTITY in registered(open_store())  # committed with the state, not later
        assert service.controller.store.load() is not None
        answer = asyncio.run(call(service, "DELETE", f"/v1/registry/targets/{IDENTITY}"))
        assert answer.status_code == 204
        assert IDENTITY not in registered(open_store())  # a kill -9 now would not bring it back
        service.stop()
