"""What the rule pack's freshness records cost a real Prometheus, as one JSON line.

``gpufed bench freshness [--targets 100000] [--minutes 3] [--rules FILE] [--baseline FILE] --json`` (also
``python -m federation.testing.benches.freshness``, which prints the JSON line itself):
writes ``up`` for TARGETS targets (15 s apart over the last MINUTES and the next 4
minutes, which the clock reaches before the measurement; a tenth of them silent for the
last 2 of those minutes, as a dead child leaves them) into a TSDB with
``promtool tsdb create-blocks-from openmetrics``, starts the ``prometheus`` first on PATH on it with the
rule file (default: the shipped ``federation/rules/freshness.yml``; any other version
to compare with, e.g. ``git show REV:federation/rules/freshness.yml``), lets it evaluate
every 15 s, and prints Prometheus' own rule group timing and what the records found,
against an anchor group of one plain ``max without (shard, replica) (up)`` (the raw read
the pack made before) in the same Prometheus.

Before and after in one run: the baseline rule file (default: ``freshness_baseline.yml``
next to this module, the freshness group as main shipped it at 43395dc) is
loaded into the same Prometheus with its records renamed (``gpufed:`` -> ``baseline:``,
group ``baseline-...``), so both versions evaluate the same series at the same interval
under the same load; ``speedup`` is the baseline's time over the rule file's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until

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
#: Samples are written up to now + AHEAD_S (the TSDB is built before Prometheus starts);
#: the measurement is read once the clock has passed them by READ_AFTER_S: the newest
#: sample is then fresh for the 50 s gpu bound, and the head takes the records' samples
#: (it refuses any older than the newest block).
AHEAD_S = 240
READ_AFTER_S = 35
#: Evaluations a group's reported time is the median of (the last ones before the read).
MEDIAN_OF = 7


def write_series(path: Path, *, targets: int, minutes: float, now: int) -> None:
    samples = int(minutes * 60 // INTERVAL_S)
    silent_from = now + AHEAD_S - 120  # 155 s old when read: silent, still in the lookback
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE up gauge\n")
        for i in range(targets):
            labels = (f'cluster="bench",region="r{i % 3}",shard="r{i % 3}-{i % 200}",job="gpu",'
                      f'instance="10.{i // 65536}.{i // 256 % 256}.{i % 256}:9400",node="n{i}"')
            # Live targets go on for AHEAD_S: queries at the evaluation time see what is due.
            for k in range(samples, -AHEAD_S // INTERVAL_S, -1):
                ts = now - k * INTERVAL_S
                if i % 10 == 0 and ts > silent_from:
                    break
                out.write(f"up{{{labels}}} 1 {ts}\n")
        out.write("# EOF\n")


def _timing(group: dict[str, Any]) -> dict[str, Any]:
    """Prometheus' own last evaluation time of the group and of each rule in it."""
    rules = {str(rule.get("name")): round(float(rule["evaluationTime"]), 4) for rule in group["rules"]}
    return {"evaluation_s": round(float(group["evaluationTime"]), 4), "rules": rules,
            "median_of": int(group.get("evaluations", 1))}


def _median(evaluations: list[dict[str, Any]]) -> dict[str, Any]:
    """One group as the API shows it, its times the median over ``evaluations`` (oldest first)."""
    last = evaluations[-1]
    rules = [
        rule | {"evaluationTime": statistics.median(
            float(e["rules"][i]["evaluationTime"]) for e in evaluations)}
        for i, rule in enumerate(last["rules"])
    ]
    time_s = statistics.median(float(e["evaluationTime"]) for e in evaluations)
    return last | {"rules": rules, "evaluationTime": time_s, "evaluations": len(evaluations)}


def _seconds(groups: list[dict[str, Any]], *, kind: str) -> float:
    total = sum(float(g["evaluationTime"]) for g in groups if _kind(str(g["name"])) == kind)
    return max(total, 1e-9)


def _kind(name: str) -> str:
    if name == "anchor-raw-up":
        return "anchor"
    return "baseline" if name.startswith("baseline-") else "rules"


def renamed_baseline(text: str) -> str:
    """The baseline's records and group under names of their own, so both versions run side by side."""
    return text.replace("gpufed:", "baseline:").replace("- name: ", "- name: baseline-")


def run_freshness_bench(
    *, targets: int = 100_000, minutes: float = 3.0, rules: Path = RULES, baseline: Path | None = BASELINE
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufed-bench-freshness-"))
    proc = None
    try:
        now = int(time.time())
        started = time.perf_counter()
        write_series(root / "up.om", targets=targets, minutes=minutes, now=now)
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "up.om"),
                        str(root / "data")], check=True, capture_output=True)
        (root / "up.om").unlink()
        load_s = time.perf_counter() - started
        shutil.copy(rules, root / "rules.yml")
        (root / "anchor.yml").write_text(ANCHOR, encoding="utf-8")
        files = ["rules.yml", "anchor.yml"]
        if baseline is not None:
            (root / "baseline.yml").write_text(renamed_baseline(baseline.read_text(encoding="utf-8")),
                                               encoding="utf-8")
            files.append("baseline.yml")
        (root / "prometheus.yml").write_text(
            f"global: {{evaluation_interval: {INTERVAL_S}s}}\nrule_files: [{', '.join(files)}]\n",
            encoding="utf-8")
        port = free_port()
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d"],
            stdout=subprocess.DEVNULL, stderr=(root / "prometheus.log").open("w"))
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=30) as client:

            def evaluated() -> bool:
                groups = client.get(f"{base}/api/v1/rules").json()["data"]["groups"]
                return bool(groups) and all(g.get("lastEvaluation", "").startswith("2") and
                                            not str(g["lastEvaluation"]).startswith("0001") for g in groups)

            with contextlib.suppress(TimeoutError):  # the figures below show what was evaluated
                wait_until(evaluated, timeout=300, what="every rule group evaluated", interval=2,
                           retry_on=(httpx.HTTPError, ValueError, KeyError))
            # One evaluation's time swings 1.6x with the same rules on shared cores: keep every
            # evaluation seen while waiting and report the median of the last few per group.
            seen: dict[str, dict[str, dict[str, Any]]] = {}
            while time.time() < now + AHEAD_S + READ_AFTER_S:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    for g in client.get(f"{base}/api/v1/rules").json()["data"]["groups"]:
                        seen.setdefault(str(g["name"]), {})[str(g["lastEvaluation"])] = g
                time.sleep(3)
            for g in client.get(f"{base}/api/v1/rules").json()["data"]["groups"]:
                seen.setdefault(str(g["name"]), {})[str(g["lastEvaluation"])] = g
            groups = [_median([g for t, g in by_time.items() if not t.startswith("0001")][-MEDIAN_OF:]
                              or list(by_time.values())) for by_time in seen.values()]

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
                    "baseline_unknown_targets": count("baseline:target_unknown:bool"),
                }
            return compared | {
                "targets": targets,
                "samples_per_target": int(minutes * 60 // INTERVAL_S),
                "rules": _shown(rules),
                "groups": {str(g["name"]): _timing(g) for g in groups},
                "freshness_vs_raw_up": ratio,
                "unknown_targets": count("gpufed:target_unknown:bool"),
                "fresh_up_targets": count("gpufed:target_up:fresh == 1"),
                "prepare_s": round(load_s, 1),
            }
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rules", type=Path, default=RULES)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    args = parser.parse_args()
    print(json.dumps(run_freshness_bench(targets=args.targets, minutes=args.minutes, rules=args.rules,
                                         baseline=args.baseline), sort_keys=True))


if __name__ == "__main__":
    main()
