"""Benchmark: KubeStore writes at fleet scale against the ConfigMap stand-in; prints JSON.

    python -m tests.controller.bench_kube_store --targets 100000

A first save (every part), then a save that moves one target of the fleet: its requests,
bytes sent and time show that a delta writes in proportion to the change, not the fleet.
The API server here is ``federation/testing/standins/kube.py`` in-process, so times are the client's
encoding plus loopback HTTP, not a real API server's.
"""

from __future__ import annotations

import argparse
import json
import time

from federation.controller.base.state import ControllerState
from federation.testing.standins.kube import FakeKubeAPI, configmap_bytes
from tests.controller.ha_helpers import assignment
from tests.controller.store_backends import kube_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, default=100_000)
    args = parser.parse_args()
    base = assignment(args.targets, shards=16)
    state = ControllerState(assignment=base, assignment_version=1)
    with FakeKubeAPI() as fake:
        store = kube_store(fake)
        out: dict[str, object] = {"targets": args.targets}
        first = next(iter(base.targets))
        for phase, saved_state, expected in (("first", state, None), ("delta", None, 1)):
            if saved_state is None:  # move one target to another shard
                moved = dict(base.targets)
                moved[first] = "r1-15" if moved[first] != "r1-15" else "r1-0"
                saved_state = state.model_copy(
                    update={"assignment": base.model_copy(update={"targets": moved})}
                )
            writes_before = sum(1 for r in fake.requests if r.startswith(("POST", "PUT")))
            started = time.perf_counter()
            hint = None if expected is None else (base, {first})  # what the controller passes
            store.save(saved_state, expected_revision=expected, changed=hint)
            elapsed = time.perf_counter() - started
            writes = sum(1 for r in fake.requests if r.startswith(("POST", "PUT"))) - writes_before
            out[phase] = {"seconds": round(elapsed, 3), "writes": writes}
        objects = [o for (p, _, _), o in fake.objects.items() if p == "configmaps"]
        out["objects"] = len(objects)
        out["largest_object_bytes"] = max(configmap_bytes(o) for o in objects)
        started = time.perf_counter()
        loaded = kube_store(fake).load()
        out["load_seconds"] = round(time.perf_counter() - started, 3)
        assert loaded is not None and loaded.assignment is not None
        assert len(loaded.assignment.targets) == args.targets
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
