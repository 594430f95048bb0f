"""A real federation on loopback for the dashboard queries (see test_dashboards_e2e.py).

``running_stack`` starts, and always stops, a simulated fleet, one pod-attributed node
with injected XIDs, a target that is down, the real node-exporter (the pinned
``prometheus-node-exporter``) as the attributed node's job ``node`` target, a node on the
exporter's NVML backend over the suite's fake NVML (NVLink links, one down), scraped with the
node job of ``examples/federation.yaml`` (its keep list included), HAMi-format series
(``hami_series``) as job ``hami-scheduler``, rendered child Prometheus
HA pairs writing to a master Prometheus that loads the rule pack, an Alertmanager and the DingTalk relay in
front of the DingTalk stand-in. The master runs the config ``gpufed render`` writes
(its meta-monitoring jobs included); it finds the children through ``/v1/sd-children``,
answered here from the product's own ``meta_monitoring.children_groups``. Only processes
and servers it started are stopped.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import require_tool, stop_process, wait_for
from hami_series import HamiSeries
from prom_process import PrometheusProcess
from prometheus_client import CollectorRegistry

from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import parse_config
from exporter.backend import GpuBackend
from exporter.catalogue import FAMILIES, select_families
from exporter.collection import Collection, CollectionLoop
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.fleet import FleetApp, fleet_nodes
from exporter.models import GpuDevice, Reading, XidEvent
from exporter.nvml_backend import NvmlBackend
from exporter.server import HttpServer, NodeRoutes
from exporter.settings import ExporterSettings
from exporter.simulated import SimulatedBackend
from federation.demo.router import ChildRouter
from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer, free_port
from federation.master import meta_monitoring, pipeline
from federation.master.render import MASTER_FILE
from federation.testing.harnesses.alertmanager import RelayThread
from sharder.kernel.promtool import Promtool
from tests.exporter.fake_nvml import FakeGpu, FakeNvml

REGIONS = ("region-0", "region-1")
SPECIAL = "gpu-region-0-attributed"
FAKE_NVML = "gpu-region-1-fake-nvml"
#: The fake-NVML node's links: 4 per GPU, GPU 0's link 2 down.
FAKE_LINKS, FAKE_LINK_DOWN = 4, 2
#: Each link's TX counter grows by (link + 1) x this many KiB per second (RX by half).
FAKE_TX_KIB_S = 100_000
DOWN = "gpu-region-0-down"
PODS = {0: ("training", "llm-pretrain-0"), 1: ("training", "llm-pretrain-0"),
        2: ("training", "llm-pretrain-0"), 3: ("training", "llm-pretrain-0"),
        4: ("inference", "chat-api-0"), 5: ("inference", "chat-api-0")}
GPUS_TOTAL = 4 * 2 + 8 + 2  # fleet nodes x GPUs + the attributed node + the fake-NVML node
EXAMPLE_SPEC = Path(__file__).resolve().parents[2] / "examples" / "federation.yaml"


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
        # A fleet halfway through the DCGM 4.x upgrade: the fleet nodes keep 3.x names, this
        # node (the only one with pods) serves 4.x names, so every pod panel reads 4.x series.
        registry.register(SnapshotCollector(collection, policy, dcgm_names="4"))
        collection.collect_once()
        loop = CollectionLoop([collection], interval=0.5)
        http = HttpServer(NodeRoutes(registry, ready=lambda: True), host="127.0.0.1", port=0)
        loop.start()
        http.start()
        return cls(http, loop)

    def stop(self) -> None:
        self.http.stop()
        self.loop.stop()


class GrowingLinks(FakeGpu):
    """A fake NVML GPU whose NVLink counters grow with time, so throughput is not zero."""

    started = time.monotonic()

    @property  # type: ignore[override]
    def nvlink_tx_kib(self) -> int:
        return 5_000_000 + int(FAKE_TX_KIB_S * (time.monotonic() - self.started))

    @nvlink_tx_kib.setter
    def nvlink_tx_kib(self, value: int) -> None:
        """FakeGpu's __init__ sets the static default; the reading above replaces it."""


@dataclass
class FakeNvmlNode:
    """gpufed-exporter's NVML backend over the test suite's fake NVML (tests/exporter/fake_nvml.py):
    2 H100s with NVLink, the per-link family on, served as one node."""

    http: HttpServer
    loop: CollectionLoop
    backend: NvmlBackend

    @classmethod
    def start(cls) -> FakeNvmlNode:
        gpus = [GrowingLinks(uuid=f"GPU-fake-nvml-{i}", bus_id=f"00000000:{0x18 + i:02X}:00.0", minor=i,
                             nvlinks=FAKE_LINKS, nvlinks_down={FAKE_LINK_DOWN} if i == 0 else set())
                for i in range(2)]
        backend = NvmlBackend(FakeNvml(gpus), event_timeout_ms=20)
        collection = Collection(backend, select_families(include=["nvlink"]), timeout=None)
        registry = CollectorRegistry(auto_describe=False)
        policy = LabelPolicy(FAKE_NVML, placement={"region": REGIONS[1]})
        registry.register(SnapshotCollector(collection, policy))
        collection.collect_once()
        loop = CollectionLoop([collection], interval=0.5)
        http = HttpServer(NodeRoutes(registry, ready=lambda: True), host="127.0.0.1", port=0)
        loop.start()
        http.start()
        return cls(http, loop, backend)

    def stop(self) -> None:
        self.http.stop()
        self.loop.stop()
        self.backend.close()


