"""``gpufed bench ...``: one command table over the benches in ``federation.testing.benches``.

Every bench command does the same three things: its options in, the bench's ``run_*`` out,
the result printed as one JSON object (``--json``, sorted keys: scripts read them) or for a
person. The table (``BENCHES``) names only what differs per bench: its options (the
signature of a function that returns the result), and how a person reads the result (a
table of figures, the raw dict, or one ``key value`` line per figure). ``--json`` is added
to every command here. A bench that cannot run raises ``BenchFailed``: ``error: ...`` on
stderr, exit 1; one that leaves processes behind (``leftover_processes``) exits 1 after
printing, and so does one whose result says ``"ok": false`` (a bench that checks what
it measures, like ``blackouts``).
"""

import inspect
import json
import os
import shutil
import signal
import sys
import tempfile
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from federation.demo.plan import NODES_PER_CHILD, Layout
from federation.demo.stack import ComponentFailed, DemoError
from federation.testing.benches.abuse import ROUTES as ABUSE_ROUTES
from federation.testing.benches.abuse import run_abuse_bench
from federation.testing.benches.balance import run_balance_bench
from federation.testing.benches.controller import MAX_TARGETS as MAX_SD_TARGETS
from federation.testing.benches.controller import run_rebalance_bench, run_sd_bench
from federation.testing.benches.demo import run_first_sample_bench, run_gap_bench
from federation.testing.benches.discovery import run_discovery_bench
from federation.testing.benches.inventory import MAX_NODES, run_inventory_bench
from federation.testing.benches.render import run_render_bench
from federation.testing.benches.sharding import MAX_TARGETS, run_sharding_bench
from federation.testing.benches.thanos import MAX_SERIES, run_thanos_bench
from sharder.engine.assigning import ALGORITHM, STRATEGIES
from sharder.engine.sizing import MAX_SHARDS_BOUND

Result = dict[str, Any]
Options = dict[str, Any]
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON object")]


class BenchFailed(Exception):
    """The bench could not run (its stack failed, a change timed out): ``error: ...``, exit 1."""


@dataclass(frozen=True)
class Bench:
    name: str
    run: Callable[..., Result]
    show: Callable[[Result, Options], None]


# --- how a person reads a result --------------------------------------------------------------


def table(title: Callable[[Result, Options], str]) -> Callable[[Result, Options], None]:
    def show(result: Result, options: Options) -> None:
        figures = Table(title=title(result, options))
        figures.add_column("figure")
        figures.add_column("value", justify="right")
        for key, value in result.items():
            figures.add_row(key, "-" if value is None else str(value))
        Console().print(figures)

    return show


def raw(result: Result, options: Options) -> None:
    Console().print(result)


def lines(result: Result, options: Options) -> None:
    for key in sorted(k for k, v in result.items() if not isinstance(v, dict)):
        typer.echo(f"{key:32} {result[key]}")


# --- the benches' options ---------------------------------------------------------------------


def sharding(
    targets: Annotated[int, typer.Option(min=1, max=MAX_TARGETS, help="synthetic targets")] = 100_000,
    shards: Annotated[int, typer.Option(min=1, help="shards in the one bench region")] = 100,
    seed: Annotated[int, typer.Option(help="seed for addresses and the 4/8 GPU mix")] = 0,
    trials: Annotated[int, typer.Option(min=1, help="shard-name sets to average movement over")] = 20,
    algorithm: Annotated[str, typer.Option(help=f"one of {', '.join(STRATEGIES)}")] = ALGORITHM,
) -> Result:
    """Time assignment and measure balance and movement on add/remove of one shard."""
    if algorithm not in STRATEGIES:
        raise typer.BadParameter(f"unknown algorithm {algorithm!r} (known: {', '.join(STRATEGIES)})")
    return run_sharding_bench(targets=targets, shards=shards, seed=seed, trials=trials, algorithm=algorithm)


def render(
    children: Annotated[int, typer.Option(min=1, max=2000, help="child configs to render")] = 100,
    workers: Annotated[int, typer.Option(min=1, max=64, help="concurrent promtool checks")] = 8,
    no_check: Annotated[bool, typer.Option("--no-check", help="skip promtool")] = False,
) -> Result:
    """Time assign, render, write and promtool-check of N child configs."""
    return run_render_bench(children=children, workers=workers, check=not no_check)


