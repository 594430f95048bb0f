"""What the rule pack's freshness records cost a real Prometheus, as one JSON line.

``gpufed bench freshness [--targets 100000] [--replicas 1] [--minutes 3] [--rules FILE]
[--baseline FILE] --json`` (also ``python -m federation.testing.benches.freshness``, which
prints the JSON line itself): starts the ``prometheus`` first on PATH with its remote-write
receiver and the rule file (default: the shipped ``federation/rules/freshness.yml``; any
other version to compare with, e.g. ``git show REV:federation/rules/freshness.yml``),
evaluating every 15 s, and pushes ``up`` for TARGETS targets (REPLICAS copies each, as HA
children send them) into it, as the children feed the master: MINUTES of history 15 s
apart, then a live sample every 15 s, with each child's heartbeat (one series per child,
``--shards-per-region`` children a region, default 200; the shipped spec has about 1,400 at
100,000 targets). A tenth of the targets (every copy) stopped a minute before the start, as
a dead child leaves them (with their shards' heartbeats): silent, still in the 5-minute
lookback for the whole measurement. It prints Prometheus' own rule group timing and what the records
found, against an anchor group of one plain ``max without (shard, replica) (up)`` (the raw
read the pack made before) in the same Prometheus.

Before and after in one run: the baseline rule file (default: ``freshness_baseline.yml``
next to this module, the freshness group as main shipped it at 43395dc) is loaded into the
same Prometheus with its records renamed (``gpufed:`` -> ``baseline:``, group
``baseline-...``), so both versions evaluate the same series at the same interval under the
same load; ``speedup`` is the baseline's time over the rule file's. The baseline's, the rule
file's and the anchor's rules run one after another in one group (:func:`sequenced`), never
at once, and each part's time is the sum of its rules' own evaluation times; half the
evaluations run the baseline first, half the rule file first.

Only evaluations that start two intervals after the history is in count (every record then
exists and is appended to, as in a running master), up to MEDIAN_OF of them per group and no
later than the silent copies' fifth minute. An earlier version built the series ahead with
``promtool tsdb create-blocks-from`` up to 4 minutes into the future: the head refused every
record older than that newest block, so all but the last evaluations read empty records and
the per-rule times after the first read of ``up`` were ~0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until
from federation.testing.benches import remote_write

PACKAGE = Path(__file__).resolve().parents[2]  # federation/, whose rules/ ship with it
ROOT = PACKAGE.parent
RULES = PACKAGE / "rules" / "freshness.yml"
BASELINE = Path(__file__).with_name("freshness_baseline.yml")
INTERVAL_S = 15
#: The anchor, in the same run: what the pack read before freshness, one pass over `up`.
ANCHOR = """groups:
- name: anchor-raw-up
  rules:
  - record: bench:up:max
    expr: max without (shard, replica) (up)
