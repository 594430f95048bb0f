"""Issue 13, end to end: faults on one running demo (replication factor 2), one timeline.

One ``DemoStack`` for the module: 12 simulated nodes over 3 regions, every shard an HA
pair of children, the master scraping the children (job ``gpufed-child``), plus one
extra single-node ``gpufed-exporter serve --backend simulated`` in region-1 that
registers itself as job ``gpu`` and its node-exporter (a stand-in served by the test) as
job ``node``, so the rule pack's ``NodeDown`` has something to watch; the spec gains a
``node`` job for it. The node "dies" by SIGKILL (no deregistration) and the stand-in
closing: both jobs' targets stay in the children's lists and go ``up == 0``.

The rule pack's ``for`` clauses are minutes (NodeDown 3m, GPUExporterDown 5m,
PrometheusChildDown 3m), too long for CI; the master runs a copy of the pack with only
those three shortened (NodeDown 5s, PrometheusChildDown 10s, GPUExporterDown 20s: the
node's own alert must fire before the GPU alert it inhibits, as it does with 3m < 5m).
Everything else is the pack and the rendered Alertmanager config as shipped.

The faults overlap so that the module stays near two minutes (the controller must be
down for a full minute anyway), in this order:

1. the controller (also the registry) is stopped; it stays down >= 60 s;
2. one replica of shard region-0-0 is killed -> ``PrometheusChildDown`` reaches the
   region-0 robot (and the SRE robot: it is critical) exactly once through both
   Alertmanagers; a duplicate would come one peer timeout (15 s) later, so the count is
   read again after 20 s;
3. alertmanager-0 is killed, then the extra node -> ``NodeDown`` reaches the region-1
   robot exactly once through the one Alertmanager left, and the node's
   ``GPUExporterDown`` sits in that Alertmanager inhibited (``status.inhibitedBy``) and
   never reaches a robot;
4. the controller is restarted -> the same assignment, zero moves;
5. at the master, every fleet node's ``up`` and GPU series, deduplicated as a dashboard
   reads them, has no gap longer than one scrape interval (+1 s jitter) over the whole
   window: the children kept scraping their last HTTP SD list without the controller,
   and the killed replica's twin kept its shard's series going.

The timeline runs in the module fixture and returns what it saw; each test asserts one
claim of the issue on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require_tool, wait_for

from federation.demo import components, plan, rebalance
from federation.demo.plan import Layout
from federation.demo.stack import DemoOptions, DemoStack
from federation.demo.supervisor import ProcessSpec
from federation.localrun.dingtalk import Message
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer, free_port
from federation.master.render import load_rule_pack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
LAYOUT = Layout(nodes=12, replication_factor=2)
SHORT_FOR = {"NodeDown": "5s", "PrometheusChildDown": "10s", "GPUExporterDown": "20s"}
EXTRA_NODE, EXTRA_REGION = "extra-node-0", "region-1"
KILLED_CHILD = "region-0-0-r1"
CONTROLLER_DOWN_S = 60.0
DUPLICATE_WINDOW_S = 20.0  # Alertmanager's peer timeout (15 s) plus a margin
JITTER_S = 1.0


def short_rule_pack(directory: Path) -> list[str]:
    """The shipped rule pack with only ``SHORT_FOR``'s ``for`` clauses changed; absolute paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, changed = [], set()
    for name, data in load_rule_pack().items():
        doc = yaml.safe_load(data)
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") in SHORT_FOR:
                    rule["for"] = SHORT_FOR[rule["alert"]]
                    changed.add(rule["alert"])
        path = directory / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(str(path))
    assert changed == set(SHORT_FOR), f"the rule pack lost {set(SHORT_FOR) - changed}"
    return paths


def edit_spec(rule_files: list[str]) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        doc["jobs"].append({"name": "node", "scrape_interval": "5s", "scrape_timeout": "4s"})
        doc["master"]["rule_pack"] = False
        doc["master"]["extra_rule_files"] = rule_files
        # The demo's own spec names no Grafana (it runs none, so its messages carry no links);
        # this module names one to read the Logs link a deployment with Grafana gets.
        doc["grafana"] = {"url": "http://127.0.0.1:3000"}

    return edit


class NodeExporterStandIn:
    """The extra node's node-exporter: a /metrics the node job scrapes; ``close`` is the node dying."""

    def __init__(self) -> None:
        class Handler(LoopbackHandler):
            def do_GET(self) -> None:
                self.reply(200 if self.path == "/metrics" else 404, b"node_boot_time_seconds 1.7e9\n",
                           content_type="text/plain; version=0.0.4")

        self.server = LoopbackHTTPServer(Handler, name="node-exporter").start()
        self.port = self.server.port

    def close(self) -> None:
        self.server.stop()


