"""Every PromQL expression of every dashboard panel, run against a real federation on loopback.

The stack (one per module):

* a simulated fleet (``FleetApp``: 4 nodes x 2 GPUs over two regions, opt-in families on);
* one more simulated node built from the exporter's own parts, with a test-side
  ``PodAttribution`` (GPUs 0-5 held by pods in two namespaces) and a backend whose driver
  reports XID 79 on GPU 0 and XID 13 on GPU 1, so health, XID and pod panels have data;
* one inventory target nobody listens on (an exporter that is down);
* child Prometheus servers rendered by ``federation.pipeline`` (one shard per region, each
  an HA pair: replication factor 2),
  remote-writing to a master Prometheus 2.42 that loads the rule pack, scrapes the
  children as the ``gpufed-child`` meta-monitoring job, itself, an Alertmanager 0.25 and
  the DingTalk relay (``create_app``), which sends to the in-process DingTalk stand-in
  (one robot accepts, one rejects with errcode 310000).

Each query runs twice: with every template variable at the regex-all value ``.*``, and
with concrete values that the variables' own queries must offer. A query returns series
unless it is listed in ``PARSE_ONLY`` with the reason its source is not in this stack;
those must still be accepted by Prometheus (status success) and must return nothing, so
the list cannot hide a query that works.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, free_port, require_tool, stop_process, wait_for
from fakes.dingtalk_api import FakeDingTalk
from prom_process import PrometheusProcess
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import parse_config
from alertmanager.dingtalk.harness import RelayThread
from exporter.backend import GpuBackend
from exporter.catalogue import FAMILIES
from exporter.collection import Collection, CollectionLoop
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.fleet import FleetApp, fleet_nodes
from exporter.models import GpuDevice, Reading, XidEvent
from exporter.server import HttpServer, NodeRoutes
from exporter.settings import ExporterSettings
from exporter.simulated import SimulatedBackend
from federation import pipeline
from federation.dashboards import dashboard_files
from sharder.promtool import Promtool

pytestmark = pytest.mark.e2e

REGIONS = ("region-0", "region-1")
SPECIAL = "gpu-region-0-attributed"
DOWN = "gpu-region-0-down"
PODS = {0: ("training", "llm-pretrain-0"), 1: ("training", "llm-pretrain-0"),
        2: ("training", "llm-pretrain-0"), 3: ("training", "llm-pretrain-0"),
        4: ("inference", "chat-api-0"), 5: ("inference", "chat-api-0")}
# Concrete values for the second run; each must be among the values its variable offers.
CHOICES = {"region": "region-0", "node": SPECIAL, "gpu": "0", "namespace": "training",
           "pod": "llm-pretrain-0", "shard": "region-0-0"}
GRAFANA_BUILTINS = {"__rate_interval": "30s", "__range": "5m", "__interval": "15s"}
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
CONVERGE_S = 40.0
GPUS_TOTAL = 4 * 2 + 8  # fleet nodes x GPUs + the attributed node

CONTROLLER = "controller metric: the controller (gpufed serve) is built in parallel and not run here"
DISCOVERY = "discovery metric: gpufed discovery runs inside the controller, not run here"
HAMI = "HAMi vGPU monitor/scheduler metric: HAMi cannot run without Kubernetes and GPUs"
KSM = "kube-state-metrics ResourceQuota metric: no Kubernetes API in this stack"
SCHEDULER = "kube-scheduler metric (via recording rule): no Kubernetes scheduler in this stack"
RELOAD = "the relay's reload counter has no series before the first SIGHUP reload; none happens here"
PARSE_ONLY: dict[tuple[str, str, str], str] = {
    ("gpufed-federation", "Targets per shard (controller)", "A"): CONTROLLER,
    ("gpufed-federation", "Hand-overs", "A"): CONTROLLER,
    ("gpufed-federation", "Hand-overs", "B"): CONTROLLER,
    ("gpufed-federation", "Time since last successful discovery", "A"): DISCOVERY,
    ("gpufed-federation", "Discovery errors", "A"): DISCOVERY,
    ("gpufed-federation", "Relay config reloads", "A"): RELOAD,
    ("gpufed-workloads", "vGPU memory used vs limit", "A"): HAMI,
    ("gpufed-workloads", "vGPU memory used vs limit", "B"): HAMI,
    ("gpufed-workloads", "vGPU memory used % of limit", "A"): HAMI,
    ("gpufed-quota", "GPU quota used vs hard limit", "A"): KSM,
    ("gpufed-quota", "GPU quota used vs hard limit", "B"): KSM,
    ("gpufed-quota", "GPU quota used %", "A"): KSM,
    ("gpufed-quota", "HAMi quota used (limit in the limit column)", "A"): HAMI,
    ("gpufed-quota", "vGPU allocated per namespace", "A"): HAMI,
    ("gpufed-quota", "GPU memory allocated by region", "A"): HAMI,
    ("gpufed-quota", "GPU memory allocated vs limit per node", "A"): HAMI,
    ("gpufed-quota", "GPU memory allocated vs limit per node", "B"): HAMI,
    ("gpufed-quota", "Containers sharing a GPU", "A"): HAMI,
    ("gpufed-quota", "Scheduling failures", "A"): SCHEDULER,
}


class XidOnStart:
    """A simulated node whose driver reports XID 79 (critical) on GPU 0 and 13 on GPU 1 once."""

    def __init__(self, inner: SimulatedBackend) -> None:
        self.inner = inner
        now = time.time()
        self.pending = [XidEvent(0, 79, now), XidEvent(1, 13, now)]

    def devices(self) -> tuple[GpuDevice, ...]:
        return self.inner.devices()

    def driver_version(self) -> str:
        return self.inner.driver_version()

    def read(self, families: Any) -> dict[int, Reading]:
        return self.inner.read(families)

    def drain_xid_events(self) -> list[XidEvent]:
        events, self.pending = [*self.inner.drain_xid_events(), *self.pending], []
        return events

    def close(self) -> None:
        self.inner.close()


class StaticPods:
    """Pod attribution as the kubelet pod-resources API would report it: GPU UUID -> pod."""

    def __init__(self, mapping: dict[str, dict[str, str]]) -> None:
        self.mapping = mapping

    def labels(self) -> dict[str, dict[str, str]]:
        return self.mapping

    def close(self) -> None:
        """Nothing to stop."""


@dataclass
class AttributedNode:
    http: HttpServer
    loop: CollectionLoop

    @classmethod
    def start(cls) -> AttributedNode:
        backend: GpuBackend = XidOnStart(SimulatedBackend(8, node=SPECIAL))
        pods = {dev.uuid: {"namespace": PODS[dev.index][0], "pod": PODS[dev.index][1],
                           "container": "main"}
                for dev in backend.devices() if dev.index in PODS}
        collection = Collection(backend, FAMILIES, attribution=StaticPods(pods), timeout=None)
        registry = CollectorRegistry(auto_describe=False)
        policy = LabelPolicy(SPECIAL, placement={"region": REGIONS[0]})
        registry.register(SnapshotCollector(collection, policy))
        collection.collect_once()
        loop = CollectionLoop([collection], interval=0.5)
        http = HttpServer(NodeRoutes(registry, ready=lambda: True), host="127.0.0.1", port=0)
        loop.start()
        http.start()
        return cls(http, loop)

    def stop(self) -> None:
        self.http.stop()
        self.loop.stop()


@dataclass
class Stack:
    master: PrometheusProcess
    client: httpx.Client

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.master.query(promql)

    def panel_query(self, check: Check) -> int:
        """Series count; a query Prometheus refuses fails naming the panel and the parser's error."""
        response = self.client.get(f"{self.master.url}/api/v1/query", params={"query": check.expr})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"{check.key}: Prometheus refused {check.expr!r}: {body.get('error')}")
        return len(body["data"]["result"])

    def label_values(self, label: str, selector: str) -> list[str]:
        response = self.client.get(f"{self.master.url}/api/v1/label/{label}/values",
                                   params={"match[]": selector})
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return sorted(body["data"])


