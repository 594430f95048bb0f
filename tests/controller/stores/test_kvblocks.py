"""Placement blocks: a delta update equals splitting the new assignment afresh."""

from __future__ import annotations

import random

import pytest

from federation.controller.stores import kvblocks
from sharder.engine.assignment import ShardInfo
from tests.controller.ha_helpers import assignment


@pytest.mark.parametrize("seed", range(20))
def test_updating_blocks_with_the_touched_identities_equals_a_fresh_split(seed: int) -> None:
    rng = random.Random(seed)
    base = assignment(300, shards=5)
    targets, weights = dict(base.targets), dict(base.weights)
    shards = dict(base.shards)
    if seed % 3 == 0:  # a shard added, another emptied and removed
        shards["r1-5"] = ShardInfo(region="r1", index=5)
        for identity, shard in targets.items():
            if shard == "r1-4":
                targets[identity] = "r1-5"
        del shards["r1-4"]
    touched = {i for i in base.targets if base.targets[i] != targets[i]}
    for identity in rng.sample(sorted(targets), 30):
        touched.add(identity)
        roll = rng.random()
        if roll < 0.3:
            del targets[identity], weights[identity]
        elif roll < 0.6:
            targets[identity] = rng.choice(sorted(shards))
        else:
            weights[identity] = rng.randint(1, 8)
    for n in range(10):  # new targets
        identity = f"new-{seed}-{n}:9400"
        targets[identity], weights[identity] = rng.choice(sorted(shards)), 1
        touched.add(identity)
    new = base.model_copy(update={"targets": targets, "weights": weights, "shards": shards})
    before = kvblocks.split(base)
    kept = {shard: dict(members) for shard, members in before.items()}
    updated, dirty = kvblocks.update(before, base, new, touched)
    assert updated == kvblocks.split(new)
    assert before == kept  # the stored blocks are left as they were (a lost write changes nothing)
    assert {s for s in updated if updated[s] is not before.get(s)} <= dirty
    assert kvblocks.assemble(updated) == (new.targets, new.weights)


def test_a_malformed_descriptor_or_block_is_named() -> None:
    with pytest.raises(kvblocks.BlockError, match="not a block descriptor"):
        kvblocks.head_of([1, "d", 2])
    with pytest.raises(kvblocks.BlockError, match="identity -> weight"):
        kvblocks.members_of(b'{"a": "x"}')
