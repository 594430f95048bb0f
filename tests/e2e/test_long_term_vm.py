"""End to end: the master forwards the fleet into VictoriaMetrics, and PromQL reads it back.

Thanos Receive cannot run here; VictoriaMetrics (Debian's ``victoria-metrics``) is a real
remote-write receiver that answers PromQL, so it stands where the long-term store stands:
simulated fleet -> two rendered children (one per region) -> remote_write -> the rendered
master (``master.long_term.kind: victoriametrics``) -> remote_write -> VictoriaMetrics.
Every config is the one gpufed renders (and promtool checks); nothing is written by hand.

What must arrive: each GPU series with the child's labels (``cluster``, ``region``,
``shard``, ``replica``) and the node's, exactly the label sets the master holds; and the
master's own series with the master's external labels (``cluster``, ``replica: master-0``),
which Prometheus adds only on the way out, so they prove the forwarded stream itself.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import require_tool, stop_process, wait_for
from prom_process import PrometheusProcess

from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.localrun.loopback import free_port
from federation.master import pipeline
from federation.master.render import FLAGS_FILE, MASTER_FILE
from sharder.kernel.promtool import Promtool

pytestmark = pytest.mark.e2e

NODES = 4
GPUS = 2
REGIONS = ("region-0", "region-1")
KEPT = ["DCGM_FI_DEV_GPU_UTIL"]
ARRIVE_S = 30.0


class VictoriaMetrics:
    """One single-node ``victoria-metrics`` on a loopback port; always stopped by its handle."""

    def __init__(self, binary: str, *, data: Path, log: Path, client: httpx.Client) -> None:
        self.binary, self.data, self.log_path, self.client = binary, data, log, client
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> VictoriaMetrics:
        args = [
            self.binary,
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.data}",
            "-retentionPeriod=1d",
            # By default a sample becomes visible to queries 30 s after it arrives, and
            # answers are cached; the test reads what arrived a second ago, every time.
            "-search.latencyOffset=0s",
            "-search.disableCache",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._healthy, timeout=15.0, interval=0.1, what=f"victoria-metrics on {self.url}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc)

    def _healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"victoria-metrics exited:\n{self.log_path.read_text(errors='replace')}")
        try:
            return self.client.get(f"{self.url}/health").status_code == 200
        except httpx.TransportError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query through VictoriaMetrics' Prometheus API."""
        response = self.client.get(f"{self.url}/api/v1/query", params={"query": promql})
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def vm_binary() -> str:
    """``$GPUFED_VM_BIN/victoria-metrics`` (``scripts/stack_path.sh``), else PATH."""
    folder = os.environ.get("GPUFED_VM_BIN")
    candidate = Path(folder) / "victoria-metrics" if folder else None
    if candidate is not None and candidate.is_file():
        return str(candidate)
    return require_tool("victoria-metrics")


def spec_document(*, master_port: int, vm_url: str) -> dict[str, Any]:
    return {
        "cluster": "e2e",
        "regions": [{"name": region, "shards": 1} for region in REGIONS],
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
            "rule_pack": False,
            "monitoring": {"enabled": False},  # the master scrapes only itself
            "long_term": {
                "kind": "victoriametrics",
                "url": f"{vm_url}/api/v1/write",
                # capacity and max_shards keep the master's defaults (50000, 100)
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
            },
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


def label_sets(series: list[dict[str, Any]]) -> list[tuple[tuple[str, str], ...]]:
    return sorted(tuple(sorted(s["metric"].items())) for s in series)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=2.0) as http:
        yield http


