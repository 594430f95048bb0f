"""``gpufed bench blackouts``: two blackouts a couple of minutes apart, end to end.

Issue 36's live check. A ``DemoStack`` runs the rule pack exactly as the master bundle
renders it (``FederationScrapeBlackout``'s shipped ``for: 30s`` is short enough: nothing
is shortened). Two blackouts, each frozen (SIGSTOP) long enough for the alert to fire,
with ``gap`` seconds between the first thaw and the second freeze. What freezes takes
turns (``--frozen``, default ``children,fleet``): first every child (their remote_write
stops and the master's own gpufed-child scrape of them fails too, as with a dead child),
then the fleet of simulated nodes. That is issue 36's shape: the first episode left a
resolved cluster-less twin that Prometheus kept re-sending while the second fired, and
the Alertmanagers flipped between the two; freezing the fleet twice passes on either rule.
Meanwhile one thread polls, every ``poll`` seconds, the master's ``ALERTS`` and each
Alertmanager's ``/api/v2/alerts`` (which lists an alert while it is firing and drops it
once resolved), recording every change per region.

What it checks, per frozen region:

- at the master, and in every Alertmanager, exactly one rise and one fall per episode:
  any further change is a **flap** (issue 36 saw 13 in 100 s, two series for one alert);
- every DingTalk robot that got the region's blackout got, per episode, exactly one
  FIRING and then one RESOLVED (issue 36: the second episode was answered "duplicate").

An episode's window runs from its freeze to the next freeze (the last one's to the end
of the run); a change before the first freeze counts against the first episode.

The controller runs with ``--registry-ttl 600`` as ``tests/e2e/test_live_truth.py`` does:
the built-in registry forgets a node that stops re-registering for its TTL (90 s), which
a frozen fleet would also hit; with Consul or Kubernetes discovery a frozen exporter's
registration does not lapse, and this bench is about scrape failures.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from federation.demo import plan
from federation.demo.stack import DemoOptions, DemoStack
from federation.localrun.dingtalk import Message

Say = Callable[[str], None]
ALERT = "FederationScrapeBlackout"
HEADING = re.compile(r"^### \[(?P<status>FIRING|RESOLVED):\d+\] (?P<names>.+?)(?: \((?P<part>\d+)/\d+\))?$",
                     re.M)
Changes = list[tuple[float, bool]]


# --- pure: what the observations say ------------------------------------------------------------


@dataclass
class Timeline:
    """Per key (an Alertmanager or the master, and a region): when the alert appeared/went."""

    changes: dict[tuple[str, str], Changes] = field(default_factory=dict)
    most: dict[tuple[str, str], int] = field(default_factory=dict)

    def observe(self, source: str, at: float, counts: dict[str, int], regions: Iterable[str]) -> None:
        """``counts``: region -> alerts listed (0: none); the state is "any listed"."""
        for region in regions:
            key = (source, region)
            state = counts.get(region, 0) > 0
            seen = self.changes.setdefault(key, [])
            if (seen[-1][1] if seen else False) != state:
                seen.append((at, state))
            self.most[key] = max(self.most.get(key, 0), counts.get(region, 0))


def window_of(at: float, starts: Sequence[float]) -> int:
    """The episode whose window holds ``at`` (before the first freeze: the first episode)."""
    index = 0
    for i, start in enumerate(starts):
        if at >= start:
            index = i
    return index


def edges(changes: Changes, starts: Sequence[float]) -> dict[str, Any]:
    """Rises and falls per episode, and the flaps: changes beyond one rise and one fall each."""
    rises, falls = [0] * len(starts), [0] * len(starts)
    fired: list[float | None] = [None] * len(starts)
    resolved: list[float | None] = [None] * len(starts)
    for at, state in changes:
        episode = window_of(at, starts)
        if state:
            rises[episode] += 1
            fired[episode] = fired[episode] if fired[episode] is not None else at
        else:
            falls[episode] += 1
            resolved[episode] = at
    flaps = sum(max(0, n - 1) for n in (*rises, *falls))
    missing = sum(1 for n in (*rises, *falls) if n == 0)
    return {"flips": len(changes), "flaps": flaps, "missing_edges": missing,
            "rises": rises, "falls": falls, "fired": fired, "resolved": resolved}


def notifications(message: Message) -> list[tuple[str, list[str]]]:
    """The notifications one DingTalk message carries, as (status, group label values).

    The relay merges parts queued for one robot into one message (title "... (+N more)"),
    so the title names only the first: each part's heading (``### [FIRING:1] names``, with
    `` (i/n)`` when one notification was split) names its own. A split notification counts once.
    """
    found = []
    for match in HEADING.finditer(message.text):
        if match.group("part") in (None, "1"):
            found.append((match.group("status"), match.group("names").split()))
    return found


def messages_by_group(messages: Iterable[Message],
                      regions: Iterable[str]) -> dict[tuple[str, str], list[tuple[float, str]]]:
    """The blackout's notifications per (robot, region) as (arrival, status), in arrival order."""
    wanted = set(regions)
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for message in sorted(messages, key=lambda m: m.at):
        for status, names in notifications(message):
            if ALERT not in names:
                continue
            for region in sorted(wanted & set(names)):
                groups.setdefault((message.robot, region), []).append((message.at, status))
    return groups


