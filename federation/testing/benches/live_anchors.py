"""The engine's own figures on the fleet ``gpufed bench live`` served: the anchors its
end-to-end times are read against (what one change and one full placement cost in-process,
without HTTP, the state store or SD publication)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from federation.spec import load_gpufed_spec
from sharder.engine.assigning import assign
from sharder.engine.incremental import IncrementalAssigner
from sharder.kernel.errors import InventoryError
from sharder.model.inventory import Target
from sharder.model.loading import parse_inventory, read_document

REPEATS = 5


def engine_anchors(spec_path: Path, inventory_path: Path) -> dict[str, float | int]:
    """``engine_full_assign_s`` (one ``assign``) and ``engine_incremental_change_s`` (median of
    ``REPEATS`` single registrations through ``IncrementalAssigner``) on the same targets."""
    spec = load_gpufed_spec(spec_path)
    jobs = {job.name: job for job in spec.jobs}
    targets = parse_inventory(read_document(inventory_path, error_cls=InventoryError),
                              source=str(inventory_path), jobs=jobs)  # fmt: skip
    started = time.perf_counter()
    assign(spec, targets)
    full = time.perf_counter() - started
    engine = IncrementalAssigner(spec, targets)
    changes = []
    for k in range(REPEATS):
        region = spec.regions[k % len(spec.regions)].name
        newcomer = Target.model_validate({"address": f"10.251.0.{k + 1}", "port": 9400, "job": "gpu",
                                          "node": f"anchor-{k}", "region": region, "gpus": 8})  # fmt: skip
        started = time.perf_counter()
        engine.apply(added=[newcomer])
        changes.append(time.perf_counter() - started)
    return {
        "engine_full_assign_s": round(full, 4),
        "engine_incremental_change_s": round(statistics.median(changes), 6),
        "engine_incremental_fallbacks": int(engine.fallbacks),
    }
