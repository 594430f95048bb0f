"""Drive a real `gpufed-exporter` process and measure it from outside; print JSON.

Starts the exporter (the command after `--`) on a free loopback port, then: time to
/readyz; one scrape right after ready and one after the idle window (GPM needs two
collections); one under `--load` (a command run in the background, e.g. a matmul loop) and
one after `--xid` (a command that faults the GPU); per-thread CPU of the exporter over an
idle window with no scrapes; client latency p50/p99 and process CPU over `--scrapes`
keep-alive scrapes; RSS; SIGTERM to exit time. Scraped texts land in `--out`.
Used for docs/measured-h100.md; with `-- gpufed-exporter --backend simulated` it runs
anywhere.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def task_cpu(pid: int) -> dict[int, dict[str, Any]]:
    """Per-thread utime+stime (s), state and wait channel from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            wchan = (task / "wchan").read_text().strip()
        except OSError:
            continue
        out[int(task.name)] = {"cpu_s": (int(fields[11]) + int(fields[12])) / TICK, "state": fields[0],
                               "wchan": wchan}
    return out


def process_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory(pid: int) -> dict[str, float]:
    wanted = ("VmRSS", "VmHWM", "Threads")
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            number = int(value.split()[0])
            out[key] = number if key == "Threads" else round(number / 1024, 1)
    return out


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {proc.returncode}")
        try:
            if get(port, "/readyz")[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("exporter not ready in time")


def scrape_to(port: int, path: Path) -> int:
    status, body = get(port, "/metrics")
    path.write_bytes(body)
    return status


def scrape_run(pid: int, port: int, scrapes: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies = []
    cpu0 = process_cpu(pid)
    for _ in range(scrapes):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        latencies.append((time.perf_counter() - t0) * 1000)
    cpu = process_cpu(pid) - cpu0
    conn.close()
    ordered = sorted(latencies)
    return {"scrapes": scrapes, "p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[round(0.99 * (len(ordered) - 1))], 3), "max_ms": round(ordered[-1], 3),
            "exporter_cpu_ms_per_scrape": round(cpu / scrapes * 1000, 4)}


def xid_series(text: str) -> list[str]:
    return [line for line in text.splitlines() if "xid" in line.lower() and not line.startswith("#")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle per-thread CPU window")
    parser.add_argument("--load", default="", help="background load command")
    parser.add_argument("--load-settle", type=float, default=6.0)
    parser.add_argument("--xid", default="", help="command that should raise an XID")
    parser.add_argument("exporter", nargs=argparse.REMAINDER, help="-- exporter command")
    args = parser.parse_args()
    command = [part for part in args.exporter if part != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    result: dict[str, Any] = {"command": shlex.join([*command, "--listen", f"127.0.0.1:{port}"])}
    with (args.out / "exporter.log").open("wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen([*command, "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=log)
        try:
            result["ready_s"] = round(wait_ready(port, proc, 60), 3)
            result["after_start"] = memory(proc.pid)
            result["scrape_idle_status"] = scrape_to(port, args.out / "metrics-idle.prom")
            before, cpu0 = task_cpu(proc.pid), process_cpu(proc.pid)
            time.sleep(args.idle)
            after, cpu1 = task_cpu(proc.pid), process_cpu(proc.pid)
            result["idle_window_s"] = args.idle
            # The first scrape follows the first collection: GPM (two samples) is not there yet.
            # This one, after the idle window, is what to compare with the simulated backend.
            result["scrape_after_idle_status"] = scrape_to(port, args.out / "metrics-after-idle.prom")
            # Whole process: the per-read worker threads are gone by now, their CPU is not.
            result["idle_process_cpu_ms"] = round((cpu1 - cpu0) * 1000, 1)
            result["idle_threads"] = {
                str(tid): {**now, "cpu_ms": round((now["cpu_s"] - before[tid]["cpu_s"]) * 1000, 1)}
                for tid, now in sorted(after.items()) if tid in before
            }
            result["scrape_run"] = scrape_run(proc.pid, port, args.scrapes)
            if args.load:
                load = subprocess.Popen(shlex.split(args.load), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
                time.sleep(args.load_settle)
                result["scrape_load_status"] = scrape_to(port, args.out / "metrics-load.prom")
                result["scrape_run_under_load"] = scrape_run(proc.pid, port, args.scrapes)
                output, _ = load.communicate(timeout=120)
                result["load_output"] = output.decode(errors="replace")[-2000:]
            if args.xid:
                done = subprocess.run(shlex.split(args.xid), capture_output=True, timeout=120, check=False)
                result["xid_cmd"] = {"rc": done.returncode,
                                     "output": (done.stdout + done.stderr).decode(errors="replace")[-1500:]}
                seen: list[str] = []
                waited = time.monotonic()
                while time.monotonic() - waited < 10:
                    text = get(port, "/metrics")[1].decode()
                    seen = [s for s in xid_series(text) if s.startswith("gpufed_gpu_xid_errors_total")]
                    if seen:
                        break
                    time.sleep(0.25)
                (args.out / "metrics-xid.prom").write_text(text)
                result["xid_series"] = xid_series(text)
                result["xid_seen_after_s"] = round(time.monotonic() - waited, 2) if seen else None
            result["before_stop"] = memory(proc.pid)
        finally:
            stop0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                result["exit_code"] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                result["exit_code"] = f"killed after 20 s (was {proc.wait()})"
            result["stop_s"] = round(time.monotonic() - stop0, 3)
            result["total_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