def delivered(received: Sequence[tuple[float, str]], starts: Sequence[float]) -> dict[str, Any]:
    """Per episode the states one group got, in order; right = exactly FIRING then RESOLVED."""
    per: list[list[str]] = [[] for _ in starts]
    after: list[list[float]] = [[] for _ in starts]
    for at, status in received:
        episode = window_of(at, starts)
        per[episode].append(status)
        after[episode].append(round(at - starts[episode], 1))
    return {"episodes": per, "after_freeze_s": after,
            "ok": all(states == ["FIRING", "RESOLVED"] for states in per)}


def metric_by_robot(text: str, name: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf'{name}\{{robot="([^"]*)"\}} (\S+)$', line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


# --- live ---------------------------------------------------------------------------------------


class Poller:
    """Polls the master and every Alertmanager for the blackout alert, one thread, every ``poll`` s."""

    def __init__(self, stack: DemoStack, *, regions: Sequence[str], poll_s: float) -> None:
        self.stack, self.regions, self.poll_s = stack, list(regions), poll_s
        self.timeline = Timeline()
        self.polls = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="blackout-poller")

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def firing_at_master(self) -> set[str]:
        with self._lock:
            return {region for (source, region), seen in self.timeline.changes.items()
                    if source == "master" and seen and seen[-1][1]}

    def _run(self) -> None:
        ams = [(f"alertmanager-{i}", plan.url(web, "/api/v2/alerts"))
               for i, (web, _) in enumerate(self.stack.ports.alertmanagers)]
        query = f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}'
        with httpx.Client(timeout=httpx.Timeout(5.0)) as http:
            while not self._stop.is_set():
                began = time.monotonic()
                for source, url, read in [("master", f"{self.stack.master_url}/api/v1/query", _master),
                                          *((name, url, _alertmanager) for name, url in ams)]:
                    try:
                        counts = read(http, url, query)
                    except (httpx.HTTPError, ValueError, KeyError) as exc:
                        # A missed poll is not a change: the state stays as last seen.
                        self.errors.append(f"{source}: {exc}")
                        continue
                    with self._lock:
                        self.timeline.observe(source, time.time(), counts, self.regions)
                self.polls += 1
                self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - began)))


def _master(http: httpx.Client, url: str, query: str) -> dict[str, int]:
    response = http.get(url, params={"query": query})
    response.raise_for_status()
    counts: dict[str, int] = {}
    for row in response.json()["data"]["result"]:
        region = row["metric"].get("region", "")
        counts[region] = counts.get(region, 0) + 1
    return counts


def _alertmanager(http: httpx.Client, url: str, query: str) -> dict[str, int]:
    response = http.get(url, params={"filter": f'alertname="{ALERT}"'})
    response.raise_for_status()
    counts: dict[str, int] = {}
    for alert in response.json():
        region = alert["labels"].get("region", "")
        counts[region] = counts.get(region, 0) + 1
    return counts


@dataclass
class Run:
    frozen: list[float] = field(default_factory=list)
    thawed: list[float] = field(default_factory=list)


FROZEN = ("fleet", "children")


def frozen_kinds(frozen: str) -> list[str]:
    """``--frozen``: what each episode freezes, in turn (``children,fleet``: the first
    episode the children, the second the fleet)."""
    kinds = [kind.strip() for kind in frozen.split(",")]
    for kind in kinds:
        if kind not in FROZEN:
            raise ValueError(f"frozen: expected one of {', '.join(FROZEN)} (comma-separated), got {kind!r}")
    return kinds


def _frozen_names(stack: DemoStack, frozen: str) -> list[str]:
    """``fleet``: the simulated nodes' process; ``children``: every child (their remote_write
    stops and the master's own gpufed-child scrape of them fails too, as when a region's
    children hang)."""
    return ["fleet"] if frozen == "fleet" else [f"child/{child}" for child in stack.running_children()]


def _freeze(stack: DemoStack, run: Run, *, names: Sequence[str], freeze_s: float, say: Say) -> None:
    say(f"freezing {', '.join(names)} for {freeze_s:.0f} s (episode {len(run.frozen) + 1})")
    run.frozen.append(time.time())
    for name in names:
        stack.supervisor.kill(name, signal.SIGSTOP)
    try:
        time.sleep(freeze_s)
    finally:
        for name in names:
            stack.supervisor.kill(name, signal.SIGCONT)
        run.thawed.append(time.time())


def _settled(stack: DemoStack, poller: Poller, run: Run, regions: Sequence[str]) -> bool:
    """Nothing firing at the master and every group's last episode has its RESOLVED."""
    if poller.firing_at_master():
        return False
    assert stack.sink is not None
    groups = messages_by_group(stack.sink.snapshot().messages, regions)
    owed = {key for key, received in groups.items() if any(at >= run.frozen[-1] for at, _ in received)}
    done = {key for key, received in groups.items()
            if any(at >= run.frozen[-1] and status == "RESOLVED" for at, status in received)}
    return bool(owed) and owed <= done


