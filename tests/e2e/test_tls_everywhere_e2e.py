"""TLS on every hop on the 2.x line, with the configs gpufed renders from a spec's ``tls`` section.

``gpufed demo --tls`` (tests/e2e/test_demo_tls_e2e.py) proves the whole demo on line 3; this
module builds the same hops by hand on Prometheus 2.53.3 and Alertmanager 0.28.1, and keeps
the checks the demo does not make (the compose health checks' client file). On loopback,
every server demands a client certificate signed by a CA ``gpufed certs`` made:

    fleet exporter (gpufed-exporter fleet, --web.config.file)
        <- children (rendered prometheus.yml: scheme https + tls_config; tls/web-config.yml)
             via HTTP SD from the controller (gpufed serve --web.config.file; http_sd_configs.tls_config)
        -> remote_write to the master (tls_config; the master serves tls/web-config.yml)
    master -> both Alertmanagers (alerting.alertmanagers: https + tls_config; they serve TLS)
           -> meta-monitoring of children (SD from the controller), controller, itself,
              Alertmanagers and relay, all over https
    Alertmanagers -> relay (gpufed-dingtalk --web.config.file; webhook http_config.tls_config)
                  -> the DingTalk stand-in

The test reads every target up at the master, the fleet's nodes arriving through the
children's remote_write, and an alert from the master's rules delivered by the relay.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import stack_tool, stop_process, wait_for
from prom_process import PrometheusProcess

from alertmanager.amtool import Amtool
from alertmanager.models import ReplicaSpec
from alertmanager.render import ALERTMANAGER_FILE, RELAY_FILE
from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.localrun.dingtalk import LocalDingTalk, Message
from federation.localrun.loopback import free_port
from federation.master import pipeline
from federation.master.render import FLAGS_FILE, MASTER_FILE
from federation.testing.harnesses.alertmanager import AlertmanagerHA, loopback_replicas
from sharder.kernel.promtool import Promtool
from sharder.kernel.tls import HTTP_CLIENT_FILE, WEB_CONFIG_FILE
from webconfig.certs import make_certs

pytestmark = pytest.mark.e2e

NODES = 4
REGIONS = ("region-0", "region-1")
ROBOT, TOKEN, SECRET, KEYWORD = "tls-oncall", "tok-tls-e2e", "SECtls-e2e-secret", "GPU"
CONVERGE_S = 45.0
META_JOBS = {"gpufed-child", "gpufed-controller", "gpufed-master", "alertmanager", "gpufed-dingtalk"}
FAST = {"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"}
RULES = """\
groups:
  - name: tls-e2e
    interval: 1s
    rules:
      - alert: GPUFleetOverTLS
        expr: count by (cluster, region) (up{job="gpu"} == 1) > 0
        labels: {severity: warning, component: gpu, node: "*"}
        annotations: {summary: "GPU nodes report over TLS"}
"""


class TlsPrometheus(PrometheusProcess):
    """A Prometheus serving ``--web.config.file``: the harness's own calls go over https."""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@dataclass
class Stack:
    line: int
    root: Path
    certs: Path
    context: ssl.SSLContext
    client: httpx.Client
    fleet: FleetApp
    master: TlsPrometheus
    children: dict[str, TlsPrometheus]
    alertmanagers: AlertmanagerHA
    api: LocalDingTalk
    controller_url: str
    relay_url: str


def spec_document(*, certs: Path, master_port: int, controller_port: int, relay_port: int,
                  child_ports: dict[str, int], alertmanagers: list[ReplicaSpec], robot_url: str,
                  rules: Path, line: int) -> dict[str, Any]:
    return {
        "cluster": "tls",
        "prometheus": {"version": "3" if line == 3 else "2.53"},
        "regions": [{"name": region, "shards": 1} for region in REGIONS],
        "jobs": [{"name": "gpu", "scrape_interval": "1s"}],
        "remote_write": [{
            "name": "master",
            "url": f"https://127.0.0.1:{master_port}/api/v1/write",
            "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
        }],
        "children": {"target_discovery": "http_sd", "http_sd_url": f"https://127.0.0.1:{controller_port}",
                     "http_sd_refresh_interval": "1s", "scrape_interval": "1s", "evaluation_interval": "1s"},
        "master": {
            "port": master_port, "scrape_interval": "1s", "evaluation_interval": "1s",
            "extra_rule_files": [str(rules)],
            "monitoring": {
                # One child per region, each on its own port: a region's template is its URL.
                "child_url": "https://127.0.0.1:1",
                "child_url_by_region": {f"region-{i}": f"https://127.0.0.1:{port}"
                                        for i, port in enumerate(child_ports.values())},
            },
        },
        "alerting": {
            "relay_url": f"https://127.0.0.1:{relay_port}",
            "relay_listen": f"127.0.0.1:{relay_port}",
            "replicas": [r.model_dump() for r in alertmanagers],
            "robots": [{"name": ROBOT, "url": robot_url, "secret": "${E2E_TLS_SECRET}",
                        "keywords": [KEYWORD]}],
            "receivers": [{"name": "oncall", "robots": [ROBOT]}],
            "default_receiver": "oncall",
            "timing": FAST,
            "severities": dict.fromkeys(("critical", "warning", "info"), FAST),
        },
        "tls": {
            "ca_file": str(certs / "ca.crt"),
            "cert_file": str(certs / "client.crt"),
            "key_file": str(certs / "client.key"),
            "serve": {"cert_file": str(certs / "server.crt"), "key_file": str(certs / "server.key")},
        },
    }


