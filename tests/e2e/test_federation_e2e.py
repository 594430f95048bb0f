"""End to end: simulated fleet -> rendered child Prometheus servers -> remote_write -> master.

One stack per module, on loopback: a 12-node x 2-GPU simulated fleet over two regions
(every node behind ``/nodes/<node>/metrics`` on one port, so targets differ only in
``__metrics_path__`` and need an explicit ``identity``), the rendered master Prometheus
(``master/prometheus.yml`` with the flags from ``master/flags.json`` and the rule pack),
an HA pair of real Alertmanagers it alerts, and one child Prometheus per rendered child
dir, started from another cwd so file_sd's relative paths must resolve against the
config file's dir.

``test_every_node_arrives_once_with_its_shard_labels`` checks the steady state against
whatever assignment is current; ``test_added_shard_moves_only_its_share`` re-renders with
one more shard, reloads the children by SIGHUP and checks the master converges.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import require_tool, wait_for
from prom_process import PrometheusProcess
from webhook_capture import WebhookCapture

from alertmanager.models import ReplicaSpec
from alertmanager.render import ALERTMANAGER_FILE
from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.master import pipeline
from federation.master.render import FLAGS_FILE, MASTER_FILE, load_rule_pack
from federation.testing.harnesses.alertmanager import AlertmanagerHA, loopback_replicas
from sharder.engine.assignment import Assignment
from sharder.kernel.promtool import Promtool
from sharder.model.inventory import Target

pytestmark = pytest.mark.e2e

NODES = 12
GPUS = 2
REGIONS = {"region-0": 2, "region-1": 1}
KEPT = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"]
DROPPED = "DCGM_FI_DEV_POWER_USAGE"  # served by every simulated node, not in the keep list
CONVERGE_S = 30.0
FAST = {"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}
#: E2EFleetReporting fires as soon as GPU data reaches the master; one per region.
#: E2EHandoverCopies gives every node two alerts that differ only in ``shard``, as a rule
#: without ``max without (shard, replica)`` does while a hand-over's old and new owner both
#: scrape the node; the master's alert_relabel_configs must make them one. E2EPerShard is
#: about a shard (``node="*"``), so it must keep ``shard``.
E2E_RULES = """\
groups:
  - name: e2e
    interval: 1s
    rules:
      - alert: E2EFleetReporting
        expr: count by (cluster, region) (DCGM_FI_DEV_GPU_UTIL) > 0
        labels: {severity: warning, component: e2e, node: "*"}
      - alert: E2EHandoverCopies
        expr: up{job="gpu"} or label_replace(up{job="gpu"}, "shard", "$1-next", "shard", "(.+)")
        labels: {severity: info, component: e2e}
      - alert: E2EPerShard
        expr: group by (cluster, region, shard) (up{job="gpu"})
        labels: {severity: info, component: e2e, node: "*"}