def thanos(
    series: Annotated[int, typer.Option(min=1, max=MAX_SERIES, help="synthetic GPU series")] = 1_000_000,
    ingestors: Annotated[int, typer.Option(min=1, max=1000, help="ingestors before one joins")] = 6,
) -> Result:
    """Series moved when one Receive ingestor joins: ketama vs hashmod vs the optimum 1/(K+1)."""
    return run_thanos_bench(series=series, ingestors=ingestors)


def inventory(
    nodes: Annotated[int, typer.Option(min=1, max=MAX_NODES, help="GPU nodes (2 targets each)")] = 400_000,
    nodes_per_shard: Annotated[int, typer.Option(min=1, help="sharding.targets_per_shard")] = 100,
    seed: Annotated[int, typer.Option(help="seed for teams and the 4/8 GPU mix")] = 0,
    anchor_nodes: Annotated[int, typer.Option(min=1, help="nodes the old-loader anchor reads")] = 20_000,
) -> Result:
    """Time loading, assigning and planning a large static inventory; peak RSS."""
    return run_inventory_bench(nodes=nodes, nodes_per_shard=nodes_per_shard, seed=seed,
                               anchor_nodes=anchor_nodes)


def discovery(
    targets: Annotated[int, typer.Option(min=1, max=200_000, help="exporter services registered")] = 10_000,
    changes: Annotated[int, typer.Option(min=1, help="registrations to time")] = 200,
    debounce: Annotated[float, typer.Option(min=0, help="reconcile debounce window, seconds")] = 1.0,
    interval: Annotated[float, typer.Option(min=0, help="mean seconds between changes")] = 0.25,
    churn: Annotated[float, typer.Option(min=0, max=1, help="fraction replaced per minute")] = 0.01,
    churn_minutes: Annotated[float, typer.Option(min=0, help="then follow churn this long (0: skip)")] = 0.0,
    seed: Annotated[int, typer.Option(help="seed for change order and gaps")] = 0,
) -> Result:
    """Time registry change -> new assignment over HTTP; CPU and RSS of following the fleet."""
    return run_discovery_bench(targets=targets, changes=changes, debounce_s=debounce, interval_s=interval,
                               churn=churn, churn_minutes=churn_minutes, seed=seed)


def sd(
    targets: Annotated[int, typer.Option(min=1, max=MAX_SD_TARGETS, help="targets the controller serves")]
    = 10_000,
    shards: Annotated[int, typer.Option(min=1, max=2000, help="shards (one child each)")] = 100,
    pollers: Annotated[int, typer.Option(min=0, max=2000, help="children polling once a second")] = 100,
    clients: Annotated[int, typer.Option(min=0, max=2000, help="clients asking back to back")] = 200,
    duration: Annotated[float, typer.Option(min=1, max=600, help="seconds of load per server")] = 10.0,
    abuse: Annotated[int, typer.Option(
        min=0, max=200, help="N clients without a token loop on list reads, then on /readyz (the floor); "
        "prints SD p99 under each (0: the plain SD bench)")] = 0,
    read_rate: Annotated[float | None, typer.Option(
        min=0, help="with --abuse: the controller's --read-rate (0: no read budget)")] = None,
    abuse_route: Annotated[str, typer.Option(
        "--abuse-route", help="with --abuse: what the clients loop on: lists (every list read), status "
        "(/v1/status), target-list (the largest file_sd list) or xff (/v1/targets, rotating "
        "X-Forwarded-For)")] = "lists",
    tls: Annotated[bool, typer.Option(
        "--tls", help="also a controller served with --web.config.file (TLS, client certificates "
        "required), in the same run: tls_p99_ms beside p99_ms")] = False,
) -> Result:
    """HTTP SD latency under load, against uvicorn serving constant bytes (the floor)."""
    _one_of(abuse_route, ABUSE_ROUTES, "--abuse-route")
    if tls and abuse:
        raise typer.BadParameter("one of --tls and --abuse", param_hint="--tls")
    if abuse:
        return run_abuse_bench(targets=targets, shards=shards, abusers=abuse, pollers=pollers,
                               clients=clients, duration_s=duration, read_rate=read_rate, route=abuse_route)
    return run_sd_bench(targets=targets, shards=shards, pollers=pollers, clients=clients, duration_s=duration,
                        tls=tls)


