"""Input hygiene (issue 29, item 6): labels are UTF-8, sized regions have a shard cap, a
batch compares normalised identities, strings are not ints, and a request framed twice
(Content-Length and Transfer-Encoding) closes its connection."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.controller.base.options import ControllerOptions
from federation.controller.http.http_guards import DeadlineH11Protocol
from federation.spec import load_gpufed_spec
from federation.testing.harnesses.app_server import AppServer
from sharder.engine.sizing import Hysteresis
from tests.controller.harness import ControllerHarness, build, fleet, spec_document


def entry(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "address": f"10.8.{i // 250}.{i % 250 + 1}",
        "port": 9400,
        "job": "gpu",
        "node": f"h-{i}",
        "region": "r1",
    } | extra


@pytest.mark.asyncio
async def test_a_label_with_a_lone_surrogate_is_422_and_reads_keep_working(
    harness: ControllerHarness,
) -> None:
    body = (
        '{"address": "10.8.0.1", "port": 9400, "job": "gpu", "node": "h-0", "region": "r1", '
        '"labels": {"a": "\\udfff"}}'
    )
    async with harness.client() as client:
        put = await client.put(
            "/v1/registry/targets/10.8.0.1:9400",
            content=body,
            headers={**harness.auth(), "Content-Type": "application/json"},
        )
        assert put.status_code == 422, put.text
        assert "UTF-8" in put.json()["detail"]
        node = body.replace('"h-0"', '"h-\\ud800x"').replace('{"a": "\\udfff"}', "{}")
        put = await client.put(
            "/v1/registry/targets/10.8.0.1:9400",
            content=node,
            headers={**harness.auth(), "Content-Type": "application/json"},
        )
        assert put.status_code == 422, put.text
        batch = '{"put": [' + body + '], "delete": ["\\udfff:9400"]}'
        refused = await client.post(
            "/v1/registry/batch",
            content=batch,
            headers={**harness.auth(), "Content-Type": "application/json"},
        )
        assert refused.status_code == 422, refused.text
        harness.tick()
        assert (await client.get("/v1/registry/targets", headers=harness.auth())).status_code == 200
        assert (await client.get("/v1/targets", headers=harness.auth())).status_code == 200


@pytest.mark.asyncio
async def test_a_port_given_as_a_string_is_refused(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        put = await client.put(
            "/v1/registry/targets/10.8.0.1:9400", json=entry(0, port="9400"), headers=harness.auth()
        )
        assert put.status_code == 422
        assert "expected an integer, got a string" in put.json()["detail"]
        gpus = await client.put(
            "/v1/registry/targets/10.8.0.1:9400", json=entry(0, gpus="8"), headers=harness.auth()
        )
        assert gpus.status_code == 422


@pytest.mark.asyncio
async def test_a_batch_compares_identities_in_their_normalised_form(harness: ControllerHarness) -> None:
    async with harness.client() as client:
        for put, spelled in (
            (entry(0, address="GPU-7.Example"), "gpu-7.example:9400"),
            (entry(1, address="gpu-8.example"), "GPU-8.EXAMPLE:9400"),
            (entry(2, address="10.8.0.3"), "[::ffff:10.8.0.3]:9400"),
        ):
            answer = await client.post(
                "/v1/registry/batch", json={"put": [put], "delete": [spelled]}, headers=harness.auth()
            )
            assert answer.status_code == 422, (spelled, answer.text)
            assert "both put and deleted" in answer.text


def test_a_sized_region_stops_at_its_shard_cap(tmp_path: Path) -> None:
    """targets_per_shard 2 and a cap of 3 shards: 6 nodes fit, a seventh is refused with 429;
    nodes from another source overfill the shards instead of growing the topology."""
    import asyncio

    document = spec_document()
    document["regions"] = [{"name": "r1"}, {"name": "r2", "shards": 1}]
    document["sharding"]["targets_per_shard"] = 2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    spec = load_gpufed_spec(tmp_path / "spec.yaml")
    options = ControllerOptions(debounce_s=0.0, grace_s=0.0, hysteresis=Hysteresis(max_shards=3))
    h = build(tmp_path, spec=spec, options=options)

    async def run() -> None:
        async with h.client() as client:
            batch = await client.post(
                "/v1/registry/batch", json={"put": [entry(i) for i in range(6)]}, headers=h.auth()
            )
            assert batch.status_code == 200, batch.text
            h.tick()
            again = await client.put(
                f"/v1/registry/targets/{entry(0)['address']}:9400", json=entry(0), headers=h.auth()
            )
            assert again.status_code == 200  # a known node refreshes
            more = await client.put(
                f"/v1/registry/targets/{entry(6)['address']}:9400", json=entry(6), headers=h.auth()
            )
            assert more.status_code == 429, more.text
            assert "cap of 3 shards" in more.json()["detail"] and more.headers["retry-after"]
            # It names the setting and the value that would fit: 7 nodes of 2 per shard.
            assert "--max-shards-per-region=4 would fit" in more.json()["detail"]
            big = await client.post(
                "/v1/registry/batch", json={"put": [entry(i) for i in range(6, 20)]}, headers=h.auth()
            )
            assert big.status_code == 429
            assert "--max-shards-per-region=10 would fit" in big.json()["detail"]

    asyncio.run(run())
    h.feed(fleet(40, region="r1", start=500), source="file")
    shards = [s for s, i in h.controller.state.assignment.shards.items() if i.region == "r1"]
    assert len(shards) == 3


class _Quick(DeadlineH11Protocol):
    header_timeout_s = 2.0


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[int, ControllerHarness]]:
    h = build(tmp_path)
    h.feed(fleet(2, region="r1"))
    with AppServer(h.service.app, http=_Quick, log_level="error") as served:
        yield served.port, h


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    sock.settimeout(3)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        data += b"<still open>"
    return data


def test_content_length_with_transfer_encoding_closes_the_connection(
    live: tuple[int, ControllerHarness],
) -> None:
    port, _ = live
    smuggled = (
        b"POST /v1/plan HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(smuggled)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert answer.count(b"HTTP/1.1 ") == 1 and not answer.endswith(b"<still open>"), answer
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # the server still serves
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")