def start_extra_node(stack: DemoStack, node_exporter: NodeExporterStandIn) -> str:
    """One more simulated node as its own process, registering itself as job gpu and its node-exporter."""
    port = free_port()
    name = f"node/{EXTRA_NODE}"
    argv = components.python(
        "exporter", "serve", "--backend=simulated", "--gpus=2", f"--listen=127.0.0.1:{port}",
        f"--node-name={EXTRA_NODE}", f"--region={EXTRA_REGION}", f"--register-url={stack.controller_url}",
        "--register-job=gpu", f"--node-exporter-port={node_exporter.port}",
    )
    stack.supervisor.start(ProcessSpec(
        name=name, argv=argv, env={"GPUFED_EXPORTER_REGISTER_TOKEN": stack.token},
        ready=lambda: stack.http.get(plan.url(port, "/readyz")).status_code == 200,
    ))
    stack.supervisor.wait_ready(name)
    return name


def messages(stack: DemoStack, alertname: str, robot: str | None = None) -> list[Message]:
    assert stack.sink is not None
    return [m for m in stack.sink.snapshot().messages
            if m.title.startswith("[FIRING") and alertname in m.title and (robot is None or m.robot == robot)]


def am_alerts(stack: DemoStack, port: int, alertname: str) -> list[dict[str, Any]]:
    response = stack.http.get(plan.url(port, "/api/v2/alerts"), params={"filter": f'alertname="{alertname}"'})
    response.raise_for_status()
    alerts: list[dict[str, Any]] = response.json()
    return alerts


def up_at_master(stack: DemoStack, selector: str) -> float | None:
    response = stack.http.get(f"{stack.master_url}/api/v1/query", params={"query": selector})
    rows = response.json()["data"]["result"]
    return float(rows[0]["value"][1]) if rows else None


@dataclass
class Timeline:
    stack: DemoStack
    interval: float
    node_exporter: NodeExporterStandIn
    controller_down_s: float = 0.0
    child_down: dict[str, list[Message]] = field(default_factory=dict)
    node_down: dict[str, list[Message]] = field(default_factory=dict)
    gpu_down_messages: list[Message] = field(default_factory=list)
    inhibited: list[dict[str, Any]] = field(default_factory=list)
    restart: dict[str, Any] = field(default_factory=dict)
    gaps: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Timeline]:
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    base = tmp_path_factory.mktemp("live-faults")
    lines: list[str] = []
    options = DemoOptions(layout=LAYOUT, data_dir=base / "demo",
                          edit_spec=edit_spec(short_rule_pack(base / "rules")))
    stack = DemoStack(options, say=lines.append, show_messages=False)
    node_exporter = NodeExporterStandIn()
    try:
        stack.start()
        run = Timeline(stack=stack, interval=rebalance.scrape_interval_s(stack), node_exporter=node_exporter)
        start_extra_node(stack, node_exporter)
        for job in ("gpu", "node"):
            selector = f'max(up{{job="{job}", node="{EXTRA_NODE}"}})'
            wait_for(lambda selector=selector: up_at_master(stack, selector) == 1.0,
                     timeout=60, interval=0.5, what=f"the extra node's {job} job up at the master")
        selector = f'max(up{{job="gpufed-child", child="{KILLED_CHILD}"}})'
        wait_for(lambda: up_at_master(stack, selector) == 1.0,
                 timeout=60, interval=0.5, what="the master scraping the children")
        fleet = sorted(e["node"] for e in plan.fleet_entries(LAYOUT, port=stack.ports.fleet))
        rebalance.wait_steady(stack, fleet, interval=run.interval, timeout=60)
        _run_timeline(stack, run, fleet)
        yield run
    finally:
        summary = stack.finish(duration=None)
        node_exporter.close()
        print("\n".join(lines[-30:]))
    assert summary["leftover_processes"] == 0, summary


