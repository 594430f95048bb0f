"""The chart's workloads run, not only rendered (issue #39 item 7).

``helm template`` with only a token and ``discovery.defaultRegion`` (the Helm v4 SDK), then
``federation.testing.harnesses.helmrun`` starts the rendered controller pair, the child
StatefulSet's pods, one master and the exporter and node-exporter DaemonSets' pods on two
Nodes as processes, with their rendered args, env and mounted ConfigMaps/Secrets, against
the Kubernetes API stand-in serving Nodes that carry **no** region label. One controller
holds the Lease, every target is discovered under the default region, a child scrapes it,
and the master has it up; afterwards no namespace and no process of the run is left.

Needs root (``ip netns``, ``unshare``), as CI runs; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
from deploy_tools import runner_marks

from federation.testing.benches import helm as bench
from federation.testing.harnesses.helmrun.run import HelmRun, HelmRunError, wait

NODES = 2
STEP_TIMEOUT_S = 100.0

pytestmark = runner_marks("Helm", ("ip", "unshare", "nsenter", "openssl", "wget", "sh", "cmp"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_rendered_workloads_discover_unlabelled_nodes_and_the_master_has_every_target_up(
    tmp_path: Path,
) -> None:
    region = bench.default_region()
    objects = bench.render(token=secrets.token_hex(16), region=region)
    controller = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")
    )
    assert f"--k8s-default-region={region}" in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    said: list[str] = []
    run = HelmRun(
        objects=objects,
        namespace=bench.NAMESPACE,
        nodes=[f"gpu-node-{i:03d}" for i in range(NODES)],
        workdir=tmp_path / "run",
        max_replicas=bench.MAX_REPLICAS,
        say=said.append,
    )
    with run:
        # what ran, and every change to the rendered chart, was printed before anything started
        assert any(line.startswith("  overrides") for line in said)
        summary = run.summary()
        for pod in (
            "gpufed-controller-0",
            "gpufed-controller-1",
            "gpufed-master-0",
            "gpufed-child-cn-beijing-0",
        ):
            assert any(s.startswith(pod + "/") for s in summary["services_real"]), pod
        assert {p.workload for p in run.pods.values()} >= {
            "DaemonSet/gpufed-exporter",
            "DaemonSet/gpufed-node-exporter",
        }
        assert run.kube is not None
        nodes = [o for (plural, _, _), o in run.kube.objects.items() if plural == "nodes"]
        assert len(nodes) == NODES
        assert not [n for n in nodes if "topology.kubernetes.io/region" in n["metadata"]["labels"]]

        # the controller pair elects on the stand-in's Lease; the identity is the downward API's pod name
        try:
            holder = wait(lambda: bench.leader(run), timeout=STEP_TIMEOUT_S, what="the Lease held")
        except HelmRunError as exc:
            tails = run.log_tails("gpufed-controller")
            raise AssertionError(f"{exc}\nfailures: {run.failures()}\n{tails}") from exc
        assert holder in {"gpufed-controller-0", "gpufed-controller-1"}

        # discovery went through the stand-in: the exporters' EndpointSlices and the Nodes
        asked = list(run.kube.requests)
        assert [r for r in asked if r.startswith("/api/v1/nodes")]
        slices = "/apis/discovery.k8s.io/v1/namespaces/monitoring/endpointslices"
        assert [r for r in asked if r.startswith(slices) and "service-name%3Dgpufed-exporter" in r], asked[
            :20
        ]

        expected = bench.expected_targets(run)
        assert len(expected) == 2 * NODES

        def all_up() -> dict[str, object] | None:
            got = bench.targets_up(run, region)
            return got if not got["missing"] and not got["wrong_region"] else None

        try:
            targets = wait(all_up, timeout=STEP_TIMEOUT_S, what="every target up at the master")
        except Exception:
            logs = sorted((tmp_path / "run" / "logs").glob("*.log"))
            tails = {p.name: p.read_text()[-1500:] for p in logs}
            pytest.fail(f"targets not up; failures {run.failures()}; logs {json.dumps(tails)[:20000]}")
        assert targets["targets_up_at_master"] == targets["targets_expected"] == 2 * NODES

        # the children scrape them (each target on exactly one child: replication factor 1)
        scraped: list[str] = []
        for pod in (p for p in run.pods if p.startswith("gpufed-child-")):
            status, body = run.http_get(pod, 9090, "/api/v1/targets?state=active")
            assert status == 200
            scraped += [
                t["labels"]["instance"]
                for t in json.loads(body)["data"]["activeTargets"]
                if t["health"] == "up" and t["labels"].get("region") == region
            ]
        assert sorted(scraped) == sorted(expected)
        pids = [pid for p in run.planned.values() if p.process is not None for pid in p.process.state.pids]
        assert not run.failures()
    assert run.network.existing() == []
    assert not [pid for pid in pids if _alive(pid)]
    assert not (tmp_path / "run" / "root").exists()


def test_with_tls_every_hop_speaks_mtls_and_the_master_has_every_target_up(tmp_path: Path) -> None:
    """``tls.enabled`` with an existing Secret from ``gpufed certs``: the controller serves HTTP SD
    and calls the children and the master over TLS, the children scrape the exporters and write
    to the master with the client certificate, the master sends alerts to the Alertmanagers over
    TLS, the config sync fetches and reloads over TLS."""
    region = bench.default_region()
    objects = bench.render(token=secrets.token_hex(16), region=region, tls=True)
    secret, client = bench.tls_secret(tmp_path / "certs")
    run = HelmRun(
        objects=[*objects, secret],
        namespace=bench.NAMESPACE,
        nodes=[f"gpu-node-{i:03d}" for i in range(NODES)],
        workdir=tmp_path / "run",
        max_replicas=bench.MAX_REPLICAS,
        say=lambda line: None,
    )
    tls = (client, bench.TLS_SERVER_NAME)
    with run:
        try:
            targets = wait(
                lambda: (lambda t: t if not t["missing"] and not t["wrong_region"] else None)(
                    bench.targets_up(run, region, tls=client)
                ),
                timeout=2 * STEP_TIMEOUT_S,
                what="every target up at the master over TLS",
            )
        except HelmRunError:
            logs = sorted((tmp_path / "run" / "logs").glob("*.log"))
            tails = {p.name: p.read_text()[-1500:] for p in logs}
            pytest.fail(f"targets not up; failures {run.failures()}; logs {json.dumps(tails)[:20000]}")
        assert targets["targets_up_at_master"] == targets["targets_expected"] == 2 * NODES
        # the master and the children serve TLS only: a plain request is answered 400 by Go's server
        assert run.http_get("gpufed-master-0", 9090, "/-/ready")[0] == 400
        schemes = {}
        for pod in (p for p in run.pods if p.startswith("gpufed-child-")):
            assert run.http_get(pod, 9090, "/-/ready")[0] == 400
            status, body = run.http_get(pod, 9090, "/api/v1/targets?state=active", tls=tls)
            assert status == 200
            for t in json.loads(body)["data"]["activeTargets"]:
                assert t["health"] == "up", t
                schemes[t["labels"]["job"]] = t["scrapeUrl"].split(":", 1)[0]
        # node-exporter serves the web config too; each child scrapes itself for its heartbeat
        assert schemes == {"gpu": "https", "node": "https", "gpufed-heartbeat": "https"}
        # the master sends to both Alertmanagers over mTLS (their config synced over TLS too)
        alerting = wait(
            lambda: (lambda a: a if a["alertmanagers_with_watchdog"] == a["alertmanagers_meshed"]
                     == a["alertmanagers"] else None)(
                bench.alerting_over_tls(run, client)
            ),
            timeout=STEP_TIMEOUT_S,
            what="the Watchdog at every Alertmanager",
        )
        assert alerting == {  # and gossip with each other over mTLS (cluster-tls.yml)
            "alertmanagers": 2, "alertmanagers_https_at_master": 2, "alertmanagers_with_watchdog": 2,
            "alertmanagers_meshed": 2}
        assert not run.failures()
    assert run.network.existing() == []