"""


def dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=True)


def spec_document(
    *, master_port: int, shards: dict[str, int], alertmanagers: list[ReplicaSpec], hook: str, rules: Path
) -> dict[str, Any]:
    return {
        "cluster": "e2e",
        "regions": [{"name": name, "shards": count} for name, count in shards.items()],
        "sharding": {"replication_factor": 1},
        "jobs": [{"name": "gpu", "scrape_interval": "1s", "keep_metrics": KEPT}],
        "remote_write": [
            {
                "name": "master",
                "url": f"http://127.0.0.1:{master_port}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
            }
        ],
        "children": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "master": {
            "port": master_port,
            "scrape_interval": "1s",
            "evaluation_interval": "1s",
            "extra_rule_files": [str(rules)],
        },
        "alerting": {
            "replicas": [r.model_dump() for r in alertmanagers],
            "receivers": [{"name": "capture", "webhooks": [{"url": hook}]}],
            "default_receiver": "capture",
            "timing": FAST,
            "severities": dict.fromkeys(("critical", "warning", "info"), FAST),
        },
    }


def inventory_document(fleet: FleetApp) -> dict[str, Any]:
    return {
        "targets": [
            {
                "address": "127.0.0.1",
                "port": fleet.http.port,
                "job": "gpu",
                "node": node.name,
                "region": node.region,
                "rack": node.rack,
                "team": node.team,
                "gpus": GPUS,
                "metrics_path": f"/nodes/{node.name}/metrics",
                "identity": f"gpu/{node.name}",
            }
            for node in fleet.nodes.values()
        ]
    }


@dataclass
class Federation:
    root: Path
    prometheus: str
    client: httpx.Client
    master: PrometheusProcess
    fleet: FleetApp
    targets: list[Target]
    assignment: Assignment
    alertmanagers: AlertmanagerHA
    hook: WebhookCapture
    children: dict[str, PrometheusProcess] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def spec_path(self) -> Path:
        return self.root / "federation.yaml"

    @property
    def inventory_path(self) -> Path:
        return self.root / "inventory.yaml"

    def write_spec(self, shards: dict[str, int]) -> None:
        document = spec_document(
            master_port=self.master.port,
            shards=shards,
            alertmanagers=self.alertmanagers.alerting.replicas,
            hook=self.hook.url,
            rules=self.root / "e2e-rules.yml",
        )
        self.spec_path.write_text(dump(document), encoding="utf-8")

    def start_child(self, child: str) -> PrometheusProcess:
        process = PrometheusProcess(
            self.prometheus,
            config=self.out / "children" / child / "prometheus.yml",
            data=self.root / "data" / child,
            log=self.root / "logs" / f"{child}.log",
            client=self.client,
            cwd=self.root / "elsewhere",  # file_sd paths must not depend on the cwd
        )
        self.children[child] = process
        process.start()
        return process

    def shard_of(self, node: str) -> str:
        return self.assignment.targets[f"gpu/{node}"]


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    prometheus = require_tool("prometheus")
    promtool = require_tool("promtool")
    root = tmp_path_factory.mktemp("federation")
    for sub in ("data", "logs", "elsewhere"):
        (root / sub).mkdir()
    (root / "e2e-rules.yml").write_text(E2E_RULES, encoding="utf-8")

    settings = ExporterSettings(backend="simulated", gpus=GPUS, listen="127.0.0.1:0", collect_interval=0.5)
    fleet = FleetApp(settings, fleet_nodes(NODES, regions=len(REGIONS)))
    replicas = loopback_replicas(2)
    with httpx.Client(timeout=2.0) as client, WebhookCapture() as hook:
        # The master runs the rendered config, so it is created (port chosen) before the
        # render that needs its port, and started after it with the rendered flags.
        master = PrometheusProcess(
            prometheus,
            config=root / "out" / MASTER_FILE,
            data=root / "data" / "master",
            log=root / "logs" / "master.log",
            client=client,
        )
        fleet.start()
        try:
            spec_path, inventory_path = root / "federation.yaml", root / "inventory.yaml"
            first_spec = spec_document(
                master_port=master.port,
                shards=REGIONS,
                alertmanagers=replicas,
                hook=hook.url,
                rules=root / "e2e-rules.yml",
            )
            spec_path.write_text(dump(first_spec), encoding="utf-8")
            inventory_path.write_text(dump(inventory_document(fleet)), encoding="utf-8")
            spec, targets = pipeline.load_inputs(spec_path, inventory_path)
            result = pipeline.render(spec, targets, out=root / "out", checker=Promtool(promtool))
            assert result.checked == sum(REGIONS.values()) and result.master_checked
            assert spec.alerting is not None
            am_config = (root / "out" / ALERTMANAGER_FILE).read_bytes()
            alertmanagers = AlertmanagerHA(
                spec.alerting, config=am_config, binary=require_tool("prometheus-alertmanager")
            )
            master.extra_args = rendered_master_flags(root / "out")
            stack = Federation(
                root=root,
                prometheus=prometheus,
                client=client,
                master=master,
                fleet=fleet,
                targets=targets,
                assignment=result.assignment,
                alertmanagers=alertmanagers,
                hook=hook,
            )
            with alertmanagers, master:
                master.wait_ready()
                try:
                    for entry in result.manifest["children"]:
                        stack.start_child(entry["child"])
                    for child in stack.children.values():
                        child.wait_ready()
                    yield stack
                finally:
                    for child in stack.children.values():
                        child.stop()
        finally:
            fleet.stop()


def rendered_master_flags(out: Path) -> tuple[str, ...]:
    """``master/flags.json`` minus where to listen and store, which the harness picks."""
    flags = json.loads((out / FLAGS_FILE).read_text(encoding="utf-8"))["flags"]
    own = ("--storage.tsdb.path=", "--web.listen-address=")
    return tuple(flag for flag in flags if not flag.startswith(own))


def gpu_targets(process: PrometheusProcess) -> set[str]:
    """The fleet targets a child scrapes (its heartbeat's scrape of itself left out)."""
    return {f"gpu/{t['labels']['node']}" for t in process.active_targets() if t["labels"]["job"] == "gpu"}


def up_by_node(federation: Federation) -> dict[str, list[dict[str, str]]] | None:
    """node -> label sets of its live ``up`` series at the master, once all nodes report 1."""
    series = federation.master.query('up{job="gpu"}')
    by_node: dict[str, list[dict[str, str]]] = {}
    for sample in series:
        if sample["value"][1] != "1":
            return None
        by_node.setdefault(sample["metric"]["node"], []).append(sample["metric"])
    return by_node if len(by_node) == NODES else None


def converged(federation: Federation) -> dict[str, list[dict[str, str]]] | None:
    """``up_by_node`` once every node has exactly one series, from the shard that owns it."""
    by_node = up_by_node(federation)
    if by_node is None:
        return None
    for node, label_sets in by_node.items():
        if [labels["shard"] for labels in label_sets] != [federation.shard_of(node)]:
            return None
    return by_node


def test_every_node_arrives_once_with_its_shard_labels(federation: Federation) -> None:
    by_node = wait_for(lambda: up_by_node(federation), timeout=CONVERGE_S, what="up == 1 for every node")
    # Each child scrapes its shard's targets and nothing else...
    for child, process in federation.children.items():
        scraped = gpu_targets(process)
        assert scraped == set(federation.assignment.members(child)), child
    # ...so every node reaches the master exactly once: no target is scraped by two children.
    assert sorted(by_node) == sorted(federation.fleet.nodes)
    assert {node: len(sets) for node, sets in by_node.items()} == dict.fromkeys(federation.fleet.nodes, 1)
    counts = federation.master.query('count by (node) (up{job="gpu"})')
    assert {s["metric"]["node"]: s["value"][1] for s in counts} == dict.fromkeys(federation.fleet.nodes, "1")

    fleet_port = federation.fleet.http.port
    for node, (labels,) in by_node.items():
        shard = federation.shard_of(node)
        region = federation.assignment.shards[shard].region
        assert labels["cluster"] == "e2e"
        assert labels["shard"] == shard
        assert labels["replica"] == "0"
        # Region isolation: the node's own region is its shard's region.
        assert labels["region"] == federation.fleet.nodes[node].region == region
        assert labels["instance"] == f"127.0.0.1:{fleet_port}"

    # __metrics_path__ took effect: each target's GPU series come from its own node's path.
    def gpu_util() -> dict[str, int] | None:
        series = federation.master.query("DCGM_FI_DEV_GPU_UTIL")
        per_node = Counter(s["metric"]["node"] for s in series)
        return dict(per_node) if len(per_node) == NODES else None

    per_node = wait_for(gpu_util, timeout=CONVERGE_S, what="DCGM_FI_DEV_GPU_UTIL for every node")
    assert per_node == dict.fromkeys(federation.fleet.nodes, GPUS)
    for sample in federation.master.query("DCGM_FI_DEV_GPU_UTIL"):
        assert sample["metric"]["Hostname"] == sample["metric"]["node"]
        assert sample["metric"]["shard"] == federation.shard_of(sample["metric"]["node"])

    # The keep list: a family every node serves is absent everywhere downstream.
    some_node = next(iter(federation.fleet.nodes))
    exposition = federation.client.get(f"http://127.0.0.1:{fleet_port}/nodes/{some_node}/metrics").text
    assert f"\n{DROPPED}{{" in exposition
    assert federation.master.query(DROPPED) == []
    for process in federation.children.values():
        assert process.query(DROPPED) == []
    assert federation.master.query(f'count({{__name__=~"{"|".join(KEPT)}"}})')


def test_each_child_heartbeat_reaches_the_master_as_one_series(federation: Federation) -> None:
    """Each child scrapes itself (here at the spec's default address, which does not resolve:
    the scrape fails, its `up` is 0, and the sample is the heartbeat all the same). That `up`
    leaves the child renamed, beside the scrape's report series: no `up` of the job at the master,
    and no sample dropped by relabelling."""
    expected = {(federation.assignment.shards[shard].region, shard)
                for shard in federation.assignment.shards}

    def beats() -> set[tuple[str, str]] | None:
        series = federation.master.query("gpufed_child_heartbeat")
        found = {(s["metric"]["region"], s["metric"]["shard"]) for s in series}
        return found if found == expected else None

    wait_for(beats, timeout=CONVERGE_S, what="a heartbeat from every child at the master")
    for sample in federation.master.query("gpufed_child_heartbeat"):
        labels = sample["metric"]
        assert labels["cluster"] == "e2e" and labels["replica"] == "0" and labels["job"] == "gpufed-heartbeat"
        assert labels["instance"] == f"child-{labels['shard']}:9090"
    names = {s["metric"]["__name__"] for s in federation.master.query('{job="gpufed-heartbeat"}')}
    assert "up" not in names and {"gpufed_child_heartbeat", "scrape_duration_seconds"} <= names
    for process in federation.children.values():
        assert process.query("prometheus_remote_storage_samples_dropped_total > 0") == []
    assert federation.master.query("gpufed:shard_silent:bool") == []


def test_master_runs_the_rendered_config_and_rule_pack(federation: Federation) -> None:
    info = federation.master.runtime_info()
    assert info["reloadConfigSuccess"] is True
    response = federation.client.get(f"{federation.master.url}/api/v1/rules")
    response.raise_for_status()
    groups = response.json()["data"]["groups"]
    files = {Path(group["file"]).name for group in groups}
    assert files == {*load_rule_pack(), "e2e-rules.yml"}
    assert all(rule["health"] != "err" for group in groups for rule in group["rules"])
    flags = federation.client.get(f"{federation.master.url}/api/v1/status/flags").json()["data"]
    assert flags["web.enable-remote-write-receiver"] == "true"


def test_master_alert_reaches_both_alertmanagers_and_is_delivered_once(federation: Federation) -> None:
    regions = sorted(REGIONS)

    def alerts_at(url: str) -> list[dict[str, Any]] | None:
        response = federation.client.get(
            f"{url}/api/v2/alerts", params={"filter": 'alertname="E2EFleetReporting"'}
        )
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found if sorted(a["labels"]["region"] for a in found) == regions else None

    for url in federation.alertmanagers.urls:  # Prometheus sends to every replica, never to one
        alerts = wait_for(lambda url=url: alerts_at(url), timeout=CONVERGE_S, what=f"master alerts at {url}")
        for alert in alerts:
            assert alert["labels"]["cluster"] == "e2e"
            assert "replica" not in alert["labels"], "alert_relabel_configs must drop replica labels"

    def firing_by_region() -> dict[str, int] | None:
        counts = Counter(
            n["groupLabels"]["region"]
            for n in federation.hook.received()
            if n["status"] == "firing" and n["groupLabels"].get("alertname") == "E2EFleetReporting"
        )
        return dict(counts) if sorted(counts) == regions else None

    wait_for(firing_by_region, timeout=CONVERGE_S, what="one notification per region group")
    time.sleep(3)  # past both replicas' peer timeout and group_interval: a duplicate would be here
    assert firing_by_region() == dict.fromkeys(regions, 1)


def test_hand_over_copies_of_a_node_alert_are_one_alert(federation: Federation) -> None:
    shards = sorted(federation.assignment.shards)
    nodes = sorted(federation.fleet.nodes)

    def alerts_at(url: str, name: str) -> list[dict[str, Any]]:
        response = federation.client.get(f"{url}/api/v2/alerts", params={"filter": f'alertname="{name}"'})
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found

    def one_per_shard(url: str) -> list[dict[str, Any]] | None:
        found = alerts_at(url, "E2EPerShard")
        return found if sorted(a["labels"].get("shard", "") for a in found) == shards else None

    def every_node(url: str) -> list[dict[str, Any]] | None:
        found = alerts_at(url, "E2EHandoverCopies")
        return found if {a["labels"]["node"] for a in found} == set(nodes) else None

    for url in federation.alertmanagers.urls:
        per_shard = wait_for(
            lambda url=url: one_per_shard(url), timeout=CONVERGE_S, what=f"E2EPerShard at {url}"
        )
        assert all(a["labels"]["node"] == "*" for a in per_shard)
        copies = wait_for(
            lambda url=url: every_node(url), timeout=CONVERGE_S, what=f"E2EHandoverCopies at {url}"
        )
        # Prometheus sent two per node (shard X and X-next); without shard they are one alert.
        assert sorted(a["labels"]["node"] for a in copies) == nodes
        assert all("shard" not in a["labels"] and "replica" not in a["labels"] for a in copies)


def test_added_shard_moves_only_its_share(federation: Federation) -> None:
    wait_for(lambda: converged(federation), timeout=CONVERGE_S, what="initial federation converged")
    old = federation.assignment
    grown = {**REGIONS, "region-1": REGIONS["region-1"] + 1}
    federation.write_spec(grown)
    spec, targets = pipeline.load_inputs(federation.spec_path, federation.inventory_path)
    assert targets == federation.targets

    plan = pipeline.plan(spec, federation.targets, previous_dir=federation.out)
    assert plan.added_shards == ["region-1-1"]
    assert plan.removed_shards == [] and plan.added_targets == [] and plan.removed_targets == []
    # Only region-1 changes, and only toward the new shard. Equal weights and a 1.05 load
    # bound leave room for exactly half of region-1 on each of its two shards.
    region_1 = [t for t in federation.targets if t.region == "region-1"]
    assert {(m.from_shard, m.to_shard) for m in plan.moves} == {("region-1-0", "region-1-1")}
    assert plan.counts.moved == len(region_1) // 2

    result = pipeline.render(
        spec, federation.targets, out=federation.out, checker=Promtool(require_tool("promtool"))
    )
    assert result.previous == old
    assert result.assignment.targets == {**old.targets, **{m.identity: m.to_shard for m in plan.moves}}
    federation.assignment = result.assignment

    for process in federation.children.values():
        process.reload()
    federation.start_child("region-1-1").wait_ready()

    # Old owners stop scraping moved nodes and send staleness markers, so each node is
    # again live exactly once, now labelled with its new shard.
    by_node = wait_for(
        lambda: converged(federation), timeout=CONVERGE_S, what="master converged after reshard"
    )
    moved = {m.identity.removeprefix("gpu/") for m in plan.moves}
    assert {node for node, (labels,) in by_node.items() if labels["shard"] == "region-1-1"} == moved
    for child, process in federation.children.items():
        scraped = gpu_targets(process)
        assert scraped == set(federation.assignment.members(child)), child
