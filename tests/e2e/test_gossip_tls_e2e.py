"""The Alertmanagers' gossip over mutual TLS, as the spec's ``tls`` section renders it.

Two real replicas (Alertmanager 0.33.1 and 0.28.1) run ``tls/cluster-tls.yml`` as
``TlsSpec.cluster_tls_config`` writes it for the pipeline (``--cluster.tls-config``), with
certificates from ``gpufed certs``: they form a mesh of two. A third replica that gossips in
the clear, or presents a certificate from another CA, names them as peers and never joins.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import stack_tool, stop_process

from alertmanager.models import AlertingSpec, ReceiverSpec, ReplicaSpec, WebhookSpec
from federation.localrun.loopback import free_port
from federation.localrun.waiting import wait_until
from federation.testing.harnesses.alertmanager import FAST_GOSSIP, AlertmanagerHA, loopback_replicas
from sharder.kernel.output import dump_yaml
from sharder.kernel.tls import TlsSpec
from webconfig.certs import make_certs

pytestmark = pytest.mark.e2e


def _cluster_file(folder: Path, certs: Path) -> Path:
    tls = TlsSpec.model_validate({
        "ca_file": str(certs / "ca.crt"), "cert_file": str(certs / "client.crt"),
        "key_file": str(certs / "client.key"),
        "serve": {"cert_file": str(certs / "server.crt"), "key_file": str(certs / "server.key")},
    })
    document = tls.cluster_tls_config()
    assert document is not None
    path = folder / "cluster-tls.yml"
    path.write_bytes(dump_yaml(document))
    return path


def _peers(url: str) -> int:
    return len(httpx.get(f"{url}/api/v2/status", timeout=2).json()["cluster"].get("peers") or [])


@pytest.mark.parametrize("line", [3, 2])
def test_replicas_gossip_over_mutual_tls_and_a_replica_without_the_ca_never_joins(
        line: int, tmp_path: Path) -> None:
    certs, stranger = tmp_path / "certs", tmp_path / "stranger"
    make_certs(certs, hosts=["localhost", "127.0.0.1"], client_name="gpufed-client", days=2, ca_days=2)
    make_certs(stranger, hosts=["localhost", "127.0.0.1"], client_name="gpufed-client", days=2, ca_days=2)
    cluster = _cluster_file(certs, certs)
    binary = stack_tool(line, "prometheus-alertmanager")
    alerting = AlertingSpec(replicas=loopback_replicas(2), receivers=[ReceiverSpec(
        name="sink", webhooks=[WebhookSpec(url="http://127.0.0.1:9/none")])],
                            default_receiver="sink")
    with AlertmanagerHA(alerting, binary=binary, cluster_tls_config=cluster) as mesh:
        assert [_peers(url) for url in mesh.urls] == [2, 2]  # joined over TLS
        peer = alerting.replicas[0].cluster_address
        outsiders = {"plain": [], "other CA": [f"--cluster.tls-config={_cluster_file(stranger, stranger)}"]}
        procs: list[tuple[str, str, subprocess.Popen[bytes]]] = []
        try:
            for kind, extra in outsiders.items():
                outsider = ReplicaSpec(name="x", host="127.0.0.1", port=free_port(), cluster_port=free_port())
                argv = [binary, f"--config.file={mesh.config_path}", f"--storage.path={tmp_path / kind}",
                        f"--web.listen-address={outsider.address}",
                        f"--cluster.listen-address={outsider.cluster_address}",
                        f"--cluster.advertise-address={outsider.cluster_address}",
                        f"--cluster.peer={peer}", *FAST_GOSSIP, *extra]
                with (tmp_path / f"{kind}.log").open("wb") as log:
                    procs.append((kind, f"http://{outsider.address}",
                                  subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)))
            for kind, url, _ in procs:  # up and asking to join, several push-pull rounds long
                wait_until(lambda url=url: httpx.get(f"{url}/-/ready", timeout=1).status_code == 200,
                           timeout=20, what=f"the {kind} outsider to start", retry_on=(httpx.HTTPError,))
            wait_until(lambda: all("failed to join" in (tmp_path / f"{kind}.log").read_text()
                                   or _peers(url) > 1 for kind, url, _ in procs),
                       timeout=20, what="each outsider to try the mesh", retry_on=(httpx.HTTPError,))
            assert {kind: _peers(url) for kind, url, _ in procs} == {"plain": 1, "other CA": 1}
            assert [_peers(url) for url in mesh.urls] == [2, 2]
        finally:
            for _, _, proc in procs:
                stop_process(proc)
