"""helm/gpufed's ``tls`` block: a cert-manager Certificate or an existing Secret, mounted where
the exporters serve and the children and the controller read it; rendered offline.

The exporters serve the chart's web config (parsed here by the same strict model as
``gpufed-exporter --web.config.file``); the controller's federation.yaml gets a ``tls``
section whose ``gpu`` job renders https with the client certificate. Strict Kubernetes
validation of every object is test_helm.py's, over ci/tls-values.yaml.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from conftest import ROOT
from test_helm import CHART, FakeController, find, render, values

from federation.localrun.loopback import LoopbackHTTPServer
from federation.spec import GpufedSpec
from sharder.children.render import scrape_config
from sharder.model.loading import parse_model
from webconfig import client as webconfig_client
from webconfig import model as webconfig_model
from webconfig.testing import Pki

TLS_VALUES = CHART / "ci" / "tls-values.yaml"
SERVER_NAME = "gpufed-exporter.monitoring.svc"


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def secret_volume(workload: dict[str, Any]) -> dict[str, Any] | None:
    volumes = workload["spec"]["template"]["spec"].get("volumes", [])
    return next((v for v in volumes if v["name"] == "tls"), None)


def test_cert_manager_certificate_is_mounted_where_tls_is_served_and_used(chart: helm.Chart) -> None:
    objects = render(chart, values(TLS_VALUES))
    certificate = find(objects, "Certificate", "-tls")
    assert certificate["apiVersion"] == "cert-manager.io/v1"
    spec = certificate["spec"]
    assert spec["secretName"] == "gpufed-tls" and spec["dnsNames"] == [SERVER_NAME]
    assert {"server auth", "client auth"} <= set(spec["usages"])
    assert spec["issuerRef"] == {"name": "gpufed-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}

    exporter = find(objects, "DaemonSet", "-exporter")
    serving = container(exporter, "exporter")
    env = {e["name"]: e.get("value") for e in serving["env"]}
    assert env["GPUFED_EXPORTER_WEB_CONFIG_FILE"] == "/etc/gpufed/web/web-config.yml"
    mounts = {m["name"]: m["mountPath"] for m in serving["volumeMounts"]}
    assert mounts == {"web-config": "/etc/gpufed/web", "tls": "/etc/gpufed/tls"}
    assert "tcpSocket" in serving["readinessProbe"] and "tcpSocket" in serving["livenessProbe"]
    for workload in (exporter, find(objects, "StatefulSet", "-child-cn-beijing"),
                     find(objects, "Deployment", "-controller")):
        assert secret_volume(workload) == {"name": "tls", "secret": {"secretName": "gpufed-tls"}}

    document = find(objects, "ConfigMap", "-web-config")["data"]["web-config.yml"]
    parsed = webconfig_model.parse(document, source="web-config.yml")
    assert parsed.tls_server_config is not None
    assert yaml.safe_load(document)["tls_server_config"] == {
        "cert_file": "/etc/gpufed/tls/tls.crt", "key_file": "/etc/gpufed/tls/tls.key",
        "client_ca_file": "/etc/gpufed/tls/ca.crt", "client_auth_type": "RequireAndVerifyClientCert"}


def test_the_controllers_spec_scrapes_the_exporters_over_tls(chart: helm.Chart) -> None:
    objects = render(chart, values(TLS_VALUES))
    text = find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"]
    spec = parse_model(GpufedSpec, yaml.safe_load(text), source="federation.yaml")
    assert spec.tls is not None and spec.tls.server_name == SERVER_NAME
    gpu = next(job for job in spec.jobs if job.name == "gpu")
    config = scrape_config(spec, gpu, shard="cn-beijing-0")
    assert config["scheme"] == "https"
    assert config["tls_config"] == {
        "ca_file": "/etc/gpufed/tls/ca.crt", "cert_file": "/etc/gpufed/tls/tls.crt",
        "key_file": "/etc/gpufed/tls/tls.key", "server_name": SERVER_NAME}


def test_an_existing_secret_replaces_the_certificate(chart: helm.Chart) -> None:
    base = values(TLS_VALUES)
    base["tls"] = {"enabled": True, "existingSecret": "fleet-tls"}
    objects = render(chart, base)
    assert not [o for o in objects if o["kind"] == "Certificate"]
    assert secret_volume(find(objects, "DaemonSet", "-exporter")) == {
        "name": "tls", "secret": {"secretName": "fleet-tls"}}


@pytest.mark.parametrize(
    ("tls", "message"),
    [({"enabled": True}, "tls.enabled needs tls.existingSecret"),
     ({"enabled": True, "certManager": {"enabled": True}}, "tls.certManager.issuerRef.name")],
)
def test_incomplete_tls_values_fail_with_the_value_named(
    chart: helm.Chart, tls: dict[str, Any], message: str
) -> None:
    base = values(TLS_VALUES)
    base["tls"] = tls
    with pytest.raises(helm.HelmError, match=message.replace(".", r"\.")):
        render(chart, base)


def test_tls_off_mounts_nothing(chart: helm.Chart) -> None:
    objects = render(chart, values(CHART / "ci" / "minimal-values.yaml"))
    names = [o["metadata"]["name"] for o in objects if o["kind"] in ("Certificate", "ConfigMap")]
    assert not [name for name in names if name.endswith(("-tls", "-web-config"))]
    workloads = [o for o in objects if o["kind"] in ("DaemonSet", "StatefulSet", "Deployment")]
    assert workloads and all(secret_volume(o) is None for o in workloads)



ALL_VALUES = CHART / "ci" / "tls-all-values.yaml"


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("DaemonSet", "StatefulSet", "Deployment")]


def test_every_hop_the_release_serves_is_on_and_every_server_serves_the_web_config(chart: helm.Chart) -> None:
    objects = render(chart, values(ALL_VALUES))
    text = find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"]
    spec = parse_model(GpufedSpec, yaml.safe_load(text), source="federation.yaml")
    assert spec.tls is not None and spec.tls.serve is not None
    hops = spec.tls.hops
    assert (hops.scrape, hops.http_sd, hops.remote_write, hops.alertmanager, hops.relay, hops.gossip) == (
        ["gpu", "node"], True, True, True, True, True)
    assert spec.tls.web_config() == {"tls_server_config": {
        "cert_file": "/etc/gpufed/tls/tls.crt", "key_file": "/etc/gpufed/tls/tls.key",
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "/etc/gpufed/tls/ca.crt"}}
    web = "/etc/gpufed/web/web-config.yml"
    serving = {
        "controller": container(find(objects, "Deployment", "-controller"), "controller"),
        "child": container(find(objects, "StatefulSet", "-child-cn-beijing"), "prometheus"),
        "master": container(find(objects, "StatefulSet", "-master"), "prometheus"),
        "alertmanager": container(find(objects, "StatefulSet", "-alertmanager"), "alertmanager"),
        "relay": container(find(objects, "StatefulSet", "-dingtalk"), "relay"),
        "node-exporter": container(find(objects, "DaemonSet", "-node-exporter"), "node-exporter"),
    }
    for name, c in serving.items():
        args = c["args"]
        assert f"--web.config.file={web}" in args or args[args.index("--web.config.file") + 1] == web, name
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["tls"] == "/etc/gpufed/tls" and mounts["web-config"] == "/etc/gpufed/web", name
    controller = serving["controller"]["args"]
    assert "--http.config.file=/etc/gpufed/web/http-client.yml" in controller
    calls = [a.split("=", 2)[-1] for a in controller if a.startswith(("--child-url=", "--load-url="))]
    assert calls and all(url.startswith("https://") for url in calls), calls

    # the kubelet presents no client certificate: no TLS server is probed with httpGet
    for workload in workloads(objects):
        for c in workload["spec"]["template"]["spec"]["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                assert "httpGet" not in c.get(probe, {}), (workload["metadata"]["name"], c["name"], probe)
    # the config sync runs gpufed's image with the client file, reloading over https
    syncs = [c for w in workloads(objects) for key in ("initContainers", "containers")
             for c in w["spec"]["template"]["spec"].get(key, [])
             if c["name"] in ("config-init", "config-sync")]
    assert len(syncs) == 7  # child, master, alertmanager: init + sidecar; relay: init
    for c in syncs:
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert c["command"] == ["python3", "/scripts/config-sync.py"] and "gpufed/gpufed" in c["image"]
        assert env["GPUFED_URL"].startswith("https://")
        assert env["HTTP_CONFIG_FILE"] == "/etc/gpufed/web/http-client.yml"
        assert env["RELOAD_URL"] in ("", "https://127.0.0.1:9090/-/reload", "https://127.0.0.1:9093/-/reload")

    parsed = webconfig_client.parse(find(objects, "ConfigMap", "-web-config")["data"]["http-client.yml"])
    assert parsed.tls_config is not None and parsed.tls_config.server_name == SERVER_NAME


@pytest.mark.parametrize("component", ["logs", "grafana"])
def test_tls_with_a_tree_sync_reader_fails_naming_it(chart: helm.Chart, component: str) -> None:
    base = values(ALL_VALUES)
    base[component] = {"enabled": True} if component == "logs" else {"server": {"enabled": True}}
    with pytest.raises(helm.HelmError, match="tree-sync"):
        render(chart, base)


def test_config_sync_py_fetches_with_the_client_certificate_and_reloads(
    chart: helm.Chart, tmp_path: Path
) -> None:
    """The TLS sidecar's script, run by Python against a server that requires client certificates."""
    pki = Pki(tmp_path)
    server_leaf, client_leaf = pki.server(), pki.client()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_file))
    context.load_cert_chain(str(server_leaf.cert), str(server_leaf.key))
    context.verify_mode = ssl.CERT_REQUIRED
    objects = render(chart, values(ALL_VALUES))
    script = tmp_path / "config-sync.py"
    script.write_text(find(objects, "ConfigMap", "-scripts")["data"]["config-sync.py"])
    http_config = tmp_path / "http-client.yml"
    server = LoopbackHTTPServer(FakeController, ssl_context=context).start()
    FakeController.files = {"children/cn-beijing-1-r1/prometheus.yml": b"global: {}\n"}
    FakeController.reloads = []

    def run(pod: str, *, cert: bool = True) -> subprocess.CompletedProcess[str]:
        tls = {"ca_file": str(pki.ca_file), "server_name": "localhost"}
        if cert:
            tls |= {"cert_file": str(client_leaf.cert), "key_file": str(client_leaf.key)}
        http_config.write_text(yaml.safe_dump({"tls_config": tls}))
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "GPUFED_URL": server.url,
               "FILES": "children/${CHILD}/prometheus.yml", "LOOP_SECONDS": "0",
               "RELOAD_URL": f"{server.url}/-/reload", "CHILD_REGION": "cn-beijing", "CHILD_REPLICAS": "2",
               "POD_NAME": pod, "CONFIG_DIR": str(tmp_path / "config"), "RETRIES": "1",
               "RETRY_SECONDS": "0", "HTTP_CONFIG_FILE": str(http_config)}
        (tmp_path / "config").mkdir(exist_ok=True)
        return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    try:
        assert server.url.startswith("https://")
        done = run("gpufed-child-cn-beijing-3")  # ordinal 3, k=2: shard 1, replica 1
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "config" / "prometheus.yml").read_bytes() == b"global: {}\n"
        assert FakeController.reloads == ["/-/reload"]
        assert run("gpufed-child-cn-beijing-3").returncode == 0  # unchanged: no reload
        assert FakeController.reloads == ["/-/reload"]
        assert run("gpufed-child-cn-beijing-4").returncode == 1  # child cn-beijing-2-r0 is not served
        refused = run("gpufed-child-cn-beijing-3", cert=False)  # no client certificate: refused
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert not list((tmp_path / "config").glob("*.tmp"))
    finally:
        server.stop()


