"""Seed 002's sizing table as data, and the model's figures beside it per fleet size. Pure.

The seed file is not in this repository. Issue #40 quotes its table as: "Seed 002 ends with
a sizing table: children per fleet size at 8C16G or 16C32G, a master from 16C32G to
64C128G, 2-4 Grafana replicas with a load balancer", at the fleet sizes 50, 200, 500, 1,000
and 5,000 nodes. Those words are all that is encoded here: which machine the seed gives at
which size is not quoted, so each row carries the seed's whole range, and the comparison
says how far the model's figure sits from the seed's smallest machine. ``gpufed size
--compare`` prints it; docs/sizing.md says where and why the two differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from federation.sizing.costs import LineCosts
from federation.sizing.model import Fleet, size
from federation.spec import GpufedSpec


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_gib: int

    def __str__(self) -> str:
        return f"{self.cores}C{self.memory_gib}G"


@dataclass(frozen=True)
class SeedTable:
    """What issue #40 quotes of seed 002's table."""

    sizes: tuple[int, ...]
    child_machines: tuple[Machine, ...]
    master_smallest: Machine
    master_largest: Machine
    grafana_replicas: tuple[int, int]
    grafana_behind: str


SEED_002 = SeedTable(
    sizes=(50, 200, 500, 1000, 5000),
    child_machines=(Machine(8, 16), Machine(16, 32)),
    master_smallest=Machine(16, 32),
    master_largest=Machine(64, 128),
    grafana_replicas=(2, 4),
    grafana_behind="a load balancer",
)


def compare(spec: GpufedSpec, costs: dict[str, LineCosts], *, template: Fleet) -> list[dict[str, Any]]:
    """One row per seed fleet size: the model's children and master next to the seed's machines.

    ``template`` gives the GPUs, pods per GPU and HAMi of every size. Shares are the model's
    request over the seed's smallest machine of that kind (memory and cores).
    """
    seed, rows = SEED_002, []
    for nodes in seed.sizes:
        s = size(spec, Fleet(nodes=nodes, gpus=template.gpus, pods_per_gpu=template.pods_per_gpu,
                             hami=template.hami), costs)
        by_name = {c.name: c for c in s.components}
        child, master = by_name["child-prometheus"], by_name["master-prometheus"]
        receive = by_name.get("thanos-receive")
        grafana = by_name.get("grafana")
        small_child = seed.child_machines[0]
        low, high = seed.grafana_replicas
        rows.append(
            {
                "nodes": nodes,
                "children": child.count,
                "child_cpu_request": child.cpu_request,
                "child_memory_request_mib": child.memory_request_mib,
                "child_memory_share_of_seed": round(
                    child.memory_request_mib / (small_child.memory_gib * 1024), 4
                ),
                "seed_child": " or ".join(str(m) for m in seed.child_machines),
                "masters": master.count,
                "master_cpu_request": master.cpu_request,
                "master_memory_request_mib": master.memory_request_mib,
                "master_memory_share_of_seed": round(
                    master.memory_request_mib / (seed.master_smallest.memory_gib * 1024), 4
                ),
                "master_cpu_share_of_seed": round(master.cpu_request / seed.master_smallest.cores, 4),
                "master_disk_gib": master.disk_gib,
                "seed_master": f"{seed.master_smallest} to {seed.master_largest}",
                "thanos_receive": receive.count if receive is not None else 0,
                "grafana": grafana.count if grafana is not None else 0,
                "seed_grafana": f"{low}-{high} behind {seed.grafana_behind}",
            }
        )
    return rows
