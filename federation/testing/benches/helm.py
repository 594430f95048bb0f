"""``gpufed bench helm``: the chart rendered with only a token and ``discovery.defaultRegion``,
its workloads run as pods by ``federation.testing.harnesses.helmrun`` against the Kubernetes
API stand-in with N Nodes that carry no region label, read at the master.

The steps are separate functions so the suite's test reads the same run the same way:
``render`` (the Helm v4 SDK, offline), ``targets_up`` (every Node's ``gpu`` and ``node``
target ``up == 1`` at the master, with the default region), ``leader`` (the Lease's holder).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from federation.testing.harnesses.helmrun.run import HelmRun, HelmRunError, wait

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "gpufed"
RELEASE, NAMESPACE = "gpufed", "monitoring"
#: StatefulSet replicas left out (CPU): one master runs; every child runs (each owns a shard).
MAX_REPLICAS = {f"{RELEASE}-master": 1}
#: ``--tls``: the Secret ``tls.existingSecret`` names, made from ``gpufed certs``' files, and the
#: name every client checks in the servers' certificate (the chart's: the exporter Service's).
TLS_SECRET = f"{RELEASE}-tls"
TLS_SERVER_NAME = f"{RELEASE}-exporter.{NAMESPACE}.svc"
TLS_VALUES = {"enabled": True, "existingSecret": TLS_SECRET, "clientCertFile": "client.crt",
              "clientKeyFile": "client.key"}
#: ``--tls`` also runs the Alertmanagers, so the master -> Alertmanager hop runs too. Not the
#: relay: the controller masks a DingTalk robot URL in the dingtalk.yml it serves (the URL is
#: the credential), so the chart's relay cannot start from it; its webhook goes nowhere here.
TLS_ALERTING = {
    "federation": {"alerting": {
        "robots": [{"name": "sre", "url": "https://oapi.dingtalk.com/robot/send?access_token=${DINGTALK_TOKEN}",
                    "secret": "${DINGTALK_SECRET}"}],
        "receivers": [{"name": "sre", "robots": ["sre"]}],
        "default_receiver": "sre",
        "relay_url": "http://relay.invalid:8060",
    }},
    "alertmanager": {"enabled": True, "replicas": 2},
}


def default_region() -> str:
    """The first of the chart's default ``federation.regions`` (a default region must be one)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return str(values["federation"]["regions"][0]["name"])


def render(*, token: str, region: str, tls: bool = False) -> list[dict[str, Any]]:
    """``helm template gpufed helm/gpufed -n monitoring`` with only a token and the default region
    (and, with ``tls``, ``tls.enabled`` with an existing Secret: see ``tls_secret``)."""
    import helm_python as helm

    values: dict[str, Any] = {"controller": {"token": {"value": token}},
                              "discovery": {"defaultRegion": region}}
    if tls:
        values["tls"] = dict(TLS_VALUES)
        values.update(TLS_ALERTING)
    out = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def tls_secret(folder: Path) -> tuple[dict[str, Any], ssl.SSLContext]:
    """``gpufed certs folder --host <exporter Service>`` as the Secret an operator would make
    (``kubectl create secret generic --from-file``: the server pair as tls.crt/tls.key, the
    client pair as client.crt/client.key, ca.crt), and a client context presenting the pair."""
    from webconfig.certs import make_certs

    make_certs(folder, hosts=[TLS_SERVER_NAME], client_name="prometheus", days=2, ca_days=2)
    keys = {"ca.crt": "ca.crt", "tls.crt": "server.crt", "tls.key": "server.key",
            "client.crt": "client.crt", "client.key": "client.key"}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": TLS_SECRET, "namespace": NAMESPACE},
              "stringData": {key: (folder / name).read_text() for key, name in keys.items()}}
    context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    context.load_cert_chain(str(folder / "client.crt"), str(folder / "client.key"))
    return secret, context


def query(
    run: HelmRun, expr: str, master: str = f"{RELEASE}-master-0", *, tls: ssl.SSLContext | None = None
) -> list[dict[str, Any]]:
    status, body = run.http_get(master, 9090, f"/api/v1/query?query={quote(expr)}",
                                tls=None if tls is None else (tls, TLS_SERVER_NAME))
    if status != 200:
        raise HelmRunError(f"{master} answered {status} to {expr}: {body[:200]!r}")
    return list(json.loads(body)["data"]["result"])


def expected_targets(run: HelmRun) -> dict[str, str]:
    """instance -> job: each exporter pod's :9400 (gpu) and each Node's node-exporter :9100 (node)."""
    out = {}
    for pod in run.pods.values():
        if pod.workload == f"DaemonSet/{RELEASE}-exporter":
            out[f"{run.pod_address(pod.name)}:9400"] = "gpu"
        elif pod.workload == f"DaemonSet/{RELEASE}-node-exporter":
            out[f"{run.pod_address(pod.name)}:9100"] = "node"
    return out


