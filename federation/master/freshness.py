"""The rule pack's freshness records (``master/rules/freshness.yml``), rendered from the spec.

Why: the children remote-write into the master. A child that dies sends no staleness
markers, so for the 5-minute lookback every instant query at the master still reads its
targets' last ``up`` (1) and their last GPU readings. These records say, per target,
whether its newest sample at the master is fresh; node, GPU and exporter alerts, the
region totals, ``FederationShardMissing``, the blackout alert and the dashboards read
them instead of raw ``up``.

The bound, per job: ``3 x scrape_interval + remote_write slack`` where the slack is the
largest ``queue_config.batch_send_deadline`` of the spec's remote_write (Prometheus'
default 5s where unset). Three missed scrapes is Prometheus' own staleness heuristic for
scraped series; the slack covers a batch that waits for its deadline before it is sent.
Jobs the spec does not name (the master's meta-monitoring, jobs added by hand) share one
bound over the largest interval anywhere in the spec.

Records (``copy`` = one child's series of a target: ``shard``/``replica`` tell copies apart).
Only the per-target record holds every target; the per-copy records hold only the silent
copies (a fresh copy has no series), so a healthy fleet costs one write per target and
evaluation, not three per copy:

* ``gpufed:up_copy:silent_last_seen_seconds``: a silent copy's newest sample time (older
  than its job's bound: its child died, its remote_write stopped). While ``up`` is in the
  5-minute lookback it is ``timestamp(up)``; after that the record carries its own previous
  value (an instant selector, no range scan), for at most an hour after its last sample. A
  target removed on purpose gets a staleness marker from its child while it is still fresh,
  so it never had a series here, and is dropped.
* ``gpufed:up_copy:silent``: 1 for each silent copy; no series for a fresh one (until
  issue #40 it was 0 there: read ``unless gpufed:up_copy:silent`` for fresh copies).
* ``gpufed:target_unknown:bool``: 1 for a target none of whose copies is fresh.
* ``gpufed:target_up:fresh``: a target's ``up`` over its fresh copies, 0 when unknown.
* ``gpufed:shard:silent_last_seen_seconds``: a silent shard's newest heartbeat time. Every
  child scrapes itself at the spec's shortest interval and its remote_write sends that
  scrape's ``up`` as ``gpufed_child_heartbeat`` (``sharder.children.render``); a shard is
  silent when no replica's heartbeat is newer than ``shard_bound`` (3 heartbeats + slack):
  its children or their remote_write are gone. Carried like the copies' record, for an hour.
* ``gpufed:shard_silent:bool``: 1 for each silent shard. ``FederationShardMissing`` fires on it.
* ``gpufed:region_targets_by_up:count``: per (cluster, region) and ``up`` ("0" or "1"),
  how many of the spec's targets read that in ``gpufed:target_up:fresh``.
* ``gpufed:region_targets_down:ratio``: per (cluster, region), the share of the spec's
  targets down or unknown. ``FederationScrapeBlackout`` fires on it.

Scraped jobs only: the region records name the spec's jobs (``job=~"gpu|node"``),
never "everything but gpufed-child". The master's own meta-monitoring scrapes (``gpufed-child``
has ``region`` and ``shard`` from service discovery, the others neither) carry no ``cluster``,
since the master's TSDB does not store its external labels; counted with the children's
series they made a second ``{region}`` series per region, which Alertmanager, after adding
the external ``cluster``, took for the same alert as the ``{cluster, region}`` one, so the two
alternated (13 flips in 100 s in issue 36), and a single child's failed meta scrape read as a
whole region down.

Left-open selectors (Prometheus 3): none of these records reads a range. A bound is a
comparison of a sample's own timestamp (``timestamp(up)``) with ``time() - bound``, so it
means the same on 2.x (closed ranges) and 3.x (left-open ranges and lookback). The one place
the lookback shows is when ``timestamp(up)`` leaves it, 5 minutes after the last sample, and
there the record's own previous value (an instant selector one evaluation back) has carried
the copy since its bound passed; a sample exactly 5 minutes old (2.x keeps it, 3.x drops it)
changes nothing. The bounds themselves (3 missed scrapes + the send deadline) count scrapes,
not samples in a window.

Cost: instant selectors and ``timestamp(up)`` only; nothing scans a range. Each rule reads
``up`` at most once, and only ``target_up:fresh`` writes a series per target (``gpufed bench
freshness`` times it beside the pre-#40 group in one Prometheus). What an evaluation pays for
is each operator over the 100k copies: the engine materialises every operator's output and
computes a label signature for every series on both sides of a vector-to-vector operator.
Three rules join ``up`` with the silent copies: the silent copies' own rule (which copies came
back, for the carried values), ``target_up:fresh`` (which copies are silent; ``or`` alone does
it) and ``target_unknown`` (its ``and`` keeps only the copies of targets with a silent copy, so
what follows is small). The region counts aggregate the per-target record. None of those
joins can go without ``up`` on one side while the bounds stay exact. The shard records read
one heartbeat per child instead of every copy: until then they were the fourth pass over
``up`` (``max by (cluster, region, shard) (timestamp(up))``, a fifth of the group's time).
A master down for more than the 5-minute lookback forgets the silent copies (they come
back as unknown only while their ``up`` is in the lookback).

Pure: a typed spec in, bytes out. ``federation/rules/freshness.yml`` is this rendering of
``examples/federation.yaml`` (the static pack the Helm chart's PrometheusRule ships); the
master bundle replaces it with the rendering of the spec it runs.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from federation.spec import GpufedSpec
from sharder.children.render import HEARTBEAT_METRIC, heartbeat_interval
from sharder.kernel.models import parse_duration

FILE_NAME = "freshness.yml"
#: Missed scrapes before a target counts as silent.
MISSED_SCRAPES = 3
#: Prometheus' remote_write ``batch_send_deadline`` when the spec leaves it unset.
DEFAULT_SEND_DEADLINE_S = 5.0
#: How long a silent copy stays visible after its last sample.
MEMORY_S = 3600.0
SILENT_LAST_SEEN = "gpufed:up_copy:silent_last_seen_seconds"
SILENT = "gpufed:up_copy:silent"
SHARD_LAST_SEEN = "gpufed:shard:silent_last_seen_seconds"
BY_UP = "gpufed:region_targets_by_up:count"
HEADER = (
    b"# Rendered by federation/master/freshness.py from the spec; do not edit. The copy in\n"
    b"# federation/rules/ (and helm/gpufed/rules/) is the rendering of examples/federation.yaml.\n"
    b"# Bound per job: 3 x scrape_interval + the largest remote_write batch_send_deadline.\n"
    b"# Bounds compare sample timestamps with time(), no range selector: the same on 2.x\n"
    b"# (closed ranges) and 3.x (left-open). Region records read the spec's jobs only, never\n"
    b"# the master's own meta-monitoring scrapes (no cluster label there); shard records read\n"
    b"# the children's heartbeats (gpufed_child_heartbeat, one series per child).\n"
)


def send_slack_s(spec: GpufedSpec) -> float:
    deadlines = [
        parse_duration(w.queue_config.batch_send_deadline)
        for w in spec.remote_write
        if w.queue_config.batch_send_deadline
    ]
    return max(deadlines, default=DEFAULT_SEND_DEADLINE_S)


def _seconds(value: float) -> str:
    return f"{math.ceil(value)}s"


def bounds(spec: GpufedSpec) -> tuple[dict[str, str], str]:
    """(job -> bound, the bound of every other job), as Prometheus durations."""
    slack = send_slack_s(spec)
    per_job = {
        job.name: _seconds(MISSED_SCRAPES * parse_duration(job.scrape_interval) + slack)
        for job in sorted(spec.jobs, key=lambda j: j.name)
    }
    intervals = [parse_duration(job.scrape_interval) for job in spec.jobs]
    if spec.master is not None:
        intervals.append(parse_duration(spec.master.scrape_interval))
        if spec.master.monitoring.scrape_interval:
            intervals.append(parse_duration(spec.master.monitoring.scrape_interval))
    return per_job, _seconds(MISSED_SCRAPES * max(intervals) + slack)


def shard_bound(spec: GpufedSpec) -> str:
    """How long a live child can go without its heartbeat reaching the master.

    Three missed heartbeats (every child scrapes itself at the spec's shortest interval,
    ``sharder.children.render.heartbeat_interval``) plus the remote_write slack: the bound of
    the fastest job, so a dead child shows as soon as its fastest targets would.
    """
    return _seconds(MISSED_SCRAPES * parse_duration(heartbeat_interval(spec)) + send_slack_s(spec))


def scraped_jobs(spec: GpufedSpec) -> str:
    """A regex of the spec's jobs: the targets the children scrape and remote-write.

    Job names are lower-case letters, digits and '-' (``JobSpec``), so none needs escaping.
    """
    return "|".join(sorted(job.name for job in spec.jobs))


def _silent_last_seen(per_job: dict[str, str], other: str, memory: str) -> str:
    """A silent copy's newest sample time, per job's bound; fresh copies get no series.

    ``timestamp(up)`` while the copy is in the lookback, else its own previous value (an
    instant selector: the previous evaluation), which exists only for a copy that was
    already silent: a copy that got a staleness marker while fresh is dropped.
    """
    names = "|".join(per_job)
    selectors = [(f'job="{name}"', bound) for name, bound in per_job.items()]
    selectors.append((f'job!~"{names}"', other))
    parts = [
        f"(timestamp(up{{{sel}}}) or {SILENT_LAST_SEEN}{{{sel}}} > time() - {memory})"
        f" < time() - {_plain(bound)}"
        for sel, bound in selectors
    ]
    return "\n  or ".join(parts) + "\n"


def _plain(duration: str) -> str:
    return duration.removesuffix("s")


def render_rules(spec: GpufedSpec) -> dict[str, Any]:
    per_job, other = bounds(spec)
    memory = _plain(_seconds(MEMORY_S))
    jobs = scraped_jobs(spec)
    scraped = f'gpufed:target_up:fresh{{job=~"{jobs}"}}'
    rules = [
        {"record": SILENT_LAST_SEEN, "expr": _silent_last_seen(per_job, other, memory)},
        {"record": SILENT, "expr": f"{SILENT_LAST_SEEN} * 0 + 1\n"},
        # Per shard, from its children's heartbeats (one series per child, never the fleet's
        # copies): the newest heartbeat of any replica while one is in the lookback, else the
        # record's own previous value, as for the copies above; for an hour at most.
        {
            "record": SHARD_LAST_SEEN,
            "expr": (
                f"(max by (cluster, region, shard) (timestamp({HEARTBEAT_METRIC}))"
                f" or {SHARD_LAST_SEEN} > time() - {memory})\n"
                f"  < time() - {_plain(shard_bound(spec))}\n"
            ),
        },
        {"record": "gpufed:shard_silent:bool",
         "expr": f"group by (cluster, region, shard) ({SHARD_LAST_SEEN})\n"},
        # Per copy: a silent one counts 0, a fresh one its `up` (0 or 1). `or` keeps every
        # left-hand series and only the right-hand ones whose labels (less the name) it has
        # not, so a silent copy's `up` is dropped without an `unless` (which would compute a
        # signature for each of the 100k copies once more). The max per target is then its
        # fresh copies' `up`, or 0 when every copy is silent.
        {
            "record": "gpufed:target_up:fresh",
            "expr": f"max without (shard, replica) ({SILENT} * 0 or up)\n",
        },
        # Unknown: a target with a silent copy and no fresh one. One read of `up`, cut at
        # once to the copies of targets that have a silent copy (few), of which the fresh
        # ones are those that are not silent themselves.
        {
            "record": "gpufed:target_unknown:bool",
            "expr": (
                f"group without (shard, replica) ({SILENT})\n"
                f"  unless ignoring (shard, replica) ((up and ignoring (shard, replica) {SILENT})"
                f" unless {SILENT})\n"
            ),
        },
        # After target_up:fresh: a rule reads the rules above it at the same evaluation.
        # One read of the per-target record counts both values per region (a few series);
        # the ratio is read from those. A region with none down reads 0 (not absent), so
        # dashboards can plot it; counts over counts are the same floats as before.
        {
            "record": BY_UP,
            "expr": f'count_values by (cluster, region) ("up", {scraped})\n',
        },
        {
            "record": "gpufed:region_targets_down:ratio",
            "expr": (
                f'(sum without (up) ({BY_UP}{{up="0"}}) or sum without (up) ({BY_UP}) * 0)\n'
                f"  / sum without (up) ({BY_UP})\n"
            ),
        },
    ]
    return {"groups": [{"name": "gpufed-freshness", "rules": rules}]}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line PromQL as ``|`` blocks, as the hand-written rule files have it."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def render_file(spec: GpufedSpec) -> bytes:
    text = yaml.dump(render_rules(spec), Dumper=_BlockDumper, sort_keys=False, width=4096, allow_unicode=True)
    return HEADER + text.encode("utf-8")