def inventory(fleet: FleetApp, special_port: int) -> dict[str, Any]:
    targets = [{"address": "127.0.0.1", "port": fleet.http.port, "job": "gpu", "node": node.name,
                "region": node.region, "rack": node.rack, "team": node.team, "gpus": 2,
                "metrics_path": f"/nodes/{node.name}/metrics", "identity": f"gpu/{node.name}"}
               for node in fleet.nodes.values()]
    targets.append({"address": "127.0.0.1", "port": special_port, "job": "gpu", "node": SPECIAL,
                    "region": REGIONS[0], "gpus": 8, "identity": f"gpu/{SPECIAL}"})
    targets.append({"address": "127.0.0.1", "port": free_port(), "job": "gpu", "node": DOWN,
                    "region": REGIONS[0], "gpus": 8, "identity": f"gpu/{DOWN}"})
    return {"targets": targets}


def spec(master_port: int) -> dict[str, Any]:
    return {
        "cluster": "e2e",
        "regions": [{"name": name, "shards": 1} for name in REGIONS],
        "sharding": {"replication_factor": 2},
        "jobs": [{"name": "gpu", "scrape_interval": "1s"}],
        "remote_write": [{"name": "master", "url": f"http://127.0.0.1:{master_port}/api/v1/write",
                          "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms",
                                           "max_backoff": "1s"}}],
        "children": {"scrape_interval": "1s", "evaluation_interval": "1s"},
    }