def rebalance(
    targets: Annotated[int, typer.Option(min=1, max=MAX_SD_TARGETS, help="targets in the region")] = 10_000,
    shards: Annotated[int, typer.Option(min=1, max=2000, help="shards before one is added")] = 100,
) -> Result:
    """Plan + apply one added shard; time to first serve the new lists."""
    return run_rebalance_bench(targets=targets, shards=shards)


def failover(
    replicas: Annotated[int, typer.Option(min=2, max=9, help="gpufed serve processes")] = 3,
    nodes: Annotated[int, typer.Option(min=1, max=50_000, help="GPU nodes (two targets each)")] = 2000,
    ttl: Annotated[int, typer.Option(min=10, max=600, help="--lock-ttl of the replicas, seconds")] = 15,
    lock_delay: Annotated[int, typer.Option(min=0, max=60, help="--lock-delay of the replicas")] = 1,
    rounds: Annotated[int, typer.Option(min=1, max=20, help="leaders killed one after another")] = 1,
) -> Result:
    """Kill -9 the leader: take-over time, SD errors meanwhile, targets moved."""
    from federation.testing.benches.failover import run_failover_bench

    return run_failover_bench(replicas=replicas, nodes=nodes, ttl_s=ttl, lock_delay_s=lock_delay,
                              rounds=rounds)


def balance(
    targets: Annotated[int, typer.Option(min=1, max=200_000, help="GPU-exporter targets")] = 1000,
    shards: Annotated[int, typer.Option(min=1, help="shards in the one bench region")] = 20,
    heavy_fraction: Annotated[float, typer.Option(
        min=0, max=1, help="share of targets with skewed series")] = 0.1,
    heavy_factor: Annotated[float, typer.Option(
        min=1, max=1000, help="their series over what GPUs suggest")] = 10.0,
    noise: Annotated[float, typer.Option(
        min=0, max=0.9, help="per-target spread of series per GPU, +-")] = 0.1,
    jitter: Annotated[float, typer.Option(min=0, max=0.9, help="per-reading noise, +-")] = 0.05,
    readings: Annotated[int, typer.Option(min=1, max=1000, help="readings smoothed before planning")] = 5,
    seed: Annotated[int, typer.Option(help="seed for addresses, GPU mix and skew")] = 0,
) -> Result:
    """Compare shard balance by samples/s with GPU-count weights and with load-aware weights."""
    if shards > targets:
        raise typer.BadParameter(
            f"at most one shard per target ({targets}), got {shards}", param_hint="--shards"
        )
    return run_balance_bench(targets=targets, shards=shards, heavy_fraction=heavy_fraction,
                             heavy_factor=heavy_factor, noise=noise, jitter=jitter, readings=readings,
                             seed=seed)


DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="where the demo writes (default: a temporary directory)")
]


def gap(
    nodes: Annotated[int, typer.Option(min=2, max=100_000, help="simulated GPU nodes")] = 60,
    regions: Annotated[int, typer.Option(min=1, max=50)] = 3,
    replication_factor: Annotated[int, typer.Option(min=1, max=3, help="children per shard")] = 1,
    nodes_per_child: Annotated[int, typer.Option(min=1)] = NODES_PER_CHILD,
    data_dir: DataDir = None,
) -> Result:
    """Largest gap per moved target at the master: make-before-break vs --no-handover, one run."""
    layout = _layout(nodes=nodes, regions=regions, replication_factor=replication_factor,
                     nodes_per_child=nodes_per_child)
    return _in_demo_dir(data_dir, lambda where: run_gap_bench(layout=layout, data_dir=where, say=_say))