def test_master_forwards_into_victoriametrics_with_labels(tmp_path: Path, client: httpx.Client) -> None:
    prometheus = require_tool("prometheus")
    for sub in ("data", "logs", "elsewhere"):
        (tmp_path / sub).mkdir()
    settings = ExporterSettings(backend="simulated", gpus=GPUS, listen="127.0.0.1:0", collect_interval=0.5)
    fleet = FleetApp(settings, fleet_nodes(NODES, regions=len(REGIONS)))
    out = tmp_path / "out"
    master = PrometheusProcess(
        prometheus, config=out / MASTER_FILE, data=tmp_path / "data" / "master",
        log=tmp_path / "logs" / "master.log", client=client,
    )
    with VictoriaMetrics(
        vm_binary(), data=tmp_path / "data" / "vm", log=tmp_path / "logs" / "vm.log", client=client
    ) as vm:
        fleet.start()
        try:
            spec_path, inventory_path = tmp_path / "federation.yaml", tmp_path / "inventory.yaml"
            spec_path.write_text(yaml.safe_dump(spec_document(master_port=master.port, vm_url=vm.url)))
            inventory_path.write_text(yaml.safe_dump(inventory_document(fleet)))
            spec, targets = pipeline.load_inputs(spec_path, inventory_path)
            result = pipeline.render(spec, targets, out=out, checker=Promtool(require_tool("promtool")))
            assert result.master_checked
            flags = json.loads((out / FLAGS_FILE).read_text())["flags"]
            own = ("--storage.tsdb.path=", "--web.listen-address=")
            master.extra_args = tuple(f for f in flags if not f.startswith(own))
            children = [
                PrometheusProcess(
                    prometheus, config=out / "children" / entry["child"] / "prometheus.yml",
                    data=tmp_path / "data" / entry["child"], log=tmp_path / "logs" / f"{entry['child']}.log",
                    client=client, cwd=tmp_path / "elsewhere",
                )
                for entry in result.manifest["children"]
            ]
            with master:
                master.wait_ready()
                try:
                    for child in children:
                        child.start()
                    check_forwarded(master=master, vm=vm, fleet=fleet, shards=result.assignment.targets)
                finally:
                    for child in children:
                        child.stop()
        finally:
            fleet.stop()


def check_forwarded(
    *, master: PrometheusProcess, vm: VictoriaMetrics, fleet: FleetApp, shards: dict[str, str]
) -> None:
    # The master runs the rendered long-term write, with the master's queue defaults.
    loaded = yaml.safe_load(master.client.get(f"{master.url}/api/v1/status/config").json()["data"]["yaml"])
    (write,) = loaded["remote_write"]
    assert (write["name"], write["url"]) == ("victoriametrics", f"{vm.url}/api/v1/write")
    assert (write["queue_config"]["capacity"], write["queue_config"]["max_shards"]) == (50000, 100)

    def every_gpu(source: PrometheusProcess | VictoriaMetrics) -> list[dict[str, Any]] | None:
        series = source.query("DCGM_FI_DEV_GPU_UTIL")
        per_node = Counter(s["metric"].get("node") for s in series)
        return series if per_node == dict.fromkeys(fleet.nodes, GPUS) else None

    at_master = wait_for(lambda: every_gpu(master), timeout=ARRIVE_S, what="every GPU at the master")
    at_vm = wait_for(lambda: every_gpu(vm), timeout=ARRIVE_S, what="every GPU in VictoriaMetrics")
    # What the children wrote into the master arrives as it is: the same label sets.
    assert label_sets(at_vm) == label_sets(at_master)
    for sample in at_vm:
        labels = sample["metric"]
        node = fleet.nodes[labels["node"]]
        assert labels["cluster"] == "e2e"
        assert labels["region"] == node.region
        assert labels["shard"] == shards[f"gpu/{node.name}"]
        assert labels["replica"] == "0"  # the child's replica; the master adds only missing labels

    # PromQL over the store: GPUs per region, as the fleet has them.
    counted = vm.query("count by (region) (DCGM_FI_DEV_GPU_UTIL)")
    per_region = {s["metric"]["region"]: s["value"][1] for s in counted}
    expected = Counter(node.region for node in fleet.nodes.values())
    assert per_region == {region: str(count * GPUS) for region, count in expected.items()}

    # The master's own series: external labels are added on the way out, never stored locally.
    (own_master,) = master.query('up{job="gpufed-master"}')
    assert "replica" not in own_master["metric"] and "cluster" not in own_master["metric"]

    def master_up_in_vm() -> list[dict[str, Any]] | None:
        return vm.query('up{job="gpufed-master"}') or None

    (own_vm,) = wait_for(master_up_in_vm, timeout=ARRIVE_S, what="the master's up in VictoriaMetrics")
    assert own_vm["metric"] == {**own_master["metric"], "cluster": "e2e", "replica": "master-0"}
    assert own_vm["value"][1] == "1"
