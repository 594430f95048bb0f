"""Issue 40: 300,000 targets (150,000 nodes, a gpu and a node target each) on the shipped
example spec (12 nodes a child). The controller's shard cap takes its default from the spec's
``fleet:`` (``federation.sizing.model.default_shard_cap``, as ``gpufed serve`` does without
``--max-shards-per-region``): stated, they register; not stated, the registry's 429 names the
setting and the value that fits. Through the real app, over its HTTP API.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.controller.base.options import ControllerOptions
from federation.sizing.costs import load_costs
from federation.sizing.model import default_shard_cap
from federation.spec import load_gpufed_spec
from sharder.engine.sizing import Hysteresis
from tests.controller.harness import build

NODES = 150_000
EXAMPLE = Path("examples/federation.yaml")
#: Two batches (under the 16 MiB body limit): 25,000 nodes a region each, past the generic
#: cap's 24,000 (2,000 shards of 12) already, so the first is refused without a stated fleet.
BATCH = 150_000


def entries(i: int, region: str) -> list[dict[str, Any]]:
    address = f"10.{i // 62_500}.{i // 250 % 250}.{i % 250 + 1}"
    node = {"address": address, "node": f"gpu-{i}", "region": region}
    return [node | {"port": 9400, "job": "gpu"}, node | {"port": 9100, "job": "node"}]


@pytest.mark.slow
@pytest.mark.parametrize("stated", [True, False])
def test_300000_targets_register_or_are_told_the_cap_that_fits(tmp_path: Path, stated: bool) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    if stated:
        document["fleet"] = {"nodes": NODES}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    spec = load_gpufed_spec(tmp_path / "spec.yaml")
    cap = default_shard_cap(spec, load_costs())
    assert (cap > Hysteresis().max_shards) is stated
    options = ControllerOptions(
        debounce_s=0.0, grace_s=0.0, registry_rate=0.0, hysteresis=Hysteresis(max_shards=cap)
    )
    h = build(tmp_path / "ctl", spec=spec, options=options)
    regions = spec.region_names()
    targets = [e for i in range(NODES) for e in entries(i, regions[i % len(regions)])]
    per_region_nodes = NODES // len(regions)
    fits = -(-per_region_nodes // spec.sharding.targets_per_shard)

    async def run() -> list[tuple[int, str]]:
        answers = []
        async with h.client() as client:
            for start in range(0, len(targets), BATCH):
                answer = await client.post(
                    "/v1/registry/batch", json={"put": targets[start : start + BATCH]}, headers=h.auth()
                )
                answers.append((answer.status_code, answer.text))
                if start + BATCH < len(targets):
                    h.tick()  # the cap counts the nodes placed before a batch and the batch's new ones
        return answers

    answers = asyncio.run(run())
    if stated:
        assert all(code == 200 for code, _ in answers), answers[:1]
    else:
        refused = [text for code, text in answers if code == 429]
        assert refused, [code for code, _ in answers]
        assert "--max-shards-per-region=" in refused[0] and "would fit" in refused[0], refused[0]
        named = int(refused[0].split("--max-shards-per-region=")[1].split()[0])
        assert Hysteresis().max_shards < named <= fits, (named, fits)
