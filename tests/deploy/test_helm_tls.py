"""helm/gpufed's ``tls`` block: a cert-manager Certificate or an existing Secret, mounted where
the exporters serve and the children and the controller read it; rendered offline.

The exporters serve the chart's web config (parsed here by the same strict model as
``gpufed-exporter --web.config.file``); the controller's federation.yaml gets a ``tls``
section whose ``gpu`` job renders https with the client certificate. Strict Kubernetes
validation of every object is test_helm.py's, over ci/tls-values.yaml.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm import CHART, find, render, values

from federation.spec import GpufedSpec
from sharder.children.render import scrape_config
from sharder.model.loading import parse_model
from webconfig import model as webconfig_model

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