def first_sample(
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="simulated GPU nodes running already")] = 30,
    late: Annotated[int, typer.Option(min=1, max=500, help="nodes registered while it runs")] = 8,
    spacing: Annotated[float, typer.Option(min=0.1, help="seconds between two registrations")] = 1.7,
    data_dir: DataDir = None,
) -> Result:
    """Time from a node's registration (PUT to the registry) to its first sample at the master."""
    layout = _layout(nodes=nodes)
    return _in_demo_dir(data_dir, lambda where: run_first_sample_bench(
        layout=layout, late=late, spacing_s=spacing, data_dir=where, say=_say))


def blackouts(
    nodes: Annotated[int, typer.Option(min=2, max=10_000, help="simulated GPU nodes")] = 9,
    regions: Annotated[int, typer.Option(min=1, max=50)] = 3,
    frozen: Annotated[str, typer.Option(
        help="what freezes: fleet (the nodes) or children (every child); a comma list takes turns")]
    = "children,fleet",
    freeze: Annotated[float, typer.Option(
        min=30, max=3600, help="seconds each freeze lasts (the alert fires about 45-50 s in)")] = 90.0,
    gap: Annotated[float, typer.Option(min=0, max=3600, help="seconds from a thaw to the next freeze")]
    = 120.0,
    episodes: Annotated[int, typer.Option(min=1, max=10, help="freezes")] = 2,
    poll: Annotated[float, typer.Option(min=0.2, max=5, help="seconds between two polls of each source")]
    = 1.0,
    after: Annotated[float, typer.Option(
        min=10, max=3600, help="at most this long after the last thaw for the resolves to arrive")] = 180.0,
    settle: Annotated[float, typer.Option(min=0, max=600, help="then watch this long for late copies")]
    = 15.0,
    data_dir: DataDir = None,
) -> Result:
    """Two blackouts (the children, then the fleet): each one's FIRING and RESOLVED at DingTalk once,
    no flaps in the Alertmanagers (exit 1 otherwise)."""
    from federation.testing.benches.blackouts import frozen_kinds, run_blackouts_bench

    try:
        frozen_kinds(frozen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--frozen") from exc
    layout = _layout(nodes=nodes, regions=regions)
    return _in_demo_dir(data_dir, lambda where: run_blackouts_bench(
        layout=layout, frozen=frozen, freeze_s=freeze, gap_s=gap, episodes=episodes, poll_s=poll,
        after_s=after, settle_s=settle, data_dir=where, say=_say))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _layout(**kwargs: int) -> Layout:
    try:
        return Layout(**kwargs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _in_demo_dir(data_dir: Path | None, bench: Callable[[Path], Result]) -> Result:
    """The demo benches start the whole demo in ``data_dir``, or in a scratch dir removed after."""
    scratch = data_dir is None
    where = Path(tempfile.mkdtemp(prefix="gpufed-bench-")) if data_dir is None else data_dir
    try:
        return bench(where / "demo" if scratch else where)
    except (DemoError, ComponentFailed, ValueError) as exc:
        raise BenchFailed(str(exc)) from exc
    finally:
        if scratch:
            shutil.rmtree(where, ignore_errors=True)


VIA = ("file", "registry")
FORMATS = ("yaml", "json")
STORES = ("sqlite", "consul", "kubernetes")
DISCOVERY = ("file_sd", "http_sd")


def live(
    targets: Annotated[int, typer.Option(min=2, max=1_000_000, help="targets the controller follows")]
    = 20_000,
    changes: Annotated[int, typer.Option(min=1, max=10_000, help="registrations timed")] = 30,
    rate: Annotated[float, typer.Option(min=0.01, max=1000, help="registrations per second")] = 1.0,
    via: Annotated[str, typer.Option(help="file (an inventory) or registry (pre-registered)")] = "file",
    debounce: Annotated[float, typer.Option(min=0, max=60, help="--debounce of gpufed serve")] = 1.0,
    batch: Annotated[int, typer.Option(min=0, max=62_500, help="entries in the timed batch POST; 0 skips")]
    = 20_000,
    change_timeout: Annotated[float, typer.Option(min=1, max=600, help="seconds a change may take")] = 60.0,
    inventory_format: Annotated[str, typer.Option(help="yaml or json: the inventory's format")]
    = "yaml",
    spec: Annotated[str | None, typer.Option(
        help="spec file (default examples/federation.yaml as shipped); builtin: the bench's own")] = None,
    store: Annotated[str, typer.Option(help="sqlite, consul or kubernetes (a stand-in in its own process)")]
    = "sqlite",
    discovery: Annotated[str | None, typer.Option(help="file_sd or http_sd (default: what the spec says)")]
    = None,
    targets_per_shard: Annotated[int | None, typer.Option(min=1, help="override the spec's sharding size")]
    = None,
    sizes: Annotated[str | None, typer.Option(
        help="a sweep: targets per run, e.g. 10000,100000,300000 (one JSON row each, then a summary)")]
    = None,
    rss_after_changes: Annotated[int | None, typer.Option(
        min=1, max=62_500, help="registrations placed before rss_mib_after_changes (default: --changes)")]
    = None,
    max_shards_per_region: Annotated[int | None, typer.Option(
        min=1, max=MAX_SHARDS_BOUND,
        help="serve's --max-shards-per-region (default: one that fits the fleet)")] = None,
    anchors: Annotated[bool, typer.Option(help="run the in-process engine anchors after each run")] = True,
) -> Result:
    """A real `gpufed serve`: registration -> its child's SD answer, CPU per change, RSS, ready, settle."""
    _one_of(via, VIA, "--via")
    _one_of(inventory_format, FORMATS, "--inventory-format")
    _one_of(store, STORES, "--store")
    if discovery is not None:
        _one_of(discovery, DISCOVERY, "--discovery")
    if rss_after_changes is not None and rss_after_changes < changes:
        raise typer.BadParameter(f"at least --changes ({changes}), got {rss_after_changes}",
                                 param_hint="--rss-after-changes")
    sweep = _sizes(sizes, low=2, high=1_000_000) if sizes is not None else None
    from federation.testing.benches.live import LiveBenchError, run_live_bench, run_live_sweep

    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the serve process and the temp dir go too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    options: dict[str, Any] = dict(changes=changes, rate=rate, via=via, debounce_s=debounce, batch=batch,
                   change_timeout_s=change_timeout, inventory_format=inventory_format, spec=spec, store=store,
                   discovery=discovery, targets_per_shard=targets_per_shard,
                   rss_after_changes=rss_after_changes, max_shards_per_region=max_shards_per_region,
                   anchors=anchors)  # fmt: skip
    try:
        if sweep is not None:  # each row as it is done: a sweep cut short keeps what it measured
            return run_live_sweep(sizes=sweep, emit=lambda row: typer.echo(json.dumps(row, sort_keys=True)),
                                  **options)  # fmt: skip
        return run_live_bench(targets=targets, **options)
    except (LiveBenchError, TimeoutError) as exc:
        raise BenchFailed(str(exc)) from exc


def freshness(
    targets: Annotated[int, typer.Option(min=1, max=2_000_000, help="targets pushed (10% go silent)")]
    = 100_000,
    replicas: Annotated[int, typer.Option(min=1, max=4, help="copies of each target's up (HA: 2)")] = 1,
    minutes: Annotated[float, typer.Option(min=0.25, max=60, help="minutes of history per series")] = 3.0,
    rules: Annotated[Path | None, typer.Option(
        help="rule file to time (default: the shipped federation/rules/freshness.yml)")] = None,
    baseline: Annotated[Path | None, typer.Option(
        help="rule file timed beside it in the same Prometheus (default: the pre-#40 group)")] = None,
    shards_per_region: Annotated[int, typer.Option(
        min=1, max=100_000, help="children a region, one heartbeat series each")] = 200,
) -> Result:
    """The rule pack's freshness records in a real Prometheus: evaluation time against one raw `up` read."""
    from federation.testing.benches.freshness import BASELINE, RULES, run_freshness_bench

    return run_freshness_bench(targets=targets, replicas=replicas, minutes=minutes, rules=rules or RULES,
                               baseline=baseline or BASELINE, shards_per_region=shards_per_region)


def state_store(
    targets: Annotated[int, typer.Option(min=1, max=2_000_000, help="registry rows saved, then deleted")]
    = 200_000,
) -> Result:
    """The SQLite state store's crash checks (WAL scan, open) and space reclaim on delete."""
    from federation.testing.benches.state_store import run_state_store_bench

    return run_state_store_bench(count=targets)


def dingtalk(
    alerts: Annotated[int, typer.Option(min=1, max=100_000, help="alerts in the storm")] = 5000,
    regions: Annotated[int, typer.Option(min=1, max=100, help="regions, one robot each")] = 10,
    alertnames: Annotated[int, typer.Option(min=1, max=100, help="alert names per region (one group each)")]
    = 5,
    timeout: Annotated[float, typer.Option(min=1, max=3600, help="seconds to wait for delivery")] = 180.0,
) -> Result:
    """An alert storm through a real Alertmanager HA pair and the relay to the DingTalk stand-in."""
    from federation.testing.benches.dingtalk import run

    return run(alerts=alerts, regions=regions, alertnames=alertnames, timeout=timeout)


def compose(
    nodes: Annotated[int, typer.Option(min=1, max=200, help="copies of compose/node.yml (simulated GPUs)")]
    = 20,
    spec: Annotated[Path | None, typer.Option(
        help="spec to render the compose tier from (default compose/federation.yaml)", exists=True,
        dir_okay=False)] = None,
    timeout: Annotated[float, typer.Option(min=10, max=1800, help="seconds each step may take")] = 240.0,
    profile: Annotated[list[str] | None, typer.Option(
        help="a monitoring.yml profile to start too (consul: the Consul stand-in)")] = None,
) -> Result:
    """The rendered monitoring.yml and N node.yml copies run as processes (root): targets, alert, restart."""
    from federation.testing.benches.compose import run_compose_bench
    from federation.testing.harnesses.composerun.plan import ComposeRunError

    if os.geteuid() != 0:
        raise BenchFailed("the compose runner needs root (ip netns, unshare --mount)")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a CI timeout unwinds: namespaces and processes go
    try:
        return run_compose_bench(nodes=nodes, spec=spec, timeout=timeout, say=_say,
                                 profiles=tuple(profile or ()))
    except (ComposeRunError, OSError) as exc:
        raise BenchFailed(str(exc)) from exc


def helm(
    nodes: Annotated[int, typer.Option(min=1, max=50, help="Nodes, no region label")]
    = 2,
    timeout: Annotated[float, typer.Option(min=10, max=1800, help="seconds each step may take")] = 110.0,
    tls: Annotated[bool, typer.Option(help="tls.enabled, an existing Secret from gpufed certs")] = False,
) -> Result:
    """The chart rendered with only a token and discovery.defaultRegion, its workloads run as pods (root)."""
    from federation.testing.benches.helm import run_helm_bench
    from federation.testing.harnesses.helmrun.pods import PodError
    from federation.testing.harnesses.helmrun.run import HelmRunError

    if os.geteuid() != 0:
        raise BenchFailed("the Helm runner needs root (ip netns, unshare --mount)")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a CI timeout unwinds: namespaces and processes go
    try:
        return run_helm_bench(nodes=nodes, timeout=timeout, say=_say, tls=tls)
    except (HelmRunError, PodError, OSError) as exc:
        raise BenchFailed(str(exc)) from exc


def costs(
    stack: Annotated[int, typer.Option(min=2, max=3, help="Prometheus line: 3 (3.5.3) or 2 (2.53.3)")] = 3,
    sizes: Annotated[str, typer.Option(help="fleet sizes in nodes, comma-separated (at least two)")]
    = "60,240",
    gpus: Annotated[int, typer.Option(min=1, max=64, help="simulated GPUs per node")] = 8,
    interval: Annotated[int, typer.Option(min=2, max=60, help="scrape interval in seconds")] = 10,
    settle: Annotated[float, typer.Option(min=5, max=600, help="seconds measured per size")] = 45.0,
    into: Annotated[
        Path | None,
        typer.Option(help="also write this line's fitted entry into a costs.json"
                     " (federation/sizing/costs.json)", dir_okay=False),
    ] = None,
) -> Result:
    """Real Prometheus child (agent) and master on the simulated fleet: MiB per series and per sample/s,
    the master's rule pack seconds per evaluation per series."""
    from federation.testing.benches.costs import CostsFailed, merge_costs, run_costs_bench

    binary = os.environ.get(f"GPUFED_STACK{stack}_BIN")
    if not binary:
        raise BenchFailed(f"GPUFED_STACK{stack}_BIN is not set: run `. scripts/stack_path.sh` first")
    found = shutil.which("prometheus", path=binary) if Path(binary).is_dir() else binary
    if not found:
        raise BenchFailed(f"no prometheus under GPUFED_STACK{stack}_BIN={binary}")
    try:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"expected numbers such as 60,240, got {sizes!r}",
                                 param_hint="--sizes") from exc
    if len(set(counts)) < 2 or min(counts) < 1 or max(counts) > 2000:
        raise typer.BadParameter(f"two or more different sizes from 1 to 2000, got {sizes!r}",
                                 param_hint="--sizes")
    try:
        result = run_costs_bench(binary=found, sizes=counts, gpus=gpus, interval_s=interval,
                                 settle_s=settle)
        if into is not None:
            into.write_text(merge_costs(into.read_text() if into.exists() else None, result))
        return result
    except (CostsFailed, OSError, ValueError) as exc:
        raise BenchFailed(str(exc)) from exc


def _sizes(text: str, *, low: int, high: int) -> list[int]:
    """``--sizes`` of ``gpufed bench live``: distinct counts in order, each within low..high."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"expected numbers such as 10000,100000, got {text!r}",
                                 param_hint="--sizes") from exc
    if not counts or len(set(counts)) < len(counts) or min(counts) < low or max(counts) > high:
        raise typer.BadParameter(f"distinct sizes from {low} to {high}, got {text!r}", param_hint="--sizes")
    return counts


def _one_of(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise typer.BadParameter(f"expected one of {', '.join(allowed)}, got {value!r}", param_hint=flag)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --- the table ------------------------------------------------------------------------------------

BENCHES = (
    Bench("sharding", sharding, table(
        lambda r, o: f"sharding: {r['targets']} targets on {r['shards']} shards")),
    Bench("render", render, table(lambda r, o: f"render: {o['children']} children")),
    Bench("thanos", thanos, table(
        lambda r, o: f"thanos: {o['series']} series, {o['ingestors']} -> {o['ingestors'] + 1} ingestors")),
    Bench("inventory", inventory, table(lambda r, o: f"inventory: {o['nodes']} nodes")),
    Bench("discovery", discovery, table(
        lambda r, o: f"discovery: {o['targets']} targets, {o['changes']} changes")),
    Bench("sd", sd, raw),
    Bench("rebalance", rebalance, raw),
    Bench("failover", failover, raw),
    Bench("balance", balance, table(lambda r, o: f"balance: {o['targets']} targets on {o['shards']} shards")),
    Bench("gap", gap, lines),
    Bench("first-sample", first_sample, lines),
    Bench("blackouts", blackouts, raw),
    Bench("live", live, raw),
    Bench("dingtalk", dingtalk, raw),
    Bench("freshness", freshness, raw),
    Bench("state-store", state_store, raw),
    Bench("compose", compose, raw),
    Bench("helm", helm, raw),
    Bench("costs", costs, raw),
)


def command(bench: Bench) -> Callable[..., None]:
    """The typer command for ``bench``: its options plus ``--json``; run, then print."""

    def run_and_print(**options: Any) -> None:
        as_json = options.pop("as_json")
        try:
            result = bench.run(**options)
        except BenchFailed as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        if as_json:
            typer.echo(json.dumps(result, sort_keys=True))
        else:
            bench.show(result, options)
        # A bench that checks as it measures says ``"ok": false`` when the check failed.
        if result.get("leftover_processes") or result.get("ok") is False:
            raise typer.Exit(1)

    signature = inspect.signature(bench.run, eval_str=True)
    as_json = inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=AsJson)
    run_and_print.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), as_json], return_annotation=None
    )
    hints = typing.get_type_hints(bench.run, include_extras=True)
    hints.pop("return", None)
    run_and_print.__annotations__ = {**hints, "as_json": AsJson}
    run_and_print.__doc__ = bench.run.__doc__
    run_and_print.__name__ = bench.run.__name__
    return run_and_print


def register(bench_app: typer.Typer) -> None:
    for bench in BENCHES:
        bench_app.command(bench.name)(command(bench))
