"""helm/gpufed: the relay's memory on a claim of its own, and Alertmanager's secret files where
the spec names them; rendered offline by the real Helm SDK.

The relay (a StatefulSet of one) runs with ``--data-dir`` on its ``data`` volume: a claim from
the volumeClaimTemplate (``dingtalk.storage``), or an emptyDir with ``dingtalk.storage: ""``.
``alertmanager.secretFiles`` mounts one Secret at its ``mountPath`` in every Alertmanager
replica; the controller renders ``alertmanager.yml`` from the chart's spec ConfigMap, so the
test renders it the same way and follows each secret path through the mount and the Secret's
items to its content. amtool does not open those files (it checks the fields' shape), so the
content check is what proves they are there; the pinned amtool 0.33.1 checks the config itself.
Strict Kubernetes validation of ci/channels-values.yaml is test_helm.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from conftest import stack_tool
from test_helm import CHART, RELEASE, find, render, values

from alertmanager.amtool import Amtool
from alertmanager.render import ALERTMANAGER_FILE, render_alerting_bundle
from federation.spec import GpufedSpec
from sharder.model.loading import parse_model

CHANNELS = CHART / "ci" / "channels-values.yaml"
FILE_FIELDS = ("api_secret_file", "credentials_file", "auth_password_file")


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def pod(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod(workload)["containers"] if c["name"] == name)


def secret_paths(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [str(v) for k, v in node.items() if k in FILE_FIELDS]
        return found + [p for v in node.values() for p in secret_paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in secret_paths(v)]
    return []


def chart_secret(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-secret-files")]


def rendered_alertmanager_yml(objects: list[dict[str, Any]]) -> str:
    """alertmanager.yml as the controller renders it from the chart's spec ConfigMap."""
    text = find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"]
    spec = parse_model(GpufedSpec, yaml.safe_load(text), source="federation.yaml")
    assert spec.alerting is not None
    bundle = render_alerting_bundle(spec.alerting, cluster=spec.cluster, regions=spec.region_names(),
                                    tls=spec.tls)
    return bundle[ALERTMANAGER_FILE].decode()


def relay_data(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    relay = find(objects, "StatefulSet", "-dingtalk")
    args = container(relay, "relay")["args"]
    data_dir = args[args.index("--data-dir") + 1]
    (mount,) = [m for m in container(relay, "relay")["volumeMounts"] if m["mountPath"] == data_dir]
    assert not mount.get("readOnly") and mount["name"] == "data"
    assert pod(relay)["securityContext"]["fsGroup"] == 65534  # the claim is writable by the relay
    return relay, data_dir


def test_the_relay_keeps_its_memory_on_a_claim_of_its_own(chart: helm.Chart) -> None:
    full = values(CHART / "ci" / "full-values.yaml")
    full["dingtalk"]["storageClassName"] = "fast"
    relay, _ = relay_data(render(chart, full))
    assert relay["spec"]["replicas"] == 1
    (claim,) = relay["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert all(v["name"] != "data" for v in pod(relay)["volumes"])


def test_an_empty_storage_keeps_the_memory_in_an_empty_dir(chart: helm.Chart) -> None:
    relay, _ = relay_data(render(chart, values(CHANNELS)))
    assert "volumeClaimTemplates" not in relay["spec"]
    assert {"name": "data", "emptyDir": {}} in pod(relay)["volumes"]


def test_each_secret_path_in_the_rendered_config_is_a_key_of_the_mounted_secret(chart: helm.Chart,
                                                                                 tmp_path: Path) -> None:
    objects = render(chart, values(CHANNELS))
    config = rendered_alertmanager_yml(objects)
    paths = secret_paths(yaml.safe_load(config))
    assert len(paths) == 3
    am = find(objects, "StatefulSet", "-alertmanager")
    mounts = {m["mountPath"]: m for m in container(am, "alertmanager")["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(am)["volumes"]}
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    files = values(CHANNELS)["alertmanager"]["secretFiles"]["files"]
    for path in paths:
        folder, name = path.rsplit("/", 1)
        mount = mounts[folder]
        assert mount["readOnly"] is True
        source = volumes[mount["name"]]["secret"]
        (item,) = [i for i in source["items"] if i["path"] == name]
        assert secrets[source["secretName"]]["stringData"][item["key"]] == files[name]
    # every replica mounts it (one pod template), and the relay does not
    relay = find(objects, "StatefulSet", "-dingtalk")
    assert all(m["mountPath"] not in mounts or m["name"] != "secret-files"
               for m in container(relay, "relay")["volumeMounts"])
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(config)
    Amtool(stack_tool(3, "amtool")).check_config(rendered)


def test_an_existing_secret_is_mounted_with_the_keys_the_spec_names(chart: helm.Chart) -> None:
    given = values(CHANNELS)
    given["alertmanager"]["secretFiles"] = {"existingSecret": "am-channel-secrets"}
    objects = render(chart, given)
    assert not chart_secret(objects)
    volume = next(v for v in pod(find(objects, "StatefulSet", "-alertmanager"))["volumes"]
                  if v["name"] == "secret-files")
    assert volume["secret"]["secretName"] == "am-channel-secrets"
    # a key the Secret lacks keeps the pod from starting, naming the key
    keys = sorted(i["key"] for i in volume["secret"]["items"])
    assert keys == ["sms-token", "smtp-password", "wecom-secret"]


def test_no_secret_file_in_the_spec_mounts_nothing(chart: helm.Chart) -> None:
    objects = render(chart, values(CHART / "ci" / "full-values.yaml"))
    am = find(objects, "StatefulSet", "-alertmanager")
    assert all(v["name"] != "secret-files" for v in pod(am)["volumes"])
    assert not chart_secret(objects)


@pytest.mark.parametrize(
    ("receiver", "channel", "field", "path", "expected"),
    [
        (1, "wecom", "api_secret_file", "/run/secrets/wecom",
         "federation.alerting.receivers[1].wecom[0].api_secret_file is \"/run/secrets/wecom\"; the chart"
         " mounts alertmanager.secretFiles at /etc/alertmanager/secrets in every Alertmanager: write"
         " /etc/alertmanager/secrets/wecom"),
        (2, "webhooks", "credentials_file", "/etc/alertmanager/secrets/sub/token",
         "federation.alerting.receivers[2].webhooks[0].credentials_file is"
         " \"/etc/alertmanager/secrets/sub/token\""),
        (3, "emails", "auth_password_file", "/etc/alertmanager/secrets/smtp",
         "federation.alerting.receivers[3].emails[0].auth_password_file is"
         " \"/etc/alertmanager/secrets/smtp\": set alertmanager.secretFiles.files.smtp"),
    ],
)
def test_a_path_the_mount_cannot_serve_fails_the_render_naming_the_field(
    chart: helm.Chart, receiver: int, channel: str, field: str, path: str, expected: str
) -> None:
    given = values(CHANNELS)
    given["federation"]["alerting"]["receivers"][receiver][channel][0][field] = path
    with pytest.raises(helm.HelmError) as caught:
        chart.render(given, **RELEASE)
    assert expected in str(caught.value)
