"""``gpufed demo --tls``: the whole demo with TLS on every hop and client certificates required.

One stack for the module (6 nodes, 2 regions, Prometheus line 3 first on PATH). The demo makes
its CA with ``gpufed certs``' code, puts the spec's ``tls`` section in, and runs:

    fleet (gpufed-exporter fleet --web.config.file, --register-http-config-file)
        -> registers with the controller (gpufed serve --web.config.file) over mutual TLS
    children (--web.config.file) <- HTTP SD over TLS; scrape the fleet over mutual TLS;
        remote_write to the master over TLS
    controller -> children (--http.config.file: hand-over checks and reloads, mutual TLS)
    master (--web.config.file) -> Alertmanagers (--web.config.file) -> relay (--web.config.file)
        -> the DingTalk stand-in (plain HTTP: it stands in for DingTalk's https API)
    master -> children's meta-monitoring through the demo's router (https both ways)

The tests read every fleet target up at the master, an alert delivered through the relay, the
controller reaching its children with its client certificate, and refusals: a plain-HTTP
scrape of the exporter and callers without a client certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import require_tool, wait_for

from federation.demo.plan import Layout
from federation.demo.stack import DemoOptions, DemoStack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LAYOUT = Layout(nodes=6, gpus=2, regions=2, nodes_per_child=3)
CONVERGE_S = 60.0
META_JOBS = {"alertmanager", "gpufed-child", "gpufed-controller", "gpufed-dingtalk", "gpufed-master"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    lines: list[str] = []
    demo = DemoStack(DemoOptions(layout=LAYOUT, data_dir=tmp_path_factory.mktemp("demo-tls") / "demo",
                                 tls=True, first_samples_timeout=CONVERGE_S),
                     say=lines.append, show_messages=False)
    try:
        demo.start()
        yield demo
    finally:
        summary = demo.finish(duration=None)
        assert summary["leftover_processes"] == 0, summary
        assert summary["exited"] == [], summary["exited"]
        assert summary["tls"] is True and summary["urls"]["master"].startswith("https://")


def test_every_fleet_target_and_every_server_is_up_at_the_master_over_https(stack: DemoStack) -> None:
    assert stack.master_url.startswith("https://") and stack.controller_url.startswith("https://")
    expected = {node["node"] for node in stack.http.get(stack.controller_url + "/v1/registry/targets")
                .json()["targets"]}
    assert len(expected) == LAYOUT.nodes

    def nodes_up() -> set[str] | None:
        answer = stack.http.get(stack.master_url + "/api/v1/query", params={"query": 'up{job="gpu"} == 1'})
        nodes = {s["metric"]["node"] for s in answer.json()["data"]["result"]}
        return nodes if nodes == expected else None

    wait_for(nodes_up, timeout=CONVERGE_S, interval=0.5, what="every fleet node up at the master")

    # Each child's heartbeat: it scraped itself through the demo's router over mTLS (1, not 0).
    children = len(stack.running_children())

    def beats() -> dict[str, str] | None:
        answer = stack.http.get(stack.master_url + "/api/v1/query",
                                params={"query": "gpufed_child_heartbeat"})
        found = {s["metric"]["shard"] + "/" + s["metric"]["replica"]: s["value"][1]
                 for s in answer.json()["data"]["result"]}
        return found if len(found) == children and set(found.values()) == {"1"} else None

    wait_for(beats, timeout=CONVERGE_S, interval=0.5, what="every child's heartbeat at 1")

    def meta_up() -> list[dict[str, Any]] | None:
        active = stack.http.get(stack.master_url + "/api/v1/targets").json()["data"]["activeTargets"]
        jobs = {t["labels"]["job"] for t in active}
        return active if jobs == META_JOBS and all(t["health"] == "up" for t in active) else None

    for target in wait_for(meta_up, timeout=CONVERGE_S, interval=0.5, what="every server up at the master"):
        assert target["scrapeUrl"].startswith("https://"), target["scrapeUrl"]
    # The children scraped the fleet over https: the job's scheme came from the spec's tls section.
    for child in stack.running_children():
        targets = stack.http.get(stack.url(stack.child_port(child), "/api/v1/targets")).json()
        gpu = [t for t in targets["data"]["activeTargets"] if t["labels"]["job"] == "gpu"]
        assert gpu and all(t["scrapeUrl"].startswith("https://") and t["health"] == "up" for t in gpu)


def test_an_alert_reaches_the_dingtalk_stand_in_through_the_relay_over_tls(stack: DemoStack) -> None:
    assert stack.sink is not None

    def delivered() -> int | None:
        inbox = stack.sink.snapshot() if stack.sink is not None else None
        return len(inbox.messages) if inbox and inbox.messages else None

    wait_for(delivered, timeout=CONVERGE_S, interval=0.5, what="a DingTalk message through the relay")
    assert stack.sink.snapshot().rejected == []


def test_the_alertmanagers_gossip_with_each_other_over_mutual_tls(stack: DemoStack) -> None:
    assert stack.tls is not None
    flag = f"--cluster.tls-config={stack.tls.cluster_config}"
    assert stack.tls.cluster_config.is_file()

    def meshed() -> list[int] | None:
        peers = [len(stack.http.get(stack.url(web, "/api/v2/status")).json()["cluster"].get("peers") or [])
                 for web, _ in stack.ports.alertmanagers]
        return peers if all(count == len(stack.ports.alertmanagers) for count in peers) else None

    wait_for(meshed, timeout=CONVERGE_S, interval=0.5, what="both Alertmanagers in one gossip mesh")
    names = [name for name in stack.supervisor.names() if name.startswith("alertmanager-")]
    commands = [Path(f"/proc/{stack.supervisor.get(name).pid}/cmdline").read_bytes().split(b"\0")
                for name in names]
    assert commands and all(flag.encode() in argv for argv in commands), commands


def test_the_controller_reaches_its_children_with_its_client_certificate(stack: DemoStack) -> None:
    def reachable() -> list[dict[str, Any]] | None:
        rows = stack.http.get(stack.controller_url + "/v1/shards").json()["shards"]
        children = [c for row in rows for c in row["children"]]
        return children if children and all(c.get("reachable") for c in children) else None

    wait_for(reachable, timeout=CONVERGE_S, interval=0.5, what="the controller reaching every child")


def test_a_plain_http_scrape_and_a_caller_without_a_certificate_are_refused(stack: DemoStack) -> None:
    node = stack.http.get(stack.url(stack.ports.fleet, "/nodes")).text.split()[0]
    plain = f"http://127.0.0.1:{stack.ports.fleet}/nodes/{node}/metrics"
    with httpx.Client(timeout=5.0) as client:
        try:
            answer = client.get(plain)
        except httpx.HTTPError:
            pass
        else:
            assert answer.status_code >= 400 and "DCGM_FI" not in answer.text, answer.status_code
    log = Path(stack.data / "logs" / "fleet.log")
    wait_for(lambda: "reason=plain_http" in log.read_text(errors="replace"), timeout=10, interval=0.2,
             what="the exporter's refusal of plain HTTP in its log")

    assert stack.tls is not None
    anonymous = ssl.create_default_context(cafile=str(stack.tls.certs / "ca.crt"))
    urls = [stack.url(stack.ports.fleet, f"/nodes/{node}/metrics"), stack.controller_url + "/healthz",
            stack.url(stack.ports.relay, "/readyz"), stack.master_url + "/-/ready",
            *(stack.url(web, "/-/ready") for web, _ in stack.ports.alertmanagers),
            *(stack.url(stack.child_port(child), "/-/ready") for child in stack.running_children()),
            stack.url(stack.ports.router, f"/{stack.running_children()[0]}/-/ready")]
    with httpx.Client(verify=anonymous, timeout=5.0) as bad:
        for url in urls:
            assert stack.http.get(url).status_code == 200, url
            with pytest.raises(httpx.HTTPError):
                bad.get(url).raise_for_status()