def master_config(*, children: dict[str, tuple[PrometheusProcess, str, str, str]], self_port: int,
                  am_port: int, relay_port: int) -> dict[str, Any]:
    rules = ROOT / "federation" / "rules"
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules / name) for name in ("gpu.yml", "hami.yml", "federation.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [
            {"job_name": "gpufed-child", "static_configs": [
                {"targets": [f"127.0.0.1:{proc.port}"],
                 "labels": {"cluster": "e2e", "region": region, "shard": shard, "replica": replica}}
                for proc, shard, region, replica in children.values()]},
            {"job_name": "gpufed-master", "static_configs": [{"targets": [f"127.0.0.1:{self_port}"]}]},
            {"job_name": "alertmanager", "static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]},
            {"job_name": "gpufed-dingtalk", "static_configs": [{"targets": [f"127.0.0.1:{relay_port}"]}]},
        ],
    }


def alertmanager_config(relay_port: int) -> dict[str, Any]:
    relay = f"http://127.0.0.1:{relay_port}/dingtalk"
    return {
        "route": {"receiver": "dingtalk", "group_by": ["alertname", "node"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "dingtalk", "webhook_configs": [
            {"url": f"{relay}/ops/send", "send_resolved": True},
            {"url": f"{relay}/audit/send", "send_resolved": True},
        ]}],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus, promtool = require_tool("prometheus"), require_tool("promtool")
    alertmanager = require_tool("prometheus-alertmanager")
    root = tmp_path_factory.mktemp("dashboards")
    with ExitStack() as stack, httpx.Client(timeout=5.0) as client:
        dingtalk = stack.enter_context(FakeDingTalk())
        relay_config = parse_config({"robots": {
            "ops": {"url": dingtalk.add_robot("tok-ops-0123456789")},
            # The stand-in refuses every message to this robot (keyword missing: errcode 310000).
            "audit": {"url": dingtalk.add_robot("tok-audit-0123456789", keywords=["never-sent-keyword"])},
        }})
        relay = stack.enter_context(RelayThread(create_app(relay_config)))

        am_port = free_port()
        (root / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(relay.port)))
        with (root / "alertmanager.log").open("wb") as log:
            am = subprocess.Popen(
                [alertmanager, f"--config.file={root / 'alertmanager.yml'}", f"--storage.path={root / 'am'}",
                 f"--web.listen-address=127.0.0.1:{am_port}",
                 f"--cluster.listen-address=127.0.0.1:{free_port()}",
                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop_process, am)

        settings = ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0", collect_interval=0.5,
                                    families_include=["pcie", "gpm", "process"])
        fleet = FleetApp(settings, fleet_nodes(4, regions=len(REGIONS)))
        fleet.start()
        stack.callback(fleet.stop)
        special = AttributedNode.start()
        stack.callback(special.stop)

        master = PrometheusProcess(prometheus, config=root / "master.yml", data=root / "master-data",
                                   log=root / "master.log", client=client,
                                   extra_args=("--web.enable-remote-write-receiver",))
        (root / "federation.yaml").write_text(yaml.safe_dump(spec(master.port)))
        (root / "inventory.yaml").write_text(yaml.safe_dump(inventory(fleet, special.http.port)))
        loaded, targets = pipeline.load_inputs(root / "federation.yaml", root / "inventory.yaml")
        result = pipeline.render(loaded, targets, out=root / "out", checker=Promtool(promtool))
        children = {
            entry["child"]: (PrometheusProcess(prometheus, config=root / "out" / entry["config"],
                                               data=root / f"data-{entry['child']}",
                                               log=root / f"{entry['child']}.log", client=client),
                             entry["shard"], entry["region"], str(entry["replica"]))
            for entry in result.manifest["children"]
        }
        (root / "master.yml").write_text(yaml.safe_dump(master_config(
            children=children, self_port=master.port, am_port=am_port, relay_port=relay.port)))
        subprocess.run([promtool, "check", "config", str(root / "master.yml")], check=True,
                       capture_output=True)
        stack.enter_context(master)
        for proc, *_ in children.values():
            stack.enter_context(proc)
        master.wait_ready()
        for proc, *_ in children.values():
            proc.wait_ready()
        wait_for(lambda: client.get(f"http://127.0.0.1:{am_port}/-/ready").status_code == 200,
                 timeout=15, what="alertmanager ready")
        yield Stack(master=master, client=client)


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in dashboard_files()}


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        value = values[name]
        # Grafana regex-escapes chosen values; ours need no escaping, so keep them plain.
        assert value == ".*" or re.fullmatch(r"[\w-]+", value), value
        return value

    return VARIABLE_REF.sub(one, expr)


