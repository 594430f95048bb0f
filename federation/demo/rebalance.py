"""Add a shard to a running demo and measure, at the master, what the moved targets lost.

The scenario of the issue-13 proof and of ``gpufed bench gap``: with the fleet running,
``POST /v1/plan {"add_shard": [region]}`` then ``POST /v1/rebalance``; the demo's
follower starts the new shard's children; the run ends once every moved target is
scraped by exactly its new shard's children (their ``/api/v1/targets``) and the master
holds one more scrape interval of its samples. Then ``up`` and one GPU series of every
moved target are read back raw over the whole window and deduplicated as a dashboard
reads them (:mod:`federation.demo.gaps`).

With make-before-break (the default) the old child keeps scraping until the new one has
the target, so the largest gap stays within one scrape interval; ``gpufed serve
--no-handover`` (:func:`restart_controller`) drops it at once, as Prometheus Operator
and the OpenTelemetry target allocator do, and the gap is the new child's SD refresh,
discovery throttle and first scrape. Both are reported; callers decide what to assert.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from federation.demo import gaps, plan
from federation.demo.stack import DemoError, DemoStack
from federation.localrun.waiting import wait_until
from sharder.kernel.models import parse_duration

GPU_SERIES = "DCGM_FI_DEV_GPU_TEMP"
NO_HANDOVER = "--no-handover"


@dataclass
class RebalanceRun:
    mode: str
    region: str
    added_shards: list[str]
    moved: dict[str, dict[str, str]]
    """identity -> {node, from_shard, to_shard}."""
    scrape_interval_s: float
    window: tuple[float, float] = (0.0, 0.0)
    in_handover: int = 0
    """Moved targets the controller listed in ``/v1/handovers`` right after the rebalance:
    all of them with make-before-break, none with ``--no-handover``."""
    handovers_done_s: float = 0.0
    """From the rebalance to no hand-over of a moved target left in flight."""
    settled_s: float = 0.0
    """From the rebalance to every moved target scraped by exactly its new children."""
    scraped_by: dict[str, list[str]] = field(default_factory=dict)
    """node -> children scraping it when the run settled."""
    expected_children: dict[str, list[str]] = field(default_factory=dict)
    gaps: dict[str, dict[str, Any]] = field(default_factory=dict)
    """node -> {"up": Gap, "gpu": Gap} as dicts."""
    overlap_s: dict[str, float] = field(default_factory=dict)
    """node -> the old shard's last ``up`` sample minus the new shard's first: above 0 the
    two children scraped it at the same time (make-before-break), below 0 it is the gap."""

    @property
    def max_gap_s(self) -> float:
        return max((g["max_gap_s"] for per in self.gaps.values() for g in per.values()), default=0.0)

    def summary(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["max_gap_s"] = self.max_gap_s
        doc["moved_count"] = len(self.moved)
        return doc


def scrape_interval_s(stack: DemoStack) -> float:
    assert stack.spec is not None
    job = next(j for j in stack.spec.jobs if j.name == plan.JOB)
    return parse_duration(job.scrape_interval or stack.spec.children.scrape_interval)


def auth(stack: DemoStack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.token}"}


def assignment(stack: DemoStack) -> dict[str, dict[str, str]]:
    """identity -> {shard, node, region} from ``/v1/targets`` (paged)."""
    out: dict[str, dict[str, str]] = {}
    offset = 0
    while True:
        page = stack.http.get(f"{stack.controller_url}/v1/targets", params={"offset": offset, "limit": 1000})
        page.raise_for_status()
        body = page.json()
        for row in body["targets"]:
            out[row["identity"]] = {"shard": row["shard"], "node": row["node"], "region": row["region"]}
        offset += len(body["targets"])
        if not body["targets"] or offset >= body["total"]:
            return out


def shard_children(stack: DemoStack) -> dict[str, list[str]]:
    rows = stack.http.get(f"{stack.controller_url}/v1/shards").json()["shards"]
    return {row["shard"]: sorted(c["child"] for c in row["children"]) for row in rows}


def scraped_by(stack: DemoStack, job: str = plan.JOB) -> dict[str, set[str]]:
    """node -> running children whose active targets hold it (their own ``/api/v1/targets``)."""
    out: dict[str, set[str]] = {}
    for child in stack.running_children():
        response = stack.http.get(stack.url(stack.child_port(child), "/api/v1/targets"),
                                  params={"state": "active"})
        response.raise_for_status()
        for target in response.json()["data"]["activeTargets"]:
            labels = target["labels"]
            if labels.get("job") == job and "node" in labels:
                out.setdefault(labels["node"], set()).add(child)
    return out


def wait(check: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.5) -> None:
    wait_until(check, timeout=timeout, what=what, interval=interval,
               retry_on=(httpx.HTTPError, ValueError, KeyError), fail=DemoError)


def add_shard(stack: DemoStack, *, region: str, mode: str, timeout: float = 180.0) -> RebalanceRun:
    """Add one shard to ``region`` over REST and measure the moved targets' gaps."""
    interval = scrape_interval_s(stack)
    targets = assignment(stack)
    nodes = {i: row["node"] for i, row in targets.items()}
    # The window opens one interval before the change: only fair if every node of the
    # region was already reaching the master steadily (a stack that just became ready
    # has a few seconds of history, which would read as a gap at the window's start).
    wait_steady(stack, sorted(r["node"] for r in targets.values() if r["region"] == region),
                interval=interval, timeout=timeout)
    api, headers = stack.controller_url, auth(stack)
    started = time.time()
    planned = stack.http.post(f"{api}/v1/plan", json={"add_shard": [region], "reason": f"proof: {mode}"},
                              headers=headers)
    planned.raise_for_status()
    body = planned.json()
    applied = stack.http.post(f"{api}/v1/rebalance", json={"version": body["version"]}, headers=headers)
    applied.raise_for_status()
    if not applied.json().get("applied"):
        raise DemoError(f"the rebalance was not applied: {applied.json()}")
    applied_at = time.time()
    moved = {
        m["identity"]: {"node": nodes[m["identity"]], "from_shard": m["from_shard"],
                        "to_shard": m["to_shard"]}
        for m in body["moves"]
    }
    run = RebalanceRun(mode=mode, region=region, added_shards=list(body["added_shards"]), moved=moved,
                       scrape_interval_s=interval)
    if not moved:
        raise DemoError(f"adding a shard to {region} moved nothing; use more nodes")

    flying = stack.http.get(f"{api}/v1/handovers").json()["handovers"]
    run.in_handover = sum(1 for h in flying if h["identity"] in moved)

    def handed_over() -> bool:
        flying = stack.http.get(f"{api}/v1/handovers").json()["handovers"]
        return not any(h["identity"] in moved for h in flying)

    wait(handed_over, timeout=timeout, what="the moved targets' hand-overs to finish")
    run.handovers_done_s = round(time.time() - applied_at, 2)

    children = shard_children(stack)
    run.expected_children = {m["node"]: children[m["to_shard"]] for m in moved.values()}

    def settled() -> bool:
        now = scraped_by(stack)
        run.scraped_by = {node: sorted(now.get(node, set())) for node in run.expected_children}
        return run.scraped_by == run.expected_children

    wait(settled, timeout=timeout, what="every moved target scraped by exactly its new children")
    run.settled_s = round(time.time() - applied_at, 2)
    # One more interval shows the new children's samples going on after the old one let go.
    start, end = started - interval, time.time() + interval + 1.0
    run.window = (round(start, 3), round(end, 3))
    run.gaps = measure(stack, [m["node"] for m in moved.values()], start=start, end=end, interval=interval)
    selector = gaps.node_selector("up", [m["node"] for m in moved.values()], job=plan.JOB)
    by_node = gaps.shard_spans(gaps.raw_matrix(stack.http, stack.master_url, selector, start=start, end=end),
                               start=start, end=end, by="node")
    for m in moved.values():
        per = by_node.get(m["node"], {})
        if m["from_shard"] in per and m["to_shard"] in per:
            run.overlap_s[m["node"]] = round(per[m["from_shard"]][1] - per[m["to_shard"]][0], 3)
    return run