def _run_timeline(stack: DemoStack, run: Timeline, fleet: list[str]) -> None:
    sup, ams = stack.supervisor, [web for web, _ in stack.ports.alertmanagers]
    before = rebalance.snapshot(stack)
    window_start = time.time() - run.interval

    # 1. The controller (and with it the registry) goes away.
    sup.stop("controller")
    down_at = time.time()

    # 2. One replica of a shard dies: its twin keeps the shard's series; the master's alert.
    sup.kill(f"child/{KILLED_CHILD}")
    first = wait_for(lambda: messages(stack, "PrometheusChildDown", plan.robot_name("region-0")) or None,
                     timeout=120, interval=0.5, what="PrometheusChildDown at the region-0 robot")
    wait_until(first[0].at + DUPLICATE_WINDOW_S)
    run.child_down = {r: messages(stack, "PrometheusChildDown", r) for r in plan.robots(LAYOUT)}

    # 3. One Alertmanager dies, then the extra node: NodeDown through the one left.
    sup.kill("alertmanager-0")
    sup.kill(f"node/{EXTRA_NODE}")  # the machine dies: its GPU exporter and its node-exporter
    run.node_exporter.close()
    node_first = wait_for(lambda: messages(stack, "NodeDown", plan.robot_name(EXTRA_REGION)) or None,
                          timeout=120, interval=0.5, what="NodeDown at the region-1 robot")

    def inhibited() -> list[dict[str, Any]] | None:
        found = [a for a in am_alerts(stack, ams[1], "GPUExporterDown")
                 if a["labels"].get("node") == EXTRA_NODE]
        return found if found and all(a["status"]["inhibitedBy"] for a in found) else None

    run.inhibited = wait_for(inhibited, timeout=90, interval=1.0,
                             what="GPUExporterDown inhibited by NodeDown")
    wait_until(max(node_first[0].at + DUPLICATE_WINDOW_S, down_at + CONTROLLER_DOWN_S))
    run.node_down = {r: messages(stack, "NodeDown", r) for r in plan.robots(LAYOUT)}
    run.gpu_down_messages = [m for m in messages(stack, "GPUExporterDown") if EXTRA_NODE in m.text]

    # 4. The controller comes back: the assignment it serves is the one it left.
    run.controller_down_s = round(time.time() - down_at, 1)
    sup.restart("controller")
    run.restart = rebalance.compare(stack, before)

    # 5. What the master holds for the fleet over the whole window.
    run.gaps = rebalance.measure(stack, fleet, start=window_start, end=time.time(), interval=run.interval)
    run.notes.append(json.dumps({
        "controller_down_s": run.controller_down_s,
        "max_gap_s": max(g["max_gap_s"] for per in run.gaps.values() for g in per.values()),
        "restart": run.restart,
    }, sort_keys=True))


def wait_until(moment: float) -> None:
    """Let time pass up to ``moment``: a window in which something must NOT happen."""
    while time.time() < moment:
        time.sleep(min(1.0, moment - time.time()))


def test_child_killed_alert_reaches_dingtalk_once_through_both_alertmanagers(timeline: Timeline) -> None:
    counts = {robot: len(msgs) for robot, msgs in timeline.child_down.items()}
    # Critical: the region's robot and the SRE robot, once each; no other region hears of it.
    assert counts == {"region-0-oncall": 1, "region-1-oncall": 0, "region-2-oncall": 0, "sre": 1}, counts
    assert KILLED_CHILD in timeline.child_down["region-0-oncall"][0].text


def test_replica_killed_and_controller_stopped_leave_no_gap_at_the_master(timeline: Timeline) -> None:
    print(timeline.notes)
    assert timeline.controller_down_s >= CONTROLLER_DOWN_S
    assert len(timeline.gaps) == LAYOUT.nodes
    worst = {node: max(g["max_gap_s"] for g in per.values()) for node, per in timeline.gaps.items()}
    assert max(worst.values()) <= timeline.interval + JITTER_S, worst
    # The killed replica's shard went on with its twin's copy alone.
    shard_nodes = [n for n in timeline.gaps if n.startswith("gpu-region-0-")]
    assert shard_nodes and all(timeline.gaps[n]["up"]["samples"] > 0 for n in shard_nodes)


def test_controller_restart_serves_the_same_assignment_and_moves_nothing(timeline: Timeline) -> None:
    restart = timeline.restart
    assert restart["same_assignment"], restart
    assert restart["changed_targets"] == []
    assert restart["moves_after_restart"] == 0, restart


def test_one_alertmanager_killed_node_down_reaches_the_region_once_gpu_alert_inhibited(
    timeline: Timeline,
) -> None:
    counts = {robot: len(msgs) for robot, msgs in timeline.node_down.items()}
    assert counts == {"region-0-oncall": 0, "region-1-oncall": 1, "region-2-oncall": 0, "sre": 1}, counts
    assert EXTRA_NODE in timeline.node_down["region-1-oncall"][0].text
    # The node's GPU exporter alert is held back by NodeDown, in the Alertmanager itself.
    assert timeline.inhibited and all(a["status"]["state"] == "suppressed" for a in timeline.inhibited)
    assert timeline.gpu_down_messages == []



def test_node_down_message_links_to_the_nodes_logs_around_its_start(timeline: Timeline) -> None:
    """The relay's DingTalk message carries a Grafana Explore link whose LogQL names the node
    and whose range brackets the alert's start (this module's spec names a Grafana URL)."""
    from urllib.parse import parse_qs, urlsplit

    message = timeline.node_down["region-1-oncall"][0]
    link = message.text.split("[Logs](", 1)[1].split(")", 1)[0]
    parts = urlsplit(link)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == "http://127.0.0.1:3000/explore"
    (pane,) = json.loads(parse_qs(parts.query)["panes"][0]).values()
    assert pane["queries"][0]["expr"] == f'{{node="{EXTRA_NODE}"}}'
    start, end = int(pane["range"]["from"]), int(pane["range"]["to"])
    assert end - start == 30 * 60 * 1000  # 15 minutes either side of the alert's start
    assert start < message.at * 1000 < end  # sent after the alert started, within the window