@dataclass(frozen=True)
class Check:
    uid: str
    panel: str
    ref: str
    expr: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.uid, self.panel, self.ref)


def checks(values: dict[str, dict[str, str]]) -> list[Check]:
    out = []
    for uid, model in sorted(dashboards().items()):
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], values[uid])
                out.append(Check(uid, panel["title"], target["refId"], expr))
    return out


def run_all(stack: Stack, all_checks: list[Check]) -> dict[tuple[str, str, str], int]:
    """Series count per query; every query must be accepted by Prometheus (status success)."""
    return {check.key: stack.panel_query(check) for check in all_checks}


def missing(counts: dict[tuple[str, str, str], int]) -> list[tuple[str, str, str]]:
    return sorted(key for key, n in counts.items() if n == 0 and key not in PARSE_ONLY)


def poll(stack: Stack, all_checks: list[Check]) -> dict[tuple[str, str, str], int]:
    """Run every query until all that should have data have it, or the deadline passes.

    Rates need two samples at the master and alerts must travel master -> Alertmanager ->
    relay -> DingTalk first; the caller's assertions name whatever is still empty.
    """
    deadline = time.monotonic() + CONVERGE_S
    while True:
        counts = run_all(stack, all_checks)
        if not missing(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(1.0)


def assert_expectations(all_checks: list[Check], counts: dict[tuple[str, str, str], int]) -> None:
    exprs = {check.key: check.expr for check in all_checks}
    empty = missing(counts)
    assert not empty, "no series for: " + "; ".join(f"{k} {exprs[k]}" for k in empty)
    assert set(PARSE_ONLY) <= set(counts), f"stale PARSE_ONLY keys: {sorted(set(PARSE_ONLY) - set(counts))}"
    now_working = sorted(key for key in PARSE_ONLY if counts[key])
    assert not now_working, f"these return series now; drop them from PARSE_ONLY: {now_working}"


def summary(label: str, counts: dict[tuple[str, str, str], int]) -> str:
    uids = {key[0] for key in counts}
    panels = {key[:2] for key in counts}
    with_series = sum(1 for n in counts.values() if n)
    return json.dumps({"run": label, "dashboards": len(uids), "panels": len(panels), "queries": len(counts),
                       "returned_series": with_series, "parse_only": len(PARSE_ONLY)}, sort_keys=True)


def test_every_panel_query_with_regex_all_values(stack: Stack) -> None:
    values = {uid: dict.fromkeys(variable_names(model), ".*") for uid, model in dashboards().items()}
    all_checks = checks(values)
    counts = poll(stack, all_checks)
    assert_expectations(all_checks, counts)
    print(summary("regex-all", counts))


def variable_names(model: dict[str, Any]) -> list[str]:
    return [v["name"] for v in model["templating"]["list"] if v["type"] == "query"]


def resolve(stack: Stack, variable: dict[str, Any], chosen: dict[str, str]) -> list[str]:
    """The values Grafana would offer for a query variable, given earlier choices."""
    definition = substitute(variable["definition"], chosen)
    if definition.startswith("label_values("):
        selector, label = definition[len("label_values("):-1].rsplit(",", 1)
        return stack.label_values(label.strip(), selector.strip())
    assert definition.startswith("query_result("), definition
    pattern = re.compile(variable["regex"].strip("/"))
    found = set()
    for series in stack.query(definition[len("query_result("):-1]):
        text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(series["metric"].items())) + "}"
        found.update(pattern.findall(text))
    return sorted(found)