@dataclass
class Stack:
    master: PrometheusProcess
    client: httpx.Client

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.master.query(promql)

    def count(self, promql: str, *, what: object) -> int:
        """Series count; a query Prometheus refuses fails naming ``what`` and the parser's error."""
        response = self.client.get(f"{self.master.url}/api/v1/query", params={"query": promql})
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"{what}: Prometheus refused {promql!r}: {body.get('error')}")
        return len(body["data"]["result"])

    def label_values(self, label: str, selector: str) -> list[str]:
        response = self.client.get(f"{self.master.url}/api/v1/label/{label}/values",
                                   params={"match[]": selector})
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return sorted(body["data"])


def example_node_job() -> dict[str, Any]:
    """The shipped example's node job (keep and drop lists as shipped), scraped every second."""
    jobs = yaml.safe_load(EXAMPLE_SPEC.read_text(encoding="utf-8"))["jobs"]
    job: dict[str, Any] = next(j for j in jobs if j["name"] == "node")
    return {**job, "scrape_interval": "1s"}


def inventory(fleet: FleetApp, special_port: int, node_exporter_port: int, hami_port: int, fake_nvml_port: int
              ) -> dict[str, Any]:
    targets = [{"address": "127.0.0.1", "port": fleet.http.port, "job": "gpu", "node": node.name,
                "region": node.region, "rack": node.rack, "team": node.team, "gpus": 2,
                "metrics_path": f"/nodes/{node.name}/metrics", "identity": f"gpu/{node.name}"}
               for node in fleet.nodes.values()]
    targets.append({"address": "127.0.0.1", "port": special_port, "job": "gpu", "node": SPECIAL,
                    "region": REGIONS[0], "gpus": 8, "identity": f"gpu/{SPECIAL}"})
    targets.append({"address": "127.0.0.1", "port": fake_nvml_port, "job": "gpu", "node": FAKE_NVML,
                    "region": REGIONS[1], "gpus": 2, "identity": f"gpu/{FAKE_NVML}"})
    targets.append({"address": "127.0.0.1", "port": free_port(), "job": "gpu", "node": DOWN,
                    "region": REGIONS[0], "gpus": 8, "identity": f"gpu/{DOWN}"})
    targets.append({"address": "127.0.0.1", "port": node_exporter_port, "job": "node", "node": SPECIAL,
                    "region": REGIONS[0], "identity": f"node/{SPECIAL}"})
    # HAMi's scheduler pod (extender series and its kube-scheduler's) and vGPU monitor, one target
    targets.append({"address": "127.0.0.1", "port": hami_port, "job": "hami-scheduler", "node": SPECIAL,
                    "region": REGIONS[0], "identity": f"hami-scheduler/{SPECIAL}"})
    return {"targets": targets}


def spec(*, master_port: int, sd_port: int, router: ChildRouter, am: tuple[int, int], relay_port: int
         ) -> dict[str, Any]:
    """The federation.yaml this stack runs: the master's config is rendered from it, as shipped."""
    return {
        "cluster": "e2e",
        "regions": [{"name": name, "shards": 1} for name in REGIONS],
        "sharding": {"replication_factor": 2},
        "jobs": [{"name": "gpu", "scrape_interval": "1s"}, example_node_job(),
                 {"name": "hami-scheduler", "scrape_interval": "1s"}],
        "remote_write": [{"name": "master", "url": f"http://127.0.0.1:{master_port}/api/v1/write",
                          "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms",
                                           "max_backoff": "1s"}}],
        "children": {"scrape_interval": "1s", "evaluation_interval": "1s",
                     "http_sd_url": f"http://127.0.0.1:{sd_port}"},
        "master": {"port": master_port, "scrape_interval": "1s", "evaluation_interval": "1s",
                   # children listen on ports chosen at start: reached by name through a router
                   "monitoring": {"child_url": router.template()}},
        "alerting": {
            "relay_url": f"http://127.0.0.1:{relay_port}",
            "replicas": [{"name": "am-0", "host": "127.0.0.1", "port": am[0], "cluster_port": am[1]}],
            "robots": [{"name": "ops", "url": "https://oapi.dingtalk.com/robot/send?access_token=${T}"}],
            "receivers": [{"name": "ops", "robots": ["ops"]}],
            "default_receiver": "ops",
            "routes": [{"region": region, "robot": "ops"} for region in REGIONS],
        },
    }


