"""The rendered compose files with the spec's ``tls`` section, run for real (docs/tls-install.md).

``monitoring.yml`` rendered from compose/federation.yaml with every hop on TLS and
client certificates required, and three copies of ``compose/node.yml`` with its overlay
``compose/node-tls.yml``, run as processes by ``federation.testing.harnesses.composerun`` (see
test_compose_run.py). The certificate folder is ``gpufed certs``' (one server certificate
for every service, checked by the spec's ``server_name``); each node's folder also holds
the rendered ``tls/web-config.yml`` and ``tls/http-client.yml``, as node-tls.yml says.
One run: the exporters register with the controller over mTLS, every node's ``gpu`` target
is scraped over https and up at both masters (written there over mTLS), every health
check Compose would run passes, the three Alertmanagers gossip over mTLS, and the master
answers a caller without a certificate with nothing.

Needs root (``ip netns``, ``unshare``), as CI runs; skipped otherwise.
"""

from __future__ import annotations

import json
import shutil
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from deploy_tools import runner_marks
from test_compose_tls import tls_spec

from federation.testing.benches import compose as bench
from federation.testing.harnesses.composerun.run import ComposeRun
from webconfig.certs import make_certs

NODES = 3
STEP_TIMEOUT_S = 240.0
SERVER_NAME = "gpufed.internal"

pytestmark = runner_marks("compose")


@dataclass
class Stack:
    run: ComposeRun
    client: bench.Client


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    where = tmp_path_factory.mktemp("compose-run-tls")
    spec = tls_spec(where / "federation.yaml")
    document: dict[str, Any] = yaml.safe_load(spec.read_text())
    document["tls"]["server_name"] = SERVER_NAME
    document["tls"]["hops"]["scrape"] = ["gpu"]  # node.yml's node-exporter serves plain HTTP
    spec.write_text(yaml.safe_dump(document), encoding="utf-8")
    # No promtool here: the spec's paths are the containers' (/etc/gpufed/tls).
    out = bench.render(spec, where / "render", check=False)
    certs = where / "certs"
    make_certs(certs, hosts=[SERVER_NAME, "localhost", "127.0.0.1"], client_name="prometheus", days=1,
               ca_days=1)
    for name in ("web-config.yml", "http-client.yml"):  # what node-tls.yml reads beside the certificates
        shutil.copy(out / "tls" / name, certs / name)
    env, nodes = bench.env_files(out, spec, nodes=NODES, where=where)
    env.write_text(env.read_text() + f"GPUFED_TLS_DIR={certs}\n")
    for values in nodes:
        values.update({"GPUFED_CONTROLLER_URL": "https://gpufed-controller:8080",
                       "GPUFED_TLS_DIR": str(certs)})
    run = ComposeRun(
        monitoring=out / "compose" / "monitoring.yml",
        monitoring_env=env,
        node_file=(ROOT / "compose" / "node.yml", ROOT / "compose" / "node-tls.yml"),
        node_env_example=ROOT / "compose" / "node.env.example",
        nodes=nodes,
        workdir=where / "run",
        xid_codes=bench.critical_xid_codes(out),
    )
    client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    client.load_cert_chain(certs / "client.crt", certs / "client.key")
    with run:
        yield Stack(run, (client, SERVER_NAME))


def test_every_target_is_up_at_both_masters_and_the_gpu_job_is_scraped_over_https(stack: Stack) -> None:
    def up(master: str) -> dict[str, Any] | None:
        got = bench.targets_up(stack.run, master, tls=stack.client)
        return got if not got["missing"] else None

    got = bench.wait(lambda: up("master-prometheus-0"), timeout=STEP_TIMEOUT_S, what="every target up")
    assert got["targets_up_at_master"] == 2 * NODES
    assert up("master-prometheus-1") is not None  # the second master gets every child's writes
    context, name = stack.client
    schemes: dict[str, set[str]] = {}
    for child in (p.display for p in stack.run.planned.values() if p.display.startswith("child-")):
        status, body = stack.run.http_get(child, 9090, "/api/v1/targets?state=active", tls=context,
                                          hostname=name)
        assert status == 200, child
        for target in json.loads(body)["data"]["activeTargets"]:
            schemes.setdefault(target["labels"]["job"], set()).add(target["scrapeUrl"].split(":", 1)[0])
    # the scrape hop names the gpu job only: node.yml's node-exporter serves plain HTTP; each
    # child scrapes itself for its heartbeat where the master finds it, over mTLS
    assert schemes == {"gpu": {"https"}, "node": {"http"}, "gpufed-heartbeat": {"https"}}, schemes


def test_every_healthcheck_passes_speaking_tls(stack: Stack) -> None:
    health = bench.wait(
        lambda: (lambda h: h if set(h.values()) == {"healthy"} else None)(stack.run.health()),
        timeout=STEP_TIMEOUT_S,
        what="every healthcheck healthy",
    )
    assert set(health) == {p.display for p in stack.run.planned.values() if p.process and p.healthcheck}


def test_the_alertmanagers_gossip_over_mtls(stack: Stack) -> None:
    context, name = stack.client
    replicas = sorted(p.display for p in stack.run.planned.values() if p.display.startswith("alertmanager-"))

    def meshed() -> list[int] | None:
        peers = []
        for replica in replicas:
            status, body = stack.run.http_get(replica, 9093, "/api/v2/status", tls=context, hostname=name)
            peers.append(len(json.loads(body)["cluster"].get("peers") or []) if status == 200 else 0)
        return peers if all(count == len(replicas) for count in peers) else None

    assert bench.wait(meshed, timeout=STEP_TIMEOUT_S, what="the Alertmanagers in one mesh") == [3, 3, 3]
    for replica in replicas:  # each runs the rendered gossip file (so a plain peer could not join)
        argv = stack.run.planned[replica].argv
        assert any(a.startswith("--cluster.tls-config=") and a.endswith("/tls/cluster-tls.yml") for a in argv)


def test_a_caller_without_a_client_certificate_gets_nothing(stack: Stack, tmp_path: Path) -> None:
    assert stack.run.http_get("master-prometheus-0", 9090, "/-/ready")[0] == 400  # plain HTTP: Go answers 400
    trusting = ssl.create_default_context()
    for der in stack.client[0].get_ca_certs(binary_form=True):
        trusting.load_verify_locations(cadata=ssl.DER_cert_to_PEM_cert(der))
    with pytest.raises((ssl.SSLError, ConnectionError)):  # trusts the server, presents no certificate
        stack.run.http_get("master-prometheus-0", 9090, "/-/ready", tls=trusting, hostname=SERVER_NAME)