def targets_up(run: HelmRun, region: str, *, tls: ssl.SSLContext | None = None) -> dict[str, Any]:
    expected = expected_targets(run)
    series = query(run, 'up{job=~"gpu|node"} == 1', tls=tls)
    up = {(s["metric"].get("instance"), s["metric"].get("job")) for s in series}
    regions = {s["metric"].get("instance"): s["metric"].get("region") for s in series}
    missing = sorted(f"{job} {i}" for i, job in expected.items() if (i, job) not in up)
    wrong_region = sorted(i for i in expected if i in regions and regions[i] != region)
    return {
        "targets_expected": len(expected),
        "targets_up_at_master": len(expected) - len(missing),
        "missing": missing,
        "wrong_region": wrong_region,
    }


def alerting_over_tls(run: HelmRun, client: ssl.SSLContext) -> dict[str, Any]:
    """The master's Alertmanagers (their URLs' scheme), those holding its Watchdog alert and those
    that see every replica in their gossip mesh (``--cluster.tls-config``), read over TLS: the
    master -> Alertmanager hop works when every one has the alert, the gossip when every one
    is meshed."""
    tls = (client, TLS_SERVER_NAME)
    status, body = run.http_get(f"{RELEASE}-master-0", 9090, "/api/v1/alertmanagers", tls=tls)
    active = json.loads(body)["data"]["activeAlertmanagers"] if status == 200 else []
    holding = meshed = 0
    pods = sorted(p for p, pod in run.pods.items() if pod.workload == f"StatefulSet/{RELEASE}-alertmanager")
    for pod in pods:
        status, body = run.http_get(pod, 9093, "/api/v2/alerts", tls=tls)
        holding += status == 200 and any(a["labels"].get("alertname") == "Watchdog" for a in json.loads(body))
        status, body = run.http_get(pod, 9093, "/api/v2/status", tls=tls)
        meshed += status == 200 and len(json.loads(body)["cluster"].get("peers") or []) == len(pods)
    return {"alertmanagers": len(pods), "alertmanagers_https_at_master":
            sum(a["url"].startswith("https://") for a in active), "alertmanagers_with_watchdog": holding,
            "alertmanagers_meshed": meshed}


def leader(run: HelmRun) -> str:
    return run.lease_holder(f"{RELEASE}-controller")


def run_helm_bench(
    *,
    nodes: int,
    timeout: float = 110.0,
    say: Callable[[str], None] = lambda line: None,
    keep: Path | None = None,
    tls: bool = False,
) -> dict[str, Any]:
    where = Path(tempfile.mkdtemp(prefix="gpufed-helm-")) if keep is None else keep
    started = time.monotonic()
    region = default_region()
    try:
        objects = render(token=secrets.token_hex(16), region=region, tls=tls)
        client: ssl.SSLContext | None = None
        if tls:
            secret, client = tls_secret(where / "certs")
            objects.append(secret)
        run = HelmRun(
            objects=objects,
            namespace=NAMESPACE,
            nodes=[f"gpu-node-{i:03d}" for i in range(nodes)],
            workdir=where / "run",
            max_replicas=MAX_REPLICAS,
            say=say,
        )
        with run:
            summary = run.summary()
            up_s = round(time.monotonic() - started, 1)
            holder = wait(
                lambda: leader(run), timeout=timeout, what="a controller holds the Lease", interval=1.0
            )
            leader_s = round(time.monotonic() - started, 1)
            targets = wait(
                lambda: (lambda t: t if not t["missing"] and not t["wrong_region"] else None)(
                    targets_up(run, region, tls=client)
                ),
                timeout=timeout,
                what="every Node's targets up at the master",
            )
            alerting: dict[str, Any] = {}
            if client is not None:
                alerting = wait(
                    lambda: (lambda a: a if a["alertmanagers_with_watchdog"] == a["alertmanagers"] else None)(
                        alerting_over_tls(run, client)
                    ),
                    timeout=timeout,
                    what="the master's Watchdog at every Alertmanager over TLS",
                )
            result = {
                **{k: v for k, v in targets.items() if k not in ("missing", "wrong_region")},
                **alerting,
                "alerts_delivered": 0,  # no relay runs (a token-only install; with --tls, see TLS_ALERTING)
                "default_region": region,
                "tls": tls,
                "leader": holder,
                "nodes": nodes,
                "pods": len(run.pods),
                "services_real": summary["services_real"],
                "services_standin": summary["services_standin"],
                "services_left_out": summary["services_left_out"],
                "notes": summary["notes"],
                "overrides": summary["overrides"],
                "versions": summary["versions"],
                "failures": run.failures(),
                "up_s": up_s,
                "leader_s": leader_s,
                "targets_up_s": round(time.monotonic() - started, 1),
            }
        result["down_s"] = round(time.monotonic() - started - result["targets_up_s"], 1)
        result["leftover_namespaces"] = run.network.existing()
        result["total_s"] = round(time.monotonic() - started, 1)
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
        return result
    finally:
        if keep is None:
            shutil.rmtree(where, ignore_errors=True)