class ChildrenSd:
    """Answers the controller's ``GET /v1/sd-children`` for a fixed assignment (no controller here)."""

    def __init__(self, body: bytes) -> None:
        self.body = body  # replaced once the assignment is known
        sd = self

        class Handler(LoopbackHandler):
            def do_GET(self) -> None:
                found = self.path == meta_monitoring.SD_CHILDREN_PATH
                self.reply(200 if found else 404, sd.body if found else b"[]",
                           content_type="application/json")

        self.server = LoopbackHTTPServer(Handler, name="children-sd").start()
        self.port = self.server.port

    def stop(self) -> None:
        self.server.stop()


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


@contextmanager
def running_stack(root: Path) -> Iterator[Stack]:
    prometheus, promtool = require_tool("prometheus"), require_tool("promtool")
    alertmanager = require_tool("prometheus-alertmanager")
    node_exporter = require_tool("prometheus-node-exporter")
    with ExitStack() as stack, httpx.Client(timeout=5.0) as client:
        dingtalk = stack.enter_context(LocalDingTalk())
        relay_config = parse_config({"robots": {
            "ops": {"url": dingtalk.add_robot("tok-ops-0123456789")},
            # The stand-in refuses every message to this robot (keyword missing: errcode 310000).
            "audit": {"url": dingtalk.add_robot("tok-audit-0123456789", keywords=["never-sent-keyword"])},
        }})
        relay = stack.enter_context(RelayThread(create_app(relay_config)))

        am_port, am_cluster_port = free_port(), free_port()
        (root / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(relay.port)))
        with (root / "alertmanager.log").open("wb") as log:
            am = subprocess.Popen(
                [alertmanager, f"--config.file={root / 'alertmanager.yml'}", f"--storage.path={root / 'am'}",
                 f"--web.listen-address=127.0.0.1:{am_port}",
                 f"--cluster.listen-address=127.0.0.1:{am_cluster_port}",
                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop_process, am)

        settings = ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0", collect_interval=0.5,
                                    families_include=["pcie", "gpm", "process"])
        fleet = FleetApp(settings, fleet_nodes(4, regions=len(REGIONS)))
        fleet.start()
        stack.callback(fleet.stop)
        special = AttributedNode.start()
        stack.callback(special.stop)
        fake_nvml = FakeNvmlNode.start()
        stack.callback(fake_nvml.stop)
        node_exporter_port = free_port()
        with (root / "node-exporter.log").open("wb") as log:
            node_proc = subprocess.Popen(
                [node_exporter, f"--web.listen-address=127.0.0.1:{node_exporter_port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop_process, node_proc)

        hami = stack.enter_context(HamiSeries())
        router = stack.enter_context(ChildRouter(port=0))
        sd = ChildrenSd(b"[]")
        stack.callback(sd.stop)
        master = PrometheusProcess(prometheus, config=root / "out" / MASTER_FILE,
                                   data=root / "master-data", log=root / "master.log", client=client,
                                   extra_args=("--web.enable-remote-write-receiver",))
        document = spec(master_port=master.port, sd_port=sd.port, router=router,
                        am=(am_port, am_cluster_port), relay_port=relay.port)
        (root / "federation.yaml").write_text(yaml.safe_dump(document))
        (root / "inventory.yaml").write_text(
            yaml.safe_dump(inventory(fleet, special.http.port, node_exporter_port, hami.port,
                                     fake_nvml.http.port)))
        loaded, targets = pipeline.load_inputs(root / "federation.yaml", root / "inventory.yaml")
        # gpufed render's own pipeline and promtool check, master config included
        result = pipeline.render(loaded, targets, out=root / "out", checker=Promtool(promtool))
        assert result.master_checked
        sd.body = json.dumps(
            meta_monitoring.children_groups(loaded, result.assignment)).encode()
        children = {
            entry["child"]: PrometheusProcess(prometheus, config=root / "out" / entry["config"],
                                              data=root / f"data-{entry['child']}",
                                              log=root / f"{entry['child']}.log", client=client)
            for entry in result.manifest["children"]
        }
        for child, proc in children.items():
            router.set(child, proc.port)
        stack.enter_context(master)
        for proc in children.values():
            stack.enter_context(proc)
        master.wait_ready()
        for proc in children.values():
            proc.wait_ready()
        wait_for(lambda: client.get(f"http://127.0.0.1:{am_port}/-/ready").status_code == 200,
                 timeout=15, what="alertmanager ready")
        yield Stack(master=master, client=client)