def _python(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})


def _ready(client: httpx.Client, url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{url}: the process exited:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module", params=[2], ids=["prometheus-2"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    line: int = request.param
    prometheus = stack_tool(line, "prometheus")
    root = tmp_path_factory.mktemp(f"tls-{line}")
    for sub in ("data", "logs"):
        (root / sub).mkdir()
    certs = root / "certs"
    make_certs(certs, hosts=["127.0.0.1", "localhost"], client_name="prometheus", days=1, ca_days=1)
    (root / "rules.yml").write_text(RULES, encoding="utf-8")
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    context.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    web_config = root / "out" / WEB_CONFIG_FILE
    procs: list[subprocess.Popen[bytes]] = []
    with httpx.Client(verify=context, timeout=5.0) as client, LocalDingTalk() as api:
        api.add_robot(TOKEN, secret=SECRET, keywords=[KEYWORD])
        robot_url = f"{api.base_url}/robot/send?access_token=${{E2E_TLS_TOKEN}}"

        def prom(name: str) -> TlsPrometheus:
            return TlsPrometheus(prometheus, config=root / "out" / "children" / name / "prometheus.yml",
                                 data=root / "data" / name, log=root / "logs" / f"{name}.log", client=client,
                                 extra_args=(f"--web.config.file={web_config}",))
        children = {f"{region}-0": prom(f"{region}-0") for region in REGIONS}
        master = prom("master")
        master.config = root / "out" / MASTER_FILE
        controller_port, relay_port = free_port(), free_port()
        replicas = loopback_replicas(2)
        spec_path, inventory_path = root / "federation.yaml", root / "inventory.yaml"
        spec_path.write_text(yaml.safe_dump(spec_document(
            certs=certs, master_port=master.port, controller_port=controller_port, relay_port=relay_port,
            child_ports={name: child.port for name, child in children.items()}, alertmanagers=replicas,
            robot_url=robot_url, rules=root / "rules.yml", line=line)), encoding="utf-8")
        # The fleet serves the rendered web-config (same format), so it is built after the render
        # writes it; the inventory that render needs names the fleet's port, bound first.
        fleet_port = free_port()
        nodes = fleet_nodes(NODES, regions=len(REGIONS))
        inventory_path.write_text(yaml.safe_dump({"targets": [
            {"address": "127.0.0.1", "port": fleet_port, "job": "gpu", "node": node.name,
             "region": node.region, "gpus": 2, "metrics_path": f"/nodes/{node.name}/metrics",
             "identity": f"gpu/{node.name}"} for node in nodes]}), encoding="utf-8")
        spec, targets = pipeline.load_inputs(spec_path, inventory_path)
        result = pipeline.render(spec, targets, out=root / "out",
                                 checker=Promtool(stack_tool(line, "promtool")),
                                 alert_checker=Amtool(stack_tool(line, "amtool")))
        assert result.checked == len(REGIONS) and result.master_checked and result.alerting_checked
        assert sorted(children) == sorted(c["child"] for c in result.manifest["children"])
        fleet = FleetApp(ExporterSettings(backend="simulated", gpus=2, listen=f"127.0.0.1:{fleet_port}",
                                          collect_interval=0.5, web_config_file=web_config), nodes)
        fleet.start()
        try:
            controller_log, relay_log = root / "logs" / "controller.log", root / "logs" / "relay.log"
            procs.append(_python(
                "federation.commands.cli", "serve", f"--spec={spec_path}", f"--inventory={inventory_path}",
                f"--data-dir={root / 'data' / 'controller'}", f"--listen=127.0.0.1:{controller_port}",
                "--dev", "--no-check", f"--web.config.file={web_config}", log=controller_log))
            procs.append(_python(
                "alertmanager.dingtalk", f"--config={root / 'out' / RELAY_FILE}",
                f"--listen=127.0.0.1:{relay_port}", f"--web.config.file={web_config}", "--log-level=warning",
                log=relay_log, env={"E2E_TLS_SECRET": SECRET, "E2E_TLS_TOKEN": TOKEN}))
            controller_url, relay_url = f"https://127.0.0.1:{controller_port}", f"https://127.0.0.1:{relay_port}"
            flags = json.loads((root / "out" / FLAGS_FILE).read_text(encoding="utf-8"))["flags"]
            master.extra_args += tuple(f for f in flags if not f.startswith(("--storage.tsdb.path=",
                                                                             "--web.listen-address=")))
            assert spec.alerting is not None
            am_config = (root / "out" / ALERTMANAGER_FILE).read_bytes()
            alertmanagers = AlertmanagerHA(spec.alerting, config=am_config,
                                           binary=stack_tool(line, "prometheus-alertmanager"),
                                           web_config=web_config, client=client)
            with alertmanagers, master:
                wait_for(lambda: _ready(client, f"{controller_url}/healthz", procs[0], controller_log),
                         timeout=30, interval=0.1, what="the controller over TLS")
                wait_for(lambda: _ready(client, f"{relay_url}/readyz", procs[1], relay_log),
                         timeout=30, interval=0.1, what="the relay over TLS")
                master.wait_ready()
                try:
                    for child in children.values():
                        child.start()
                    for child in children.values():
                        child.wait_ready()
                    yield Stack(line=line, root=root, certs=certs, context=context, client=client,
                                fleet=fleet, master=master, children=children, alertmanagers=alertmanagers,
                                api=api, controller_url=controller_url, relay_url=relay_url)
                finally:
                    for child in children.values():
                        child.stop()
        finally:
            for proc in procs:
                stop_process(proc)
            fleet.stop()


def _master_targets(stack: Stack) -> dict[str, list[dict[str, Any]]] | None:
    """job -> active targets at the master, once every meta-monitoring job has all of its up."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for target in stack.master.active_targets():
        by_job.setdefault(target["labels"]["job"], []).append(target)
    if set(by_job) != META_JOBS or len(by_job["gpufed-child"]) != len(REGIONS):
        return None
    return by_job if all(t["health"] == "up" for ts in by_job.values() for t in ts) else None


def test_every_target_is_up_at_the_master_over_tls(stack: Stack) -> None:
    by_job = wait_for(lambda: _master_targets(stack), timeout=CONVERGE_S, interval=0.2,
                      what="every meta-monitoring target up at the master")
    for job, targets in by_job.items():
        for target in targets:
            assert target["scrapeUrl"].startswith("https://"), (job, target["scrapeUrl"])
    # The children's GPU targets, discovered from the controller over TLS and scraped over
    # mutual TLS, reach the master by remote_write over TLS: every node, up.
    def nodes_up() -> set[str] | None:
        series = stack.master.query('up{job="gpu"} == 1')
        nodes = {s["metric"]["node"] for s in series}
        return nodes if nodes == set(stack.fleet.nodes) else None

    wait_for(nodes_up, timeout=CONVERGE_S, interval=0.2, what="every fleet node up at the master")
    for child in stack.children.values():
        targets = child.active_targets()
        assert targets and all(t["health"] == "up" and t["scrapeUrl"].startswith("https://") for t in targets)
        assert all(t["discoveredLabels"].get("__scheme__") == "https" for t in targets)


def test_an_alert_travels_master_to_alertmanager_to_relay_over_tls(stack: Stack) -> None:
    def delivered() -> list[Message] | None:
        messages = stack.api.messages(TOKEN)
        return messages if any("GPUFleetOverTLS" in m.text for m in messages) else None

    wait_for(delivered, timeout=CONVERGE_S, interval=0.2, what="GPUFleetOverTLS through the relay")
    assert stack.api.rejected(TOKEN) == []


def test_every_server_refuses_a_client_without_a_certificate(stack: Stack) -> None:
    anonymous = ssl.create_default_context(cafile=str(stack.certs / "ca.crt"))
    urls = [f"https://127.0.0.1:{stack.fleet.http.port}/nodes", stack.controller_url + "/healthz",
            stack.relay_url + "/readyz", stack.master.url + "/-/ready",
            *(child.url + "/-/ready" for child in stack.children.values()),
            *(url + "/-/ready" for url in stack.alertmanagers.urls)]
    # Clients of their own, closed before the servers stop (a kept-alive connection would outlive
    # the exporter's server).
    with httpx.Client(verify=stack.context, timeout=5.0) as good, \
            httpx.Client(verify=anonymous, timeout=5.0) as bad:
        for url in urls:
            assert good.get(url).status_code == 200, url
            with pytest.raises(httpx.HTTPError):
                bad.get(url).raise_for_status()


def test_compose_health_checks_speak_tls_with_the_rendered_client_file(stack: Stack) -> None:
    """What compose's health checks run (federation.master.compose_tls), against the live servers."""
    client_file = f"--http.config.file={stack.root / 'out' / HTTP_CLIENT_FILE}"
    checks = [
        [stack_tool(stack.line, "promtool"), "check", "ready", f"--url={stack.master.url}", client_file],
        [stack_tool(stack.line, "amtool"), f"--alertmanager.url={stack.alertmanagers.urls[0]}", client_file,
         "config", "show"],
    ]
    for args in checks:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    # ...and without the client file the same check is refused: the certificate is what passes.
    plain = subprocess.run(checks[0][:-1], capture_output=True, text=True, timeout=30, check=False)
    assert plain.returncode != 0
