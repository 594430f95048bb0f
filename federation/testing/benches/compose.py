"""``gpufed bench compose``: the rendered compose tier and N ``compose/node.yml`` copies, run for
real by the compose runner (``federation.testing.harnesses.composerun``), read at the master.

The steps are separate functions so the suite's test reads the same run the same way:
``render`` (``gpufed render --target compose``, an empty inventory: compose nodes register
themselves), ``env_files`` (the monitoring env file filled as a user fills it; node values),
``targets_up`` (every node's ``gpu`` and ``node`` targets, ``up == 1`` at the master),
``alerts_delivered`` (messages the DingTalk stand-in accepted), ``rules_loaded`` (the
master's rule groups against the rendered rule files) and ``kill_child`` (``kill -9``, then
the restart policy's new process, and its targets scraped again).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from federation.localrun.waiting import wait_until
from federation.testing.harnesses.composerun.plan import ComposeRunError, env_lines
from federation.testing.harnesses.composerun.run import ComposeRun

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "compose" / "federation.yaml"
NODE_FILE = ROOT / "compose" / "node.yml"
NODE_ENV = ROOT / "compose" / "node.env.example"


def render(spec: Path, where: Path, *, check: bool = True) -> Path:
    """``gpufed render --target compose`` as compose/README.md runs it (no inventory: compose nodes
    register themselves) into ``where/current``, a render root holding only rendered trees.
    ``check=False``: ``--no-check``, for a spec whose paths are the containers' (TLS files)."""
    where.mkdir(parents=True, exist_ok=True)
    gpufed = Path(sys.executable).parent / "gpufed"
    out = where / "current"
    argv = [str(gpufed), "render", "--spec", str(spec), "--out", str(out), "--target", "compose", "--json",
            *([] if check else ["--no-check"])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise ComposeRunError(f"gpufed render failed: {done.stderr.strip() or done.stdout.strip()}")
    return out


def critical_xid_codes(out: Path) -> frozenset[int]:
    """The XID codes the rendered rule pack's critical GPUXidError names (10 s group_wait, not 30 s)."""
    codes: set[int] = set()
    for file in sorted((out / "master" / "rules").glob("*.yml")):
        for group in (yaml.safe_load(file.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                if (
                    rule.get("alert") == "GPUXidError"
                    and rule.get("labels", {}).get("severity") == "critical"
                ):
                    found = re.search(r'xid=~"([0-9|]+)"', rule["expr"])
                    codes |= {int(c) for c in found[1].split("|")} if found else set()
    return frozenset(codes)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env_files(out: Path, spec: Path, *, nodes: int, where: Path) -> tuple[Path, list[dict[str, str]]]:
    """The monitoring env file (every required value set, published ports free) and node values."""
    example = out / "compose" / ".env.example"
    token = secrets.token_hex(16)
    values: dict[str, str] = {}
    for line in example.read_text().splitlines():
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#"):
            continue
        if "PORT" in key:
            values[key] = str(_free_port())
        elif not value and not key.endswith("_FLAGS"):
            values[key] = secrets.token_hex(12)
    values.update({"GPUFED_SPEC": str(spec), "GPUFED_TOKEN": token})
    env = where / "monitoring.env"
    env.write_text(env_lines(example, values))
    loaded = yaml.safe_load(spec.read_text())
    regions = [r["name"] for r in loaded["regions"]]
    node_values = [
        {
            "NODE_NAME": f"gpu-node-{i:03d}",
            "GPUFED_CLUSTER": str(loaded["cluster"]),
            "GPUFED_REGION": regions[i % len(regions)],
            "GPUFED_RACK": f"rack-{i // 4:02d}",
            "GPUFED_TEAM": "llm",
            "GPUFED_CONTROLLER_URL": "http://gpufed-controller:8080",
            "GPUFED_REGISTER_TOKEN": token,
        }
        for i in range(nodes)
    ]
    return env, node_values


#: A client certificate's context and the server name it checks: how a caller reaches a
#: compose run whose servers require TLS (the spec's ``tls`` section with ``serve``).
Client = tuple[ssl.SSLContext, str]


def query(run: ComposeRun, expr: str, master: str = "master-prometheus-0", *,
          tls: Client | None = None) -> list[dict[str, Any]]:
    context, name = tls if tls is not None else (None, None)
    status, body = run.http_get(master, 9090, f"/api/v1/query?query={quote(expr)}", tls=context,
                                hostname=name)
    if status != 200:
        raise ComposeRunError(f"{master} answered {status} to {expr}: {body[:200]!r}")
    return list(json.loads(body)["data"]["result"])


def node_addresses(run: ComposeRun) -> dict[str, str]:
    return {
        p.display.split("/")[0]: run.address(p.display)
        for p in run.planned.values()
        if p.display.endswith("/gpufed-exporter")
    }


def targets_up(run: ComposeRun, master: str = "master-prometheus-0", *,
               tls: Client | None = None) -> dict[str, Any]:
    """Each node's ``gpu`` (:9400) and ``node`` (:9100) target with ``up == 1`` at the master."""
    expected = {
        f"{address}:{port}": job
        for address in node_addresses(run).values()
        for job, port in (("gpu", 9400), ("node", 9100))
    }
    up = {
        (s["metric"].get("instance"), s["metric"].get("job"))
        for s in query(run, 'up{job=~"gpu|node"} == 1', master, tls=tls)
    }
    missing = sorted(f"{job} {instance}" for instance, job in expected.items() if (instance, job) not in up)
    return {
        "targets_expected": len(expected),
        "targets_up_at_master": len(expected) - len(missing),
        "missing": missing,
    }


def alerts_delivered(run: ComposeRun) -> list[dict[str, Any]]:
    """Every message the DingTalk stand-in accepted (the JSON the relay posted), in order."""
    return [m["body"] for m in run.dingtalk_messages()["messages"]]


def rules_loaded(run: ComposeRun, out: Path, master: str = "master-prometheus-0") -> dict[str, Any]:
    """The master's rule groups against the groups of the rendered rule files it names."""
    config = yaml.safe_load((out / "master" / "prometheus.yml").read_text())
    rendered: set[str] = set()
    for pattern in config.get("rule_files", []):  # relative to the config file, as Prometheus reads them
        local = out / "master" / pattern
        for file in sorted(local.parent.glob(local.name)):
            rendered |= {g["name"] for g in (yaml.safe_load(file.read_text()) or {}).get("groups", [])}
    status, body = run.http_get(master, 9090, "/api/v1/rules")
    groups = json.loads(body)["data"]["groups"] if status == 200 else []
    loaded = {g["name"] for g in groups}
    return {
        "rule_groups_rendered": len(rendered),
        "rule_groups_loaded": len(loaded & rendered),
        "rules_loaded": sum(len(g["rules"]) for g in groups),
        "missing_groups": sorted(rendered - loaded),
    }


def child_targets(run: ComposeRun, child: str) -> list[dict[str, Any]]:
    status, body = run.http_get(child, 9090, "/api/v1/targets?state=active")
    return list(json.loads(body)["data"]["activeTargets"]) if status == 200 else []


def wait(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 2.0) -> Any:
    """``check()``'s first truthy answer (the run's errors while services start count as "not
    yet"); after ``timeout``, ComposeRunError naming ``what`` and the last answer."""
    return wait_until(lambda: check() or None, timeout=timeout, what=what, interval=interval,
                      retry_on=(OSError, ComposeRunError, ValueError, KeyError), fail=ComposeRunError)


def kill_service(run: ComposeRun, display: str, *, timeout: float) -> dict[str, Any]:
    """``kill -9`` a service's process and wait until its restart policy has started a new one."""
    state = run.state(display)
    before, starts = state.pids[-1], len(state.pids)
    os.kill(before, signal.SIGKILL)
    killed_at = time.time()
    wait(
        lambda: len(state.pids) > starts and state.running,
        timeout=timeout,
        what=f"{display} restarted",
        interval=0.2,
    )
    return {
        "old_pid": before,
        "new_pid": state.pids[-1],
        "exit_code": state.exits[-1].code if state.exits else None,
        "killed_at": killed_at,
        "restarted_at": state.started_at[-1],
        "restart_s": round(state.started_at[-1] - killed_at, 2),
    }


def kill_child(run: ComposeRun, child: str, *, timeout: float) -> dict[str, Any]:
    """``kill -9`` the child's process and wait until its restart policy has started a new one."""
    instances = sorted(t["labels"]["instance"] for t in child_targets(run, child))
    return {"child_killed": child, **kill_service(run, child, timeout=timeout), "child_targets": instances}


def scraped_again(run: ComposeRun, killed: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """The restarted child scrapes its targets again, and the master has their ``up`` from after it."""
    child, instances, since = killed["child_killed"], set(killed["child_targets"]), killed["restarted_at"]

    def at_child() -> bool:
        fresh = {
            t["labels"]["instance"]
            for t in child_targets(run, child)
            if t["health"] == "up" and _after(t.get("lastScrape", ""), since)
        }
        return bool(instances) and instances <= fresh

    wait(at_child, timeout=timeout, what=f"{child}'s targets scraped after the restart")

    def at_master() -> bool:
        got = query(run, f'timestamp(up{{instance=~"{"|".join(sorted(instances))}"}} == 1)')
        return {s["metric"]["instance"] for s in got if float(s["value"][1]) > since} >= instances

    wait(at_master, timeout=timeout, what=f"{child}'s targets up at the master after the restart")
    return {
        "child_targets_up_again": len(instances),
        "targets_up_again_s": round(time.time() - killed["killed_at"], 1),
    }


def _after(stamp: str, epoch: float) -> bool:
    """Whether an RFC 3339 time from Prometheus (nanoseconds, any offset) is after ``epoch``."""
    from datetime import datetime

    found = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp or "")
    if not found:
        return False
    whole = datetime.fromisoformat(found[1] + ("+00:00" if found[3] == "Z" else found[3])).timestamp()
    return whole + float(found[2] or 0) > epoch


def cpu_seconds(run: ComposeRun) -> dict[str, float]:
    """CPU the run's live processes used so far (utime + stime from /proc), per service name
    (a node.yml service summed over the copies)."""
    ticks = os.sysconf("SC_CLK_TCK")
    by_service: dict[str, float] = {}
    for p in run.planned.values():
        if p.process is None or p.process.pid is None:
            continue
        try:
            fields = Path(f"/proc/{p.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = f"node.yml/{p.service.name}" if "/" in p.display else p.display
        by_service[name] = by_service.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return {k: round(v, 1) for k, v in sorted(by_service.items())}


def run_compose_bench(
    *,
    nodes: int,
    spec: Path | None = None,
    timeout: float = 240.0,
    say: Callable[[str], None] = lambda line: None,
    keep: Path | None = None,
    profiles: tuple[str, ...] = (),
) -> dict[str, Any]:
    where = Path(tempfile.mkdtemp(prefix="gpufed-compose-")) if keep is None else keep
    spec = (spec or SPEC).resolve()
    started = time.monotonic()
    load_before = os.getloadavg()
    try:
        out = render(spec, where / "render")
        env, node_values = env_files(out, spec, nodes=nodes, where=where)
        run = ComposeRun(
            monitoring=out / "compose" / "monitoring.yml",
            monitoring_env=env,
            node_file=NODE_FILE,
            node_env_example=NODE_ENV,
            nodes=node_values,
            workdir=where / "run",
            say=say,
            profiles=profiles,
            xid_codes=critical_xid_codes(out) or None,
        )
        with run:
            summary = run.summary()
            up_s = round(time.monotonic() - started, 1)
            targets = wait(
                lambda: (lambda t: t if not t["missing"] else None)(targets_up(run)),
                timeout=timeout,
                what="every node's targets up at the master",
            )
            targets_s = round(time.monotonic() - started, 1)
            # the restart runs while the XID travels: a child that does not scrape the XID's node
            victim = quiet_child(run)
            steady_from, cpu_from = time.monotonic(), cpu_seconds(run)
            killed = kill_child(run, victim, timeout=timeout)
            delivered = wait(
                lambda: [m for m in alerts_delivered(run) if "GPUXidError" in json.dumps(m)],
                timeout=timeout,
                what="GPUXidError at the DingTalk stand-in",
            )
            alert_s = round(time.monotonic() - started, 1)
            again = scraped_again(run, killed, timeout=timeout)
            rules = rules_loaded(run, out)
            health = run.health()
            cpu = cpu_seconds(run)
            # running, not starting: CPU from every node's targets up to here, the killed child left out
            steady = sum(v - cpu_from.get(k, 0.0) for k, v in cpu.items() if k != victim)
            steady_cores = round(steady / (time.monotonic() - steady_from), 3)
            result = {
                **{k: v for k, v in targets.items() if k != "missing"},
                **rules,
                **again,
                **{k: killed[k] for k in ("child_killed", "old_pid", "new_pid", "exit_code", "restart_s")},
                "alerts_delivered": len(delivered),
                "services_healthy": sum(1 for v in health.values() if v == "healthy"),
                "not_healthy": {k: v for k, v in sorted(health.items()) if v != "healthy"},
                "nodes": nodes,
                "services_real": summary["services_real"],
                "services_standin": summary["services_standin"],
                "services_left_out": summary["services_left_out"],
                "notes": summary["notes"],
                "overrides": summary["overrides"],
                "versions": summary["versions"],
                "xid": summary["xid"],
                "up_s": up_s,
                "targets_up_s": targets_s,
                "alert_s": alert_s,
                "total_s": round(time.monotonic() - started, 1),
                "cpu_s_services": round(sum(cpu.values()), 1),
                "cpu_s_by_service": cpu,
                "cores_running": steady_cores,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        leftovers = run.network.existing()
        result["leftover_namespaces"] = leftovers
        return result
    finally:
        if keep is None:
            shutil.rmtree(where, ignore_errors=True)


def quiet_child(run: ComposeRun) -> str:
    """The child with the most targets among those that do not scrape the planned XID's node."""
    xid_address = node_addresses(run).get(str(run.xid.get("node")), "")
    children = [
        p.display for p in run.planned.values() if p.display.startswith("child-") and p.kind == "real"
    ]
    scraping = {
        c: {t["labels"]["instance"].rpartition(":")[0] for t in child_targets(run, c)} for c in children
    }
    quiet = [c for c in children if xid_address not in scraping[c]] or children
    if not quiet:
        raise ComposeRunError("no child Prometheus runs")
    return max(quiet, key=lambda c: (len(scraping[c]), c))