def run_blackouts_bench(*, layout: plan.Layout, frozen: str, freeze_s: float, gap_s: float, episodes: int,
                        poll_s: float, after_s: float, settle_s: float, data_dir: Path,
                        say: Say) -> dict[str, Any]:
    regions = layout.region_names()
    options = DemoOptions(layout=layout, data_dir=data_dir, controller_args=("--registry-ttl=600",))
    stack = DemoStack(options, say=say, show_messages=False)
    kinds = frozen_kinds(frozen)
    result: dict[str, Any] = {"nodes": layout.nodes, "regions": regions, "episodes_asked": episodes,
                              "frozen": frozen,
                              "freeze_s": freeze_s, "gap_s": gap_s, "poll_s": poll_s,
                              "load_at_start": [round(x, 2) for x in os.getloadavg()], "ok": False}
    run = Run()
    try:
        stack.start()
        result["prometheus_version"] = str(stack.binaries.prometheus_release) if stack.binaries else None
        result["alertmanager_version"] = str(stack.binaries.alertmanager_release) if stack.binaries else None
        with Poller(stack, regions=regions, poll_s=poll_s) as poller:
            time.sleep(max(5.0, 3 * poll_s))  # a baseline: nothing listed before the first freeze
            for episode in range(episodes):
                if episode:
                    say(f"thawed; the next freeze in {gap_s:.0f} s")
                    time.sleep(gap_s)
                names = _frozen_names(stack, kinds[episode % len(kinds)])
                _freeze(stack, run, names=names, freeze_s=freeze_s, say=say)
            say("thawed; waiting for the resolves and their RESOLVED messages")
            deadline = time.time() + after_s
            while time.time() < deadline and not _settled(stack, poller, run, regions):
                time.sleep(1.0)
            time.sleep(settle_s)  # late copies and resends would land now
        assert stack.sink is not None
        messages = stack.sink.snapshot().messages
        metrics = stack.http.get(plan.url(stack.ports.relay, "/metrics")).text
        result |= _judge(poller, run, messages, metrics, regions)
    finally:
        result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        summary = stack.finish(duration=None)
        result["leftover_processes"] = summary["leftover_processes"]
        result["startup_s"] = summary["startup_s"]
    return result


def _judge(poller: Poller, run: Run, messages: Sequence[Message], metrics: str,
           regions: Sequence[str]) -> dict[str, Any]:
    starts = run.frozen
    sources = ["master", *sorted({s for s, _ in poller.timeline.changes if s != "master"})]
    per_source: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    for source in sources:
        per_source[source] = {}
        for region in regions:
            seen = edges(poller.timeline.changes.get((source, region), []), starts)
            seen["most_series"] = poller.timeline.most.get((source, region), 0)
            for name in ("fired", "resolved"):
                base = run.frozen if name == "fired" else run.thawed
                seen[f"{name}_after_s"] = [None if at is None else round(at - b, 1)
                                           for at, b in zip(seen.pop(name), base, strict=True)]
            per_source[source][region] = seen
            if seen["flaps"] or seen["missing_edges"]:
                failures.append(f"{source} {region}: rises {seen['rises']}, falls {seen['falls']}")
    groups = messages_by_group(messages, regions)
    dingtalk: dict[str, dict[str, Any]] = {}
    dingtalk_at: dict[str, dict[str, Any]] = {}
    for (robot, region), group in sorted(groups.items()):
        got = delivered(group, starts)
        dingtalk.setdefault(robot, {})[region] = got["episodes"]
        dingtalk_at.setdefault(robot, {})[region] = got["after_freeze_s"]
        if not got["ok"]:
            failures.append(f"DingTalk {robot} {region}: {got['episodes']}")
    for region in regions:
        if not any(r == region for _, r in groups):
            failures.append(f"DingTalk: no {ALERT} message for {region}")
    flips = {source: sum(r["flips"] for r in per.values()) for source, per in per_source.items()}
    flaps = {source: sum(r["flaps"] for r in per.values()) for source, per in per_source.items()}
    return {
        "episodes": [{"frozen_at": round(f, 3), "thawed_at": round(t, 3)} for f, t in zip(
            run.frozen, run.thawed, strict=True)],
        "by_source": per_source,
        "flips": flips,
        "flaps": flaps,
        "dingtalk": dingtalk,
        "dingtalk_after_freeze_s": dingtalk_at,
        "dingtalk_dedup_dropped_total": metric_by_robot(metrics, "gpufed_dingtalk_dedup_dropped_total"),
        "dingtalk_stale_dropped_total": metric_by_robot(metrics, "gpufed_dingtalk_stale_dropped_total"),
        "dingtalk_stale_alerts_dropped_total": metric_by_robot(
            metrics, "gpufed_dingtalk_stale_alerts_dropped_total"),
        "polls": poller.polls,
        "poll_errors": len(poller.errors),
        "poll_errors_first": poller.errors[:5],
        "failures": failures,
        "ok": not failures,
    }
