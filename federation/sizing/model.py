"""What a spec and a fleet need, per component: count, requests, limits, disk, series. Pure.

Series come from the exporter itself (``federation.sizing.series``), the costs from
measurements (``federation.sizing.costs``). A child holds the nodes of its shard at the
spec's ``load_factor`` bound; the master holds every child's series once per replica of a
shard (the ``replica`` external label keeps HA copies apart) and each master replica gets
all of them (one ``remote_write`` per replica). Requests are the predicted RSS; limits add
half again for WAL replay after a restart and compaction. The master's CPU adds the shipped
rule pack's: one evaluation's measured seconds for its series over ``evaluation_interval``.
Past ``MASTER_CEILING_MIB`` a single master is not enough and Thanos Receive takes the series
(``thanos-receive``).

Components the cost bench does not measure get fixed figures: Alertmanager and the relay
the demo's measured ones (``basis: demo``: 37 MiB and 0.4% of a core per Alertmanager, 60 MiB
and 1.5% for the relay, ``gpufed demo --nodes 200``; neither grows with the fleet's series),
the controller and Grafana small starting points (``basis: fixed``). Only the gpu job (the
series the exporter serves) is modelled, other jobs of the spec are listed in ``not_modelled``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from federation.sizing.costs import LineCosts
from federation.sizing.series import SYNTHETIC_PER_TARGET, node_series
from federation.spec import GpufedSpec
from sharder.engine.sizing import Hysteresis
from sharder.kernel.models import parse_duration

GPU_JOB = "gpu"
#: Limits over requests: WAL replay after a restart and head compaction peak above steady RSS.
LIMIT_FACTOR = 1.5
#: A single master's memory ceiling: half of the largest machine (64C128G) the seed's table
#: names, the other half left to the page cache that queries over the retention need.
MASTER_CEILING_MIB = 64 * 1024
#: One Thanos Receive ingestor is sized like a master at half that ceiling; replication 3.
RECEIVE_CEILING_MIB = 32 * 1024
RECEIVE_REPLICATION = 3
#: A region's shard cap with room to grow before the registry refuses nodes (429).
SHARD_CAP_HEADROOM = 1.5
SECONDS_PER_DAY = 86_400
#: Blocks an index is written for per day of retention (2 h blocks before compaction: an upper bound).
BLOCKS_PER_DAY = 12
#: Samples Prometheus' TSDB puts in one chunk before it cuts the next.
SAMPLES_PER_CHUNK = 120


@dataclass(frozen=True)
class Fleet:
    nodes: int
    gpus: int = 8
    pods_per_gpu: int = 0
    hami: bool = True

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"--nodes must be at least 1, got {self.nodes}")
        if not 0 <= self.gpus <= 64:
            raise ValueError(f"--gpus must be from 0 to 64, got {self.gpus}")
        if not 0 <= self.pods_per_gpu <= 64:
            raise ValueError(f"--pods-per-gpu must be from 0 to 64, got {self.pods_per_gpu}")


#: The fleet ``gpufed size`` sizes when neither a flag nor the spec's ``fleet:`` names one.
DEFAULT_NODES = 500


def fleet_of(
    spec: GpufedSpec,
    *,
    nodes: int | None = None,
    gpus: int | None = None,
    pods_per_gpu: int | None = None,
    hami: bool | None = None,
) -> Fleet | None:
    """The fleet to size: each flag given wins, else the spec's ``fleet:``; None when neither
    names the nodes (the caller decides: ``gpufed size`` takes ``DEFAULT_NODES``, compose
    writes no resources)."""
    stated = spec.fleet
    count = nodes if nodes is not None else (stated.nodes if stated is not None else None)
    if count is None:
        return None
    return Fleet(
        nodes=count,
        gpus=gpus if gpus is not None else (stated.gpus_per_node if stated is not None else 8),
        pods_per_gpu=pods_per_gpu if pods_per_gpu is not None else (stated.pods_per_gpu if stated else 0),
        hami=hami if hami is not None else (stated.hami if stated is not None else True),
    )


@dataclass(frozen=True)
class Component:
    name: str
    count: int
    cpu_request: float
    cpu_limit: float
    memory_request_mib: int
    memory_limit_mib: int
    disk_gib: float
    series: int = 0
    samples_per_s: float = 0.0
    basis: str = "measured"


#: Measured in the demo (``gpufed demo --nodes 200``): 37 MiB and 0.4% of a core per
#: Alertmanager, 60 MiB and 1.5% for the relay; what they hold grows with alerts, not series.
ALERTMANAGER = Component(
    name="alertmanager", count=1, cpu_request=0.01, cpu_limit=0.5, memory_request_mib=64,
    memory_limit_mib=256, disk_gib=1.0, basis="demo",
)
RELAY = Component(
    name="dingtalk-relay", count=1, cpu_request=0.02, cpu_limit=0.5, memory_request_mib=96,
    memory_limit_mib=256, disk_gib=0.0, basis="demo",
)


@dataclass(frozen=True)
class Sizing:
    fleet: Fleet
    prometheus_line: str
    series_per_node: int
    children_per_region: dict[str, int]
    shards_per_region: dict[str, int]
    components: list[Component]
    single_master_max_series: int
    thanos_receive_needed: bool
    max_shards_per_region: int
    master_rule_cpu_cores: float = 0.0
    #: Thanos Receive for this fleet, whether or not ``components`` has it (an install may turn it on).
    receive_if_enabled: Component | None = None
    not_modelled: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        out = asdict(self)
        out["fleet"] = asdict(self.fleet)
        return out


def _mib(value: float) -> int:
    """Round up to 64 MiB, as a person would write a request."""
    return max(64, math.ceil(value / 64) * 64)


def _cores(value: float) -> float:
    return max(0.1, math.ceil(value * 10) / 10)


def _nodes_per_region(spec: GpufedSpec, nodes: int) -> dict[str, int]:
    """Round-robin over the regions, as the simulated fleet places them."""
    names = spec.region_names()
    return {name: nodes // len(names) + (1 if i < nodes % len(names) else 0) for i, name in enumerate(names)}


def _retention_days(spec: GpufedSpec) -> float:
    return parse_duration(spec.master.retention) / SECONDS_PER_DAY if spec.master is not None else 15.0


def _evaluation_interval_s(spec: GpufedSpec) -> float:
    return parse_duration(spec.master.evaluation_interval) if spec.master is not None else 30.0


def size(spec: GpufedSpec, fleet: Fleet, costs: dict[str, LineCosts]) -> Sizing:
    line = str(spec.prometheus.release().major)
    if line not in costs:
        raise ValueError(
            f"prometheus.version {spec.prometheus.version!r}: no measured costs for line {line}"
            f" (measured: {sorted(costs)}); run `gpufed bench costs --stack {line}`"
        )
    cost = costs[line]
    job = spec.job(GPU_JOB)
    if job is None:
        raise ValueError(f"jobs: the spec has no {GPU_JOB!r} job, the one the GPU exporter serves")
    per_node = node_series(
        gpus=fleet.gpus,
        pods_per_gpu=fleet.pods_per_gpu,
        hami=fleet.hami,
        keep=tuple(job.keep_metrics),
        drop=tuple(job.drop_metrics),
    ).kept
    interval = parse_duration(job.scrape_interval)
    rf = spec.sharding.replication_factor
    by_region = _nodes_per_region(spec, fleet.nodes)
    shards = {region: spec.shard_count(region, nodes=n) for region, n in by_region.items()}
    biggest = max(math.ceil(n / shards[r] * spec.sharding.load_factor) for r, n in by_region.items() if n)
    # Each child's heartbeat (its scrape of itself, sharder.children.render): 5 series it sends.
    heartbeat = SYNTHETIC_PER_TARGET if spec.remote_write else 0
    child_series = min(biggest, max(by_region.values())) * per_node + heartbeat
    child_sps = child_series / interval
    agent = spec.children.agent_mode
    child_cost = cost.child_agent if agent else cost.server
    fan_out = max(1, len(spec.remote_write))
    child_rss = child_cost.rss_mib(series=child_series, samples_per_s=child_sps * fan_out)
    child_cpu = child_cost.cpu_cores(samples_per_s=child_sps)
    samples_per_day = SECONDS_PER_DAY / interval
    bytes_per_series_day = (
        samples_per_day * cost.chunk_bytes_per_sample
        + math.ceil(samples_per_day / SAMPLES_PER_CHUNK) * cost.chunk_bytes_per_series_chunk
        + BLOCKS_PER_DAY * cost.index_bytes_per_series_per_block
    )
    child_disk = 0.0 if agent else child_series * bytes_per_series_day * 1.0 / 2**30  # children keep ~1 day
    count = sum(shards.values()) * rf
    components = [
        Component(
            name="child-prometheus",
            count=count,
            cpu_request=_cores(child_cpu),
            cpu_limit=max(0.5, _cores(child_cpu * 4)),
            memory_request_mib=_mib(child_rss),
            memory_limit_mib=_mib(child_rss * LIMIT_FACTOR),
            disk_gib=round(max(child_disk, 1.0), 1),
            series=child_series,
            samples_per_s=round(child_sps, 1),
        )
    ]
    total = fleet.nodes * per_node * rf + count * heartbeat
    total_sps = total / interval
    master_rss = cost.server.rss_mib(series=total, samples_per_s=total_sps)
    per_mib = cost.server.mib_per_1k_series / 1000 + cost.server.mib_per_1k_samples_per_s / 1000 / interval
    single_max = int((MASTER_CEILING_MIB - cost.server.base_mib) / per_mib)
    thanos = total > single_max
    days = _retention_days(spec)
    master_count = spec.master.replicas if spec.master is not None else 1
    # The rule pack reads every series the master holds, once an evaluation interval.
    rule_cpu = (
        cost.rules.cpu_cores(series=total, evaluation_interval_s=_evaluation_interval_s(spec))
        if spec.master is None or spec.master.rule_pack
        else 0.0
    )
    master_cpu = cost.server.cpu_cores(samples_per_s=total_sps) + rule_cpu
    # Past the ceiling the master keeps a short window and Receive holds the rest.
    master_series = min(total, single_max)
    master_rss = cost.server.rss_mib(series=master_series, samples_per_s=master_series / interval)
    master_disk = master_series * bytes_per_series_day * (1.0 if thanos else days) / 2**30
    components.append(
        Component(
            name="master-prometheus",
            count=master_count,
            cpu_request=_cores(master_cpu),
            cpu_limit=max(1.0, _cores(master_cpu * 4)),
            memory_request_mib=_mib(master_rss),
            memory_limit_mib=_mib(master_rss * LIMIT_FACTOR),
            disk_gib=round(max(master_disk * 1.2, 1.0), 1),
            series=total,
            samples_per_s=round(total_sps, 1),
        )
    )
    per_receiver = int((RECEIVE_CEILING_MIB - cost.server.base_mib) / per_mib)
    receivers = max(RECEIVE_REPLICATION, math.ceil(total * RECEIVE_REPLICATION / per_receiver))
    held = total * RECEIVE_REPLICATION / receivers
    rss = cost.server.rss_mib(series=held, samples_per_s=held / interval)
    receive = Component(
        name="thanos-receive",
        count=receivers,
        cpu_request=_cores(cost.server.cpu_cores(samples_per_s=held / interval)),
        cpu_limit=_cores(4 * cost.server.cpu_cores(samples_per_s=held / interval)),
        memory_request_mib=_mib(rss),
        memory_limit_mib=_mib(rss * LIMIT_FACTOR),
        disk_gib=round(max(held * bytes_per_series_day * 1.0 * 1.2 / 2**30, 1.0), 1),  # ~1 day before upload
        series=int(held),
        samples_per_s=round(held / interval, 1),
    )
    if thanos or (spec.thanos is not None and spec.thanos.mode == "receive"):
        components.append(receive)
    if spec.alerting is not None:
        components.append(replace(ALERTMANAGER, count=len(spec.alerting.replicas)))
        components.append(RELAY)
    components.append(
        Component(
            name="controller",
            count=1,
            cpu_request=0.2,
            cpu_limit=1.0,
            memory_request_mib=256,
            memory_limit_mib=512,
            disk_gib=1.0,
            basis="fixed",
        )
    )
    if spec.grafana is not None:
        components.append(
            Component(
                name="grafana",
                count=2,
                cpu_request=0.2,
                cpu_limit=1.0,
                memory_request_mib=256,
                memory_limit_mib=512,
                disk_gib=1.0,
                basis="fixed",
            )
        )
    sized = [n for r, n in by_region.items() if any(x.name == r and x.shards is None for x in spec.regions)]
    cap = math.ceil(max(sized, default=0) / spec.sharding.targets_per_shard * SHARD_CAP_HEADROOM)
    rule_s = rule_cpu * _evaluation_interval_s(spec)
    too_slow = (
        [
            f"the rule pack takes about {rule_s:.0f} s an evaluation for {total:,} series (measured on"
            f" {cost.measured_on.get('cpus', '?')} shared cores), past master.evaluation_interval"
            f" {spec.master.evaluation_interval if spec.master else '30s'}: groups would miss evaluations;"
            " lengthen the interval or split the series (Thanos Receive, tenants per region)"
        ]
        if rule_s > _evaluation_interval_s(spec)
        else []
    )
    warnings = too_slow + [
        f"region {r!r}: a fixed {shards[r]} shards hold {math.ceil(n / shards[r])} nodes each"
        f" (targets_per_shard is {spec.sharding.targets_per_shard}); drop its `shards:` to size it"
        for r, n in by_region.items()
        if any(x.name == r and x.shards is not None for x in spec.regions)
        and n / shards[r] > 2 * spec.sharding.targets_per_shard
    ]
    return Sizing(
        warnings=warnings,
        fleet=fleet,
        prometheus_line=cost.version,
        series_per_node=per_node,
        children_per_region={r: n * rf for r, n in shards.items()},
        shards_per_region=dict(shards),
        components=components,
        single_master_max_series=single_max,
        thanos_receive_needed=thanos,
        max_shards_per_region=max(cap, 1),
        master_rule_cpu_cores=round(rule_cpu, 4),
        receive_if_enabled=receive,
        not_modelled=sorted(j.name for j in spec.jobs if j.name != GPU_JOB),
    )


def default_shard_cap(spec: GpufedSpec, costs: dict[str, LineCosts]) -> int:
    """``--max-shards-per-region`` when the flag is not given: the controller's generic cap
    (``Hysteresis.max_shards``, a guard against a runaway register token), raised to what the
    spec's stated ``fleet:`` needs with ``SHARD_CAP_HEADROOM`` when that is more. Never lower:
    a fleet that grows past its stated size still registers up to the generic cap."""
    floor = Hysteresis().max_shards
    fleet = fleet_of(spec)
    if fleet is None:
        return floor
    return max(floor, size(spec, fleet, costs).max_shards_per_region)