def test_the_python_probe_presents_the_client_certificate(chart: helm.Chart, tmp_path: Path) -> None:
    """The controller's and relay's exec probe, run against a server requiring client certificates."""
    pki = Pki(tmp_path)
    server_leaf, client_leaf = pki.server(), pki.client()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_file))
    context.load_cert_chain(str(server_leaf.cert), str(server_leaf.key))
    context.verify_mode = ssl.CERT_REQUIRED
    objects = render(chart, values(ALL_VALUES))
    probe = container(find(objects, "Deployment", "-controller"), "controller")["readinessProbe"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python3", "-c"] and probe["timeoutSeconds"] == 5
    server = LoopbackHTTPServer(FakeController, ssl_context=context).start()
    FakeController.files = {"/readyz": b"ok"}
    http_config = tmp_path / "http-client.yml"

    def run(*, cert: bool) -> int:
        tls = {"ca_file": str(pki.ca_file), "server_name": "localhost"}
        if cert:
            tls |= {"cert_file": str(client_leaf.cert), "key_file": str(client_leaf.key)}
        http_config.write_text(yaml.safe_dump({"tls_config": tls}))
        code = (command[2].replace("/etc/gpufed/web/http-client.yml", str(http_config))
                .replace("https://127.0.0.1:8080", server.url))
        return subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT)},
                              capture_output=True, timeout=60, check=False).returncode

    try:
        assert run(cert=True) == 0
        assert run(cert=False) != 0
    finally:
        server.stop()