def test_variables_offer_concrete_values_and_queries_return_series(stack: Stack) -> None:
    values: dict[str, dict[str, str]] = {}
    for uid, model in dashboards().items():
        chosen: dict[str, str] = {}
        for variable in model["templating"]["list"]:
            if variable["type"] != "query":
                continue
            offered = wait_for(lambda v=variable, c=dict(chosen): resolve(stack, v, c) or None,
                               timeout=CONVERGE_S, what=f"{uid} variable {variable['name']}")
            choice = CHOICES[variable["name"]]
            assert choice in offered, f"{uid}: ${variable['name']} offers {offered}, not {choice!r}"
            chosen[variable["name"]] = choice
        values[uid] = chosen
    all_checks = checks(values)
    counts = poll(stack, all_checks)
    assert_expectations(all_checks, counts)
    print(summary("concrete", counts))


def panel_expr(uid: str, title: str, values: dict[str, str]) -> str:
    panel = next(p for p in dashboards()[uid]["panels"] if p["title"] == title)
    (target,) = panel["targets"]
    return substitute(target["expr"], values)


def test_fleet_stats_count_each_gpu_once_across_ha_replicas(stack: Stack) -> None:
    """Every shard runs as an HA pair, so the master holds each series twice; the stats must not."""
    values = dict.fromkeys(["region", "node", "gpu", "namespace", "pod", "shard"], ".*")

    def value(title: str) -> float:
        (sample,) = stack.query(panel_expr("gpufed-cluster", title, values))
        return float(sample["value"][1])

    raw = wait_for(lambda: int(stack.query("count(DCGM_FI_DEV_GPU_UTIL)")[0]["value"][1]) == 2 * GPUS_TOTAL
                   or None, timeout=CONVERGE_S, what="both replicas of every GPU series at the master")
    assert raw
    assert value("GPUs") == GPUS_TOTAL
    assert value("GPU nodes") == 6  # 4 fleet nodes, the attributed node, the node that is down
    assert value("GPUs allocated") == len(PODS)
    assert value("GPU exporters down") == 1
    assert value("Unhealthy GPUs") >= 1  # XID 79 on GPU 0; a simulated XID may add one
    assert value("Unhealthy GPU nodes") >= 2  # the node that is down and the attributed node
    per_child = {(s["metric"]["shard"], s["metric"]["replica"]): s["value"][1] for s in
                 stack.query(panel_expr("gpufed-federation", "Targets scraped per child", values))}
    assert per_child == {("region-0-0", "0"): "4", ("region-0-0", "1"): "4",
                         ("region-1-0", "0"): "2", ("region-1-0", "1"): "2"}


def test_parse_only_queries_name_real_panels() -> None:
    keys = {(uid, panel["title"], target["refId"]) for uid, model in dashboards().items()
            for panel in model["panels"] for target in panel.get("targets", [])}
    assert set(PARSE_ONLY) <= keys
    assert all(reason.strip() for reason in PARSE_ONLY.values())