"""
#: The silent tenth's last sample is this long before the start: past the 50 s gpu bound.
SILENT_FOR_S = 60
#: Prometheus' lookback: the silent copies leave it (and the shape changes) after this.
LOOKBACK_S = 300
#: Evaluations a part's reported time is the median of (half in each order, with a baseline).
MEDIAN_OF = 8
#: Series per remote-write request.
BATCH = 20_000
#: Live pushes per interval, each of a slice of the series.
SPREAD = 5
#: The one group all versions' rules run in (see :func:`sequenced`).
SEQUENCE = "bench-sequence"
HEARTBEAT = "gpufed_child_heartbeat"
HEARTBEAT_JOB = "gpufed-heartbeat"
#: Children (shards) a region, one heartbeat each; the shipped spec's 12 nodes a child give
#: about 1,400 a region at 100,000 targets.
SHARDS_PER_REGION = 200


def series_labels(
    *, targets: int, replicas: int, shards_per_region: int = SHARDS_PER_REGION
) -> tuple[list[bytes], list[bytes]]:
    """(live, silent) series' encoded labels: every tenth target is silent.

    Each child also sends its heartbeat (``gpufed_child_heartbeat``, see
    ``sharder.children.render``): silent for a shard whose every target is silent (a tenth
    of the shards when ``shards_per_region`` is a multiple of 10), as a dead child's would be.
    """
    live: list[bytes] = []
    silent: list[bytes] = []
    shard_live: dict[tuple[str, str], bool] = {}
    for i in range(targets):
        region, shard = f"r{i % 3}", f"r{i % 3}-{i % shards_per_region}"
        labels = {"__name__": "up", "cluster": "bench", "region": region, "shard": shard,
                  "job": "gpu", "instance": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:9400",
                  "node": f"n{i}"}
        shard_live[(region, shard)] = shard_live.get((region, shard), False) or i % 10 != 0
        for replica in range(replicas):
            copy = labels | {"replica": str(replica)} if replicas > 1 else labels
            (silent if i % 10 == 0 else live).append(remote_write.encode_labels(copy))
    for (region, shard), alive in sorted(shard_live.items()):
        for replica in range(replicas):
            beat = {"__name__": HEARTBEAT, "cluster": "bench", "region": region, "shard": shard,
                    "job": HEARTBEAT_JOB, "instance": f"{shard}-r{replica}"}
            if replicas > 1:
                beat["replica"] = str(replica)
            (live if alive else silent).append(remote_write.encode_labels(beat))
    return live, silent


def push(client: httpx.Client, url: str, series: list[bytes], *, at_s: float) -> None:
    for batch in remote_write.batches(series, BATCH):
        body = remote_write.write_request(batch, value=1.0, timestamp_ms=int(at_s * 1000))
        answer = client.post(url, content=remote_write.snappy_literal(body), headers=remote_write.HEADERS)
        answer.raise_for_status()


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def started_at(stamp: str) -> float:
    """Unix seconds of an API ``lastEvaluation`` (Go's RFC 3339 with up to 9 fraction digits)."""
    match = _RFC3339.match(stamp)
    if match is None:
        return 0.0
    whole = datetime.datetime.fromisoformat(match[1] + match[3].replace("Z", "+00:00"))
    return whole.timestamp() + float(match[2] or 0)


def _timing(group: dict[str, Any]) -> dict[str, Any]:
    """Prometheus' own last evaluation time of the group and of each rule in it."""
    rules = {str(rule.get("name")): round(float(rule["evaluationTime"]), 4) for rule in group["rules"]}
    return {"evaluation_s": round(float(group["evaluationTime"]), 4), "rules": rules,
            "median_of": int(group.get("evaluations", 1)), "fastest_s": round(float(group["fastest"]), 4)}


def _median(evaluations: list[dict[str, Any]]) -> dict[str, Any]:
    """One group as the API shows it, its times the median over ``evaluations`` (oldest first)."""
    last = evaluations[-1]
    rules = [
        rule | {"evaluationTime": statistics.median(
            float(e["rules"][i]["evaluationTime"]) for e in evaluations)}
        for i, rule in enumerate(last["rules"])
    ]
    time_s = statistics.median(float(e["evaluationTime"]) for e in evaluations)
    fastest = min(float(e["evaluationTime"]) for e in evaluations)
    return last | {"rules": rules, "evaluationTime": time_s, "evaluations": len(evaluations),
                   "fastest": fastest}


def _seconds(groups: list[dict[str, Any]], *, kind: str, key: str = "evaluationTime") -> float:
    total = sum(float(g[key]) for g in groups if _kind(str(g["name"])) == kind)
    return max(total, 1e-9)


def _kind(name: str) -> str:
    if name == "anchor-raw-up":
        return "anchor"
    return "baseline" if name.startswith("baseline-") else "rules"


def sequenced(parts: list[str]) -> tuple[str, dict[str, str]]:
    """One rule file whose one group runs every part's rules in turn, and each rule's own group.

    Groups evaluate concurrently, each at an offset in the interval hashed from its name and
    its file (here a new temporary path, so a new offset every run). As separate groups, the
    rule file's evaluation overlapped the anchor's or the baseline's in some runs and not in
    others, and a pair of identical files timed 0.76-1.05x. In one group the rules run one
    after another at one timestamp, each part's in its own order (a rule still reads the
    records above it), so no part shares the cores with another. The place in the sequence
    still counts (an identical copy timed 1.47x slower first than second, in one run under
    load), so the bench times half its evaluations in each order (a reload between).
    """
    rules: list[dict[str, Any]] = []
    part_of: dict[str, str] = {}
    for text in parts:
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                rules.append(rule)
                part_of[str(rule.get("record") or rule.get("alert"))] = str(group["name"])
    text = yaml.safe_dump({"groups": [{"name": SEQUENCE, "rules": rules}]}, sort_keys=False, width=4096)
    return text, part_of


def split_parts(evaluation: dict[str, Any], part_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """One evaluation of the sequence as one group per part, as the API would show each alone."""
    by_part: dict[str, list[dict[str, Any]]] = {}
    for rule in evaluation["rules"]:
        by_part.setdefault(part_of[str(rule["name"])], []).append(rule)
    return {
        name: {"name": name, "rules": rules, "evaluationTime": sum(float(r["evaluationTime"]) for r in rules)}
        for name, rules in sorted(by_part.items())
    }


def whole(group: dict[str, Any], *, since: float) -> bool:
    """An evaluation that started at ``since`` or later and ran every rule of the group.

    Right after a reload the API shows the new group with the old one's last evaluation and
    rules that have not run yet (no time), which is no evaluation at all.
    """
    began = started_at(str(group.get("lastEvaluation", "")))
    ran = (started_at(str(rule.get("lastEvaluation", ""))) for rule in group["rules"])
    return began >= since and all(at >= began - 1e-3 for at in ran)


def renamed_baseline(text: str) -> str:
    """The baseline's records and group under names of their own, so both versions run side by side."""
    return text.replace("gpufed:", "baseline:").replace("- name: ", "- name: baseline-")


def run_freshness_bench(
    *, targets: int = 100_000, replicas: int = 1, minutes: float = 3.0, rules: Path = RULES,
    baseline: Path | None = BASELINE, shards_per_region: int = SHARDS_PER_REGION,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufed-bench-freshness-"))
    proc = None
    try:
        parts = [rules.read_text(encoding="utf-8"), ANCHOR]
        orders = [parts]
        if baseline is not None:
            before = renamed_baseline(baseline.read_text(encoding="utf-8"))
            orders = [[before, *parts], [parts[0], before, parts[1]]]
        sequences = [sequenced(order) for order in orders]
        part_of = sequences[0][1]
        order_of = {tuple(names): k for k, (_, names) in enumerate(sequences)}  # rules in order
        (root / "sequence.yml").write_text(sequences[0][0], encoding="utf-8")
        (root / "prometheus.yml").write_text(
            f"global: {{evaluation_interval: {INTERVAL_S}s}}\nrule_files: [sequence.yml]\n", encoding="utf-8")
        live, silent = series_labels(targets=targets, replicas=replicas, shards_per_region=shards_per_region)
        port = free_port()
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d",
             "--web.enable-remote-write-receiver"],
            stdout=subprocess.DEVNULL, stderr=(root / "prometheus.log").open("w"))
        base = f"http://127.0.0.1:{port}"
        write = f"{base}/api/v1/write"
        with httpx.Client(timeout=120) as client:
            wait_until(lambda: client.get(f"{base}/-/ready").status_code == 200, timeout=120,
                       what="prometheus ready", interval=0.5)
            start = time.time()
            started = time.perf_counter()
            samples = int(minutes * 60 // INTERVAL_S)
            for k in range(samples, 0, -1):
                at = start - k * INTERVAL_S
                push(client, write, live + silent if at <= start - SILENT_FOR_S else live, at_s=at)
            load_s = time.perf_counter() - started
            # Every group has then evaluated at least once over the whole history.
            measure_from = time.time() + 2 * INTERVAL_S
            until = start - SILENT_FOR_S + LOOKBACK_S - INTERVAL_S
            # One evaluation's time swings 1.6x with the same rules on shared cores: keep every
            # evaluation that counts and report the median per group.
            seen: list[dict[str, dict[str, Any]]] = [{} for _ in orders]
            per_order, current = MEDIAN_OF // len(orders), 0
            # A fifth of the live series every 3 s (each still every 15 s): ingest runs all the
            # time, as the children's remote_write does, instead of one burst per interval in
            # step with the evaluations, which slowed whichever rule it met.
            slices = [live[i::SPREAD] for i in range(SPREAD)]
            next_push, turn = time.time(), 0
            while time.time() < until:
                if time.time() >= next_push:
                    push(client, write, slices[turn % SPREAD], at_s=time.time())
                    next_push, turn = next_push + INTERVAL_S / SPREAD, turn + 1
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    for g in client.get(f"{base}/api/v1/rules").json()["data"]["groups"]:
                        order = order_of.get(tuple(str(r["name"]) for r in g["rules"]))
                        if order is not None and whole(g, since=measure_from):
                            seen[order][str(g["lastEvaluation"])] = g
                if len(seen[current]) >= per_order:
                    if current == len(orders) - 1:
                        break
                    # The other order: same group, same file, so the same offset and records.
                    current += 1
                    (root / "sequence.yml").write_text(sequences[current][0], encoding="utf-8")
                    proc.send_signal(signal.SIGHUP)
                    measure_from = time.time()
                time.sleep(max(0.0, next_push - time.time()))
            if not seen[0]:
                raise RuntimeError("the rule group never evaluated after the history was in")
            evaluations = [split_parts(g, part_of) for by_time in seen for g in by_time.values()]
            groups = [_median([e[name] for e in evaluations]) for name in evaluations[0]]

            def count(expr: str) -> int:
                rows = client.get(f"{base}/api/v1/query", params={"query": f"count({expr})"}).json()
                result = rows["data"]["result"]
                return int(float(result[0]["value"][1])) if result else 0

            ratio = round(_seconds(groups, kind="rules") / _seconds(groups, kind="anchor"), 1)
            compared: dict[str, Any] = {}
            if baseline is not None:
                compared = {
                    "baseline": _shown(baseline),
                    "baseline_s": round(_seconds(groups, kind="baseline"), 4),
                    "rules_s": round(_seconds(groups, kind="rules"), 4),
                    "speedup": round(_seconds(groups, kind="baseline") / _seconds(groups, kind="rules"), 2),
                    # The least disturbed evaluation of each: on shared cores the median carries
                    # whatever else ran at the time.
                    "speedup_fastest": round(_seconds(groups, kind="baseline", key="fastest")
                                             / _seconds(groups, kind="rules", key="fastest"), 2),
                    "baseline_unknown_targets": count("baseline:target_unknown:bool"),
                    # Series each group keeps in the head: memory, whatever the CPU does.
                    "baseline_record_series": count('{__name__=~"baseline:.+"}'),
                }
            return compared | {
                "targets": targets,
                "replicas": replicas,
                "up_series": targets * replicas,
                "heartbeat_series": len(live) + len(silent) - targets * replicas,
                "shards_per_region": shards_per_region,
                "samples_per_target": samples,
                "prometheus": _version(client, base),
                "rules": _shown(rules),
                "groups": {str(g["name"]): _timing(g) for g in groups},
                "freshness_vs_raw_up": ratio,
                "unknown_targets": count("gpufed:target_unknown:bool"),
                "record_series": count('{__name__=~"gpufed:.+"}'),
                "fresh_up_targets": count("gpufed:target_up:fresh == 1"),
                "prepare_s": round(load_s, 1),
                # Evaluations timed in each order (baseline first, then the rule file first).
                "evaluations_per_order": [len(by_time) for by_time in seen],
            }
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _version(client: httpx.Client, base: str) -> str:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        return str(client.get(f"{base}/api/v1/status/buildinfo").json()["data"]["version"])
    return "unknown"


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rules", type=Path, default=RULES)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--shards-per-region", type=int, default=SHARDS_PER_REGION)
    args = parser.parse_args()
    print(json.dumps(run_freshness_bench(targets=args.targets, replicas=args.replicas, minutes=args.minutes,
                                         rules=args.rules, baseline=args.baseline,
                                         shards_per_region=args.shards_per_region), sort_keys=True))


if __name__ == "__main__":
    main()