def wait_steady(stack: DemoStack, nodes: list[str], *, interval: float, timeout: float) -> None:
    """Until every node's ``up`` has reached the master without a gap for three intervals."""
    selector = gaps.node_selector("up", nodes, job=plan.JOB)

    def steady() -> bool:
        end = time.time() - 2.0  # what remote_write may still be delivering
        start = end - 3 * interval
        found = gaps.dedup_gaps(gaps.raw_matrix(stack.http, stack.master_url, selector, start=start, end=end),
                                start=start, end=end)
        return len(found) == len(nodes) and all(g.max_gap_s <= interval + 1.0 for g in found.values())

    wait(steady, timeout=timeout, what=f"{len(nodes)} nodes reaching the master steadily")


def measure(stack: DemoStack, nodes: list[str], *, start: float, end: float, interval: float,
            arrival_timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """node -> {"up": gap, "gpu": gap} once the master holds samples up to ``end`` (or the timeout)."""
    selectors = {"up": gaps.node_selector("up", nodes, job=plan.JOB),
                 "gpu": gaps.node_selector(GPU_SERIES, nodes, gpu="0")}

    def read() -> dict[str, dict[str, gaps.Gap]]:
        out: dict[str, dict[str, gaps.Gap]] = {}
        for name, selector in selectors.items():
            matrix = gaps.raw_matrix(stack.http, stack.master_url, selector, start=start, end=end)
            for gap in gaps.dedup_gaps(matrix, start=start, end=end).values():
                node = gap.labels.get("node", "")
                out.setdefault(node, {})[name] = gap
        return out

    while time.time() < end:
        time.sleep(min(1.0, max(0.0, end - time.time())))
    result: dict[str, dict[str, gaps.Gap]] = {}

    def arrived() -> bool:
        nonlocal result
        result = read()
        return all(len(result.get(n, {})) == len(selectors)
                   and all(g.last >= end - interval for g in result[n].values()) for n in nodes)

    with contextlib.suppress(DemoError):  # what did not arrive shows as a gap up to the window's end
        wait(arrived, timeout=arrival_timeout, what="the moved targets' samples at the master")
    missing = {"series": "", "labels": {}, "samples": 0, "max_gap_s": round(end - start, 3),
               "gap_from": start, "last": 0.0, "copies": 0}
    return {n: {name: (asdict(result[n][name]) if name in result.get(n, {}) else dict(missing))
                for name in selectors} for n in sorted(nodes)}


@dataclass(frozen=True)
class Snapshot:
    """What the controller serves, to compare across a restart."""

    assignment: dict[str, str]
    """identity -> shard."""
    version: int
    last_audit: int


def snapshot(stack: DemoStack) -> Snapshot:
    version = stack.http.get(f"{stack.controller_url}/v1/status").json()["assignment_version"]
    return Snapshot(assignment={i: row["shard"] for i, row in assignment(stack).items()},
                    version=int(version), last_audit=_last_audit_id(stack))


def compare(stack: DemoStack, before: Snapshot, *, timeout: float = 60.0) -> dict[str, Any]:
    """Once the (restarted) controller serves again: what changed since ``before``."""
    after: dict[str, str] = {}

    def served() -> bool:
        nonlocal after
        status = stack.http.get(f"{stack.controller_url}/v1/status").json()
        after = {i: row["shard"] for i, row in assignment(stack).items()}
        return bool(status["ready"]) and len(after) >= len(before.assignment)

    wait(served, timeout=timeout, what="the restarted controller to serve its assignment")
    status = stack.http.get(f"{stack.controller_url}/v1/status").json()
    entries = stack.http.get(f"{stack.controller_url}/v1/audit", params={"limit": 100}).json()["entries"]
    new_entries = [e for e in entries if e["id"] > before.last_audit]
    return {
        "assignment_version_before": before.version,
        "assignment_version_after": status["assignment_version"],
        "same_assignment": after == before.assignment,
        "changed_targets": sorted(i for i in before.assignment.keys() | after.keys()
                                  if before.assignment.get(i) != after.get(i)),
        "moves_after_restart": sum(int(e.get("moved", 0)) for e in new_entries),
        "audit_after_restart": [{"action": e["action"], "moved": e.get("moved", 0)} for e in new_entries],
    }


def restart_controller(stack: DemoStack, *, handover: bool) -> dict[str, Any]:
    """Restart ``gpufed serve`` (its flags switched to ``handover``); what moved across the restart."""
    before = snapshot(stack)
    argv = [a for a in stack.supervisor.get("controller").spec.argv if a != NO_HANDOVER]
    if not handover:
        argv.append(NO_HANDOVER)
    stopped = time.time()
    stack.supervisor.restart("controller", argv=argv)
    return {"handover": handover, **compare(stack, before), "restart_s": round(time.time() - stopped, 2)}


def _last_audit_id(stack: DemoStack) -> int:
    entries = stack.http.get(f"{stack.controller_url}/v1/audit", params={"limit": 1}).json()["entries"]
    return max((int(e["id"]) for e in entries), default=0)


def summary(runs: Mapping[str, RebalanceRun]) -> dict[str, Any]:
    return {mode: run.summary() for mode, run in runs.items()}
