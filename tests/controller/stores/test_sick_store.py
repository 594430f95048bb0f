"""Reads never wait on a sick store (issue 38, item 5): the Kubernetes API stand-in frozen.

Writes that wait on the store hold at most the write gate's slots; list reads and a cached
audit page still answer (each read is given 2 s, the done-when bound), writes past the
gate are refused at once, and ``/readyz`` turns 503 naming the store until it answers again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from federation.controller.base.options import ControllerOptions
from federation.controller.http.service import ServeSettings, build_service
from federation.controller.stores import store_watch
from federation.testing.standins.kube import FakeKubeAPI
from tests.controller.harness import TOKEN, ControllerHarness, write_spec
from tests.controller.store_backends import kube_store

WRITES = 45
READS = ("/v1/targets?limit=1000", "/v1/shards", "/v1/status", "/v1/registry/targets", "/v1/audit?limit=50")


def _harness(tmp_path: Path, fake: FakeKubeAPI) -> ControllerHarness:
    settings = ServeSettings(
        spec=write_spec(tmp_path / "spec.yaml"),
        data_dir=tmp_path / "data",
        check_configs=False,
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0, read_rate=0),
        env={"GPUFED_TOKEN": TOKEN},
        store_stall_s=0.5,
    )
    service = build_service(settings, store=kube_store(fake))
    service.controller.restore()
    return ControllerHarness(service=service)


@pytest.mark.asyncio
async def test_with_the_kubernetes_api_frozen_reads_answer_and_readyz_says_so(tmp_path: Path) -> None:
    with FakeKubeAPI() as fake:
        h = _harness(tmp_path, fake)
        entries = [
            {"address": f"10.5.0.{i}", "port": 9400, "job": "gpu", "node": f"s-{i:03d}", "region": "r1"}
            for i in range(1, WRITES + 1)
        ]
        async with h.client() as client:
            put = await client.post("/v1/registry/batch", json={"put": entries}, headers=h.auth())
            assert put.status_code == 200, put.text
            h.tick()
            assert (await client.get("/readyz")).json()["store"]["answering"] is True
            warm = await client.get("/v1/audit?limit=50")
            assert warm.status_code == 200
            fake.freeze()
            deletes = [
                asyncio.create_task(client.delete(f"/v1/registry/targets/10.5.0.{i}:9400", headers=h.auth()))
                for i in range(1, WRITES + 1)
            ]
            await asyncio.sleep(0)  # the deletes are in; some hold a worker on the frozen store
            bounded = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=h.service.app), base_url="http://ctl", timeout=2.0
            )
            async with bounded:
                answers = await asyncio.gather(*(bounded.get(path) for path in READS * 3))
                assert [a.status_code for a in answers] == [200] * len(answers)
                assert answers[-1].json() == warm.json()  # the audit page, kept for this revision

                async def not_ready() -> dict[str, object] | None:
                    body = (await bounded.get("/readyz")).json()
                    return body if body["ready"] is False else None

                for _ in range(200):  # polls; the store stalls after 0.5 s of no answer
                    report = await not_ready()
                    if report is not None:
                        break
                    await asyncio.sleep(0.05)
                assert report is not None and report["store"]["answering"] is False  # type: ignore[index]
                refused = await bounded.delete("/v1/registry/targets/10.5.0.1:9400", headers=h.auth())
                assert refused.status_code == 503 and "not answered" in refused.json()["detail"]
                for _ in range(400):  # writes past the gate are refused while the held ones wait
                    if sum(d.done() for d in deletes) >= WRITES - store_watch.WRITE_SLOTS:
                        break
                    await asyncio.sleep(0.05)
                assert not all(d.done() for d in deletes)  # the gate's slots still wait on the store
            fake.thaw()
            codes = [(await d).status_code for d in deletes]
            held = codes.count(204)
            assert 0 < held <= store_watch.WRITE_SLOTS  # only the gate's slots waited on the store
            assert codes.count(503) == WRITES - held
            for _ in range(600):  # the store answers again: ready again
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await client.get("/readyz")).json()["store"]["answering"] is True
        h.service.stop()


def test_a_non_numeric_revision_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``state.revision = 'x'`` in the shared store: ``gpufed serve`` prints ``error: ...`` on one
    line (pydantic's own message spans several)."""
    from federation.controller.stores import kube_parts
    from federation.controller.stores.store import StoreError
    from tests.controller.ha_helpers import state

    with FakeKubeAPI() as fake:
        kube_store(fake).save(state(), expected_revision=None)
        real = kube_parts.join_state
        monkeypatch.setattr(kube_parts, "join_state", lambda parts: {**real(parts), "revision": "x"})
        with pytest.raises(StoreError) as refused:
            kube_store(fake).load()
    message = str(refused.value)
    assert "\n" not in message and "revision" in message and "does not validate" in message
