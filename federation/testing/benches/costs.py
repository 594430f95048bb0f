"""``gpufed bench costs``: what a real Prometheus costs per series and per sample/s, fitted.

For each fleet size a simulated fleet (``exporter.fleet.FleetApp``, in this process, every
node on its own ``/nodes/<n>/metrics`` path) is scraped by one child Prometheus in agent
mode with the demo spec's ``gpu`` job keep list, which remote-writes to a server-mode
master (``--web.enable-remote-write-receiver``). After a settling time each process' RSS and
CPU are read from the OS (``federation.localrun.procstat``) and the series from their own
metrics (``prometheus_agent_active_series``, ``prometheus_tsdb_head_series``). A straight
line through the sizes gives MiB per 1,000 series (child and master) with an intercept; one
more run of the largest size at half the interval gives the child's extra MiB per 1,000
samples/s. The master runs with 1-minute blocks (``--storage.tsdb.min-block-duration``, a
hidden flag both lines have) so a real compacted block is cut within the run: its
``meta.json`` samples and its bytes give bytes per sample, hence disk per series-day.

The master also runs the shipped rule pack (``federation/rules/*.yml``, as the master bundle
carries it) every ``RULE_EVAL_S``: its memory is then part of the master's fit, and the sum of
``prometheus_rule_group_last_duration_seconds`` over the pack's groups, sampled once an
evaluation through the window (median), gives the seconds one evaluation of the pack takes;
a straight line through the sizes gives seconds per evaluation per 1,000 ingested series,
which ``gpufed size`` turns into the master's rule CPU at the spec's evaluation interval.

RSS is the median of one reading an evaluation through the window (the master's rises and
falls by a quarter with the rules' garbage). Memory is robust on a shared machine; CPU
(seconds over the window / samples per second) is printed but noisy when other work shares
the cores, so the committed figure is the worst run.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.localrun import procstat
from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until
from federation.master.render import load_rule_pack
from sharder.kernel.prometheus_versions import binary_release

#: The demo spec's gpu job keep list (federation/demo/default-spec.yaml).
KEEP = ["DCGM_FI_.*", "gpufed_.*", "up", "scrape_.*"]
#: The master's rule evaluation interval in the bench (the spec's default is 30 s; one
#: evaluation's seconds do not depend on it, and 15 s gives more evaluations to take a median of).
RULE_EVAL_S = 15
RULE_DURATION = "prometheus_rule_group_last_duration_seconds"


class CostsFailed(RuntimeError):
    """A Prometheus did not start or never reported its series."""


def _metric(client: httpx.Client, url: str, name: str) -> float:
    """The sum of ``name``'s samples on the process' own ``/metrics`` (the master scrapes nothing)."""
    total = 0.0
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _start(binary: str, args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([binary, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _fullest(data: Path, at_least: float) -> Path | None:
    """The compacted block with the most samples per series, when it has ``at_least``."""
    best, most = None, 0.0
    for block in data.glob("01*"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            stats = json.loads((block / "meta.json").read_text())["stats"]
            per = stats["numSamples"] / max(1, stats["numSeries"])
            if per > most:
                best, most = block, per
    return best if best is not None and most >= at_least else None


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(
    *, binary: str, major: int, nodes: int, gpus: int, interval_s: int, settle_s: float, work: Path
) -> dict[str, Any]:
    """One child and one master on ``nodes`` simulated nodes: RSS, CPU, series, samples/s, block bytes."""
    work.mkdir(parents=True)
    agent_flag = "--agent" if major >= 3 else "--enable-feature=agent"
    settings = ExporterSettings(backend="simulated", listen="127.0.0.1:0", gpus=gpus, first_xid=False)
    fleet = FleetApp(settings, fleet_nodes(nodes, regions=1))
    fleet.start()
    master_port, child_port = free_port(), free_port()
    master_url, child_url = f"http://127.0.0.1:{master_port}", f"http://127.0.0.1:{child_port}"
    (work / "targets.json").write_text(
        json.dumps(
            [
                {
                    "targets": [f"127.0.0.1:{fleet.http.port}"],
                    "labels": {"__metrics_path__": f"/nodes/{n}/metrics", "node": n},
                }
                for n in fleet.nodes
            ]
        )
    )
    child_config = {
        "global": {
            "scrape_interval": f"{interval_s}s",
            "scrape_timeout": f"{max(1, interval_s - 1)}s",
            "external_labels": {"shard": "bench-0"},
        },
        "scrape_configs": [
            {
                "job_name": "gpu",
                "file_sd_configs": [{"files": [str(work / "targets.json")]}],
                "metric_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "|".join(KEEP), "action": "keep"}
                ],
            }
        ],
        "remote_write": [
            {
                "url": f"{master_url}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "max_shards": 4},
            }
        ],
    }
    (work / "child.yml").write_text(yaml.safe_dump(child_config))
    rules = work / "rules"
    rules.mkdir()
    for name, data in load_rule_pack().items():
        (rules / name).write_bytes(data)
    master_config = {
        "global": {"scrape_interval": "60s", "evaluation_interval": f"{RULE_EVAL_S}s"},
        "rule_files": [str(rules / "*.yml")],
    }
    (work / "master.yml").write_text(yaml.safe_dump(master_config))
    client = httpx.Client(timeout=10)
    try:
        with _processes() as procs:
            procs.append(
                _start(
                    binary,
                    [
                        f"--config.file={work / 'master.yml'}",
                        f"--storage.tsdb.path={work / 'master'}",
                        f"--web.listen-address=127.0.0.1:{master_port}",
                        "--web.enable-remote-write-receiver",
                        "--storage.tsdb.min-block-duration=1m",
                        "--storage.tsdb.max-block-duration=1m",
                        "--storage.tsdb.retention.time=1d",
                    ],
                    work / "master.log",
                )
            )
            procs.append(
                _start(
                    binary,
                    [
                        agent_flag,
                        f"--config.file={work / 'child.yml'}",
                        f"--storage.agent.path={work / 'child'}",
                        f"--web.listen-address=127.0.0.1:{child_port}",
                    ],
                    work / "child.log",
                )
            )

            def ready() -> bool:
                for proc in procs:
                    if proc.poll() is not None:
                        raise CostsFailed(f"{binary} exited {proc.returncode}: see {work}")
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
                    return _metric(client, master_url, "prometheus_tsdb_head_series") >= nodes * 100
                return False

            wait_until(
                ready,
                timeout=float(os.environ.get("GPUFED_COSTS_START_S", "120")),
                what="the master's first series",
                fail=CostsFailed,
            )
            started = time.monotonic()
            appended0 = _metric(client, master_url, "prometheus_tsdb_head_samples_appended_total")
            cpu0 = {name: procstat.read(p.pid) for name, p in zip(("master", "child"), procs, strict=True)}
            # One reading an evaluation: the pack's groups summed (each group's last evaluation).
            # One reading an evaluation until the window is over and a full one-minute block is
            # cut (bytes per sample; the first block is cut at a minute boundary and may hold a
            # few seconds only): the pack's groups summed, and each process' RSS, whose Go heap
            # rises and falls with the rules' garbage: the fit takes the medians.
            full = 0.8 * 60 / interval_s
            rule_s: list[float] = []
            rss: dict[str, list[float]] = {"master": [], "child": []}
            while time.monotonic() - started < settle_s or (
                _fullest(work / "master", full) is None and time.monotonic() - started < settle_s + 150
            ):
                time.sleep(RULE_EVAL_S)
                with contextlib.suppress(httpx.HTTPError, ValueError, IndexError):
                    rule_s.append(_metric(client, master_url, RULE_DURATION))
                for name, proc in zip(("master", "child"), procs, strict=True):
                    reading = procstat.read(proc.pid)
                    if reading is not None:
                        rss[name].append(reading.rss_mib)
            block = _fullest(work / "master", 0.0)
            window = time.monotonic() - started
            now = {name: procstat.read(p.pid) for name, p in zip(("master", "child"), procs, strict=True)}
            appended = _metric(client, master_url, "prometheus_tsdb_head_samples_appended_total") - appended0
            figures: dict[str, Any] = {
                "nodes": nodes,
                "gpus": gpus,
                "interval_s": interval_s,
                "child_series": _metric(client, child_url, "prometheus_agent_active_series"),
                "master_series": _metric(client, master_url, "prometheus_tsdb_head_series"),
                "master_samples_per_s": round(appended / window, 1),
                # The master's head also holds the rules' records: the fit's x is what it ingests.
                "ingested_series": _metric(client, child_url, "prometheus_agent_active_series"),
                "rule_eval_s": round(statistics.median(rule_s), 4) if rule_s else None,
                "rule_eval_readings": len(rule_s),
            }
            for name in ("child", "master"):
                before, after = cpu0[name], now[name]
                if before is None or after is None:
                    raise CostsFailed(f"the {name} Prometheus is gone: see {work}")
                figures[f"{name}_rss_mib"] = round(statistics.median(rss[name] or [after.rss_mib]), 1)
                figures[f"{name}_rss_readings"] = len(rss[name])
                figures[f"{name}_cpu_cores"] = round((after.cpu_s - before.cpu_s) / window, 3)
            meta = json.loads((block / "meta.json").read_text())["stats"] if block else {}
            samples, series = meta.get("numSamples", 0), meta.get("numSeries", 0)
            figures["block_samples_per_series"] = round(samples / series, 1) if series else None
            figures["chunk_bytes_per_sample"] = (
                round(_dir_bytes(block / "chunks") / samples, 3) if block and samples else None
            )
            figures["index_bytes_per_series"] = (
                round((block / "index").stat().st_size / series, 1) if block and series else None
            )
            return figures
    finally:
        client.close()
        fleet.stop()


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares: (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


def _ingested(run: dict[str, Any]) -> float:
    """Series the master ingests (runs before the rule pack ran have only its head's count)."""
    return float(run.get("ingested_series") or run["master_series"])


def binary_version(binary: str) -> str:
    """The release ``prometheus --version`` names (never assumed from the path)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    release = binary_release(out.stdout + out.stderr)
    if release is None:
        raise CostsFailed(f"{binary} --version named no release: {out.stdout[:200]!r}")
    return str(release)


def fit_costs(all_runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Coefficients from the runs: the runs at the common (slowest) interval fit MiB per series; the
    run at half that interval adds MiB per sample/s; blocks of different lengths fit chunk bytes
    per sample (slope) and per series-chunk (intercept: a chunk's header and first sample)."""
    slowest = max(r["interval_s"] for r in all_runs)
    runs = sorted((r for r in all_runs if r["interval_s"] == slowest), key=lambda r: r["nodes"])
    fast = [r for r in all_runs if r["interval_s"] < slowest and r["nodes"] == runs[-1]["nodes"]]
    child_base, child_per = _fit([r["child_series"] / 1000 for r in runs], [r["child_rss_mib"] for r in runs])
    master_base, master_per = _fit(
        [_ingested(r) / 1000 for r in runs], [r["master_rss_mib"] for r in runs]
    )
    child_per_ksps = master_per_ksps = 0.0
    if fast:
        slow, quick = runs[-1], fast[0]
        extra = (quick["master_samples_per_s"] - slow["master_samples_per_s"]) / 1000
        if extra > 0:
            child_per_ksps = (quick["child_rss_mib"] - slow["child_rss_mib"]) / extra
            master_per_ksps = (quick["master_rss_mib"] - slow["master_rss_mib"]) / extra
    # The slope at one interval holds that interval's samples/s too: keep only the series' share.
    child_per -= max(0.0, child_per_ksps) / slowest
    master_per -= max(0.0, master_per_ksps) / slowest
    blocks = [r for r in all_runs if r.get("chunk_bytes_per_sample") and r.get("block_samples_per_series")]
    per_chunk, per_sample = (
        _fit(
            [r["block_samples_per_series"] for r in blocks],
            [r["chunk_bytes_per_sample"] * r["block_samples_per_series"] for r in blocks],
        )
        if len({r["block_samples_per_series"] for r in blocks}) > 1
        else (0.0, max((r["chunk_bytes_per_sample"] for r in blocks), default=0.0))
    )
    index = [r["index_bytes_per_series"] for r in all_runs if r.get("index_bytes_per_series")]
    evaluated = [r for r in all_runs if r.get("rule_eval_s") is not None]
    rule_base, rule_per = (
        _fit([_ingested(r) / 1000 for r in evaluated], [r["rule_eval_s"] for r in evaluated])
        if len({_ingested(r) for r in evaluated}) > 1
        else (0.0, 0.0)
    )
    per_k = [r for r in all_runs if r["master_samples_per_s"]]
    return {
        "coefficients": {
            "child_agent": {
                "base_mib": round(child_base, 1),
                "mib_per_1k_series": round(child_per, 3),
                "mib_per_1k_samples_per_s": round(max(0.0, child_per_ksps), 3),
            },
            "server": {
                "base_mib": round(master_base, 1),
                "mib_per_1k_series": round(master_per, 3),
                "mib_per_1k_samples_per_s": round(max(0.0, master_per_ksps), 3),
                "chunk_bytes_per_sample": round(per_sample, 3),
                "chunk_bytes_per_series_chunk": round(max(0.0, per_chunk), 1),
                "index_bytes_per_series_per_block": round(max(index, default=0.0), 1),
            },
        },
        "cpu_cores_per_1k_samples_per_s": {
            "child_agent": round(
                max(r["child_cpu_cores"] / (r["master_samples_per_s"] / 1000) for r in per_k), 4
            ),
            "server": round(
                max(r["master_cpu_cores"] / (r["master_samples_per_s"] / 1000) for r in per_k), 4
            ),
            "note": "the worst run; noisy where other work shares the cores (2 shared cores here)",
        },
        "rules": {
            "pack": sorted(load_rule_pack()),
            "eval_base_s": round(max(0.0, rule_base), 5),
            "eval_s_per_1k_series": round(max(0.0, rule_per), 6),
            "note": f"seconds one evaluation of the shipped rule pack takes at the master (sum of"
            f" {RULE_DURATION} over its groups, median of one reading an evaluation), per 1,000"
            " ingested series; the model divides by the spec's master.evaluation_interval",
        },
    }


def run_costs_bench(
    *, binary: str, sizes: Sequence[int], gpus: int = 8, interval_s: int = 10, settle_s: float = 45.0
) -> dict[str, Any]:
    """Measure every size (and the largest at half the interval), fit, return coefficients and runs."""
    if len(set(sizes)) < 2:
        raise CostsFailed(
            f"--sizes needs at least two different fleet sizes to fit a line, got {list(sizes)}"
        )
    version = binary_version(binary)
    major = int(version.split(".")[0])
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpufed-costs-") as tmp:
        for i, nodes in enumerate(sorted(sizes)):
            runs.append(
                measure(
                    binary=binary,
                    major=major,
                    nodes=nodes,
                    gpus=gpus,
                    interval_s=interval_s,
                    settle_s=settle_s,
                    work=Path(tmp) / f"run-{i}",
                )
            )
        fast = measure(
            binary=binary,
            major=major,
            nodes=max(sizes),
            gpus=gpus,
            interval_s=max(1, interval_s // 2),
            settle_s=settle_s,
            work=Path(tmp) / "run-fast",
        )
    all_runs = [*runs, fast]
    fitted = fit_costs(all_runs)
    return {
        "version": version,
        **fitted,
        "runs": all_runs,
        "measured_on": {
            "machine": f"{platform.machine()} {platform.node()}",
            "cpus": _cpus(),
            "date": datetime.date.today().isoformat(),
            "command": f"gpufed bench costs --stack {major} --sizes {','.join(map(str, sizes))}"
            f" --interval {interval_s} --settle {settle_s:g}",
        },
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


#: What ``costs.json`` keeps of a bench result, per release line.
ENTRY_KEYS = ("version", "coefficients", "cpu_cores_per_1k_samples_per_s", "rules", "runs", "measured_on")


def merge_costs(text: str | None, result: dict[str, Any]) -> str:
    """``costs.json`` (or a new one) with ``result``'s line replaced: what ``--into`` writes."""
    document: dict[str, Any] = json.loads(text) if text else {"about": "", "lines": {}}
    line = result["version"].split(".")[0]
    document["lines"][line] = {key: result[key] for key in ENTRY_KEYS}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"
