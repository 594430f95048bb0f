"""``helm install gpufed helm/gpufed -n monitoring --set controller.token.value=...``: nothing else.

Rendered by the Helm v4 SDK and checked by ``kubernetes-validate --strict`` (1.29, 1.33)
like every CI values file (test_helm.py); here what the defaults mean: two controller
replicas electing a leader on a Lease, their state in ConfigMaps of the release namespace
(no Consul, no PVC), no Thanos or object store, node-exporter discovered as job ``node``,
and a master whose config the controller renders from the chart's spec (meta-monitoring
included) and promtool accepts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from deploy_tools import serve_params
from test_helm import CHART, KUBE_VERSIONS, RELEASE, find, render

from federation.commands import serve
from federation.master import meta_monitoring
from federation.master.render import (
    FLAGS_FILE,
    MASTER_FILE,
    load_rule_pack,
    render_master_bundle,
    render_master_config,
)
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.engine.assigning import assign
from sharder.kernel.promtool import Promtool
from sharder.model.loading import parse_model
from sharder.sources.kubernetes import KubernetesConfig

ONLY_A_TOKEN = {"controller": {"token": {"value": "a-token-0123456789abcdef"}}}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(helm.Chart.load(CHART), ONLY_A_TOKEN)


def controller_args(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """``gpufed serve``'s parameters; every ``--k8s-job`` also goes through serve's own check."""
    (container,) = find(objects, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"]
    params = serve_params(["gpufed", *container["args"]])
    document = yaml.safe_load(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    spec = parse_model(GpufedSpec, document, source="chart")
    for flag in params["k8s_job"] or []:
        serve._k8s_job(flag, base=KubernetesConfig(namespace=params["namespace"]), jobs=spec)
    return params


def test_only_a_token_renders_and_validates(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("DaemonSet", "gpufed-node-exporter") in kinds and ("StatefulSet", "gpufed-master") in kinds
    assert not [name for _, name in kinds if "thanos" in name or "alertmanager" in name or "dingtalk" in name]
    deployment = find(objects, "Deployment", "-controller")
    assert deployment["spec"]["replicas"] == 2
    params = controller_args(objects)
    assert (params["store"], params["leader_election"]) == ("kubernetes", "kubernetes")
    assert (params["store_namespace"], params["store_prefix"]) == ("monitoring", "gpufed-state")
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]


def test_the_state_role_grants_configmaps_in_the_release_namespace(objects: list[dict[str, Any]]) -> None:
    role = find(objects, "Role", "-controller-state")
    assert role["metadata"].get("namespace", RELEASE["namespace"]) == RELEASE["namespace"]
    (rule,) = role["rules"]
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["configmaps"])
    assert {"get", "list", "watch", "create", "update", "patch", "delete"} == set(rule["verbs"])
    binding = find(objects, "RoleBinding", "-controller-state")
    account = find(objects, "Deployment", "-controller")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "monitoring"}]
    assert find(objects, "ServiceAccount", "")["metadata"]["name"] == account
    lease = find(objects, "Role", "-controller-lease")  # the Lease the replicas elect on
    assert any(r["resources"] == ["leases"] for r in lease["rules"])
    assert not [o for o in objects if o["kind"] == "ClusterRole" and any(
        "configmaps" in r["resources"] for r in o["rules"])]  # fmt: skip


def test_notes_say_what_to_set_next() -> None:
    notes = helm.Chart.load(CHART).render(ONLY_A_TOKEN, **RELEASE)["gpufed/templates/NOTES.txt"]
    for hint in ("federation.alerting", "thanos.enabled", "controller.store.type=consul", "hami.enabled"):
        assert hint in notes, notes
    assert "sharing their state (ConfigMaps gpufed-state-* in monitoring)" in notes
    assert "get lease gpufed-controller" in notes


def test_node_exporter_is_discovered_as_job_node(objects: list[dict[str, Any]]) -> None:
    service = find(objects, "Service", "-node-exporter")
    daemonset = find(objects, "DaemonSet", "-node-exporter")["spec"]["template"]
    assert service["spec"]["selector"].items() <= daemonset["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["name"] == "metrics" and daemonset["spec"]["hostNetwork"] is True
    assert f"node={service['metadata']['name']}:metrics" in controller_args(objects)["k8s_job"]


@pytest.mark.parametrize(("existing", "flag"), [
    ({"service": "ne", "port": "http-metrics"}, "node=ne:http-metrics"),
    ({"namespace": "kube-system", "podSelector": "app=ne", "port": 9100}, "node=kube-system/{app=ne}:9100"),
])
def test_an_existing_node_exporter_is_followed_instead(existing: dict[str, Any], flag: str) -> None:
    objects = render(helm.Chart.load(CHART), {**ONLY_A_TOKEN, "nodeExporter": {"enabled": False,
                                                                                "existing": existing}})
    assert not [o for o in objects if "node-exporter" in o["metadata"]["name"]]
    assert flag in controller_args(objects)["k8s_job"]


def test_hami_jobs_are_spec_jobs_the_controller_discovers(tmp_path: Path) -> None:
    objects = render(helm.Chart.load(CHART), {**ONLY_A_TOKEN, "hami": {"enabled": True}})
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    jobs = {job.name: job for job in load_gpufed_spec(spec_file).jobs}
    assert {"hami-scheduler", "hami-device-plugin"} <= set(jobs)
    assert "hami_.*" in jobs["hami-device-plugin"].keep_metrics
    assert set(controller_args(objects)["k8s_job"]) >= {
        "hami-scheduler=kube-system/hami-scheduler:monitor",
        "hami-device-plugin=kube-system/hami-device-plugin-monitor:monitorport",
    }


def test_the_master_config_the_controller_serves_passes_promtool(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    # the children write to every master replica the chart runs
    assert [w.url for w in spec.remote_write] == [
        f"http://gpufed-master-{i}.gpufed-master.monitoring.svc:9090/api/v1/write" for i in range(2)]
    bundle = render_master_bundle(spec, rule_pack=load_rule_pack())
    for path, data in bundle.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    Promtool().check(tmp_path, MASTER_FILE)
    config = yaml.safe_load(bundle[MASTER_FILE])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gpufed-child"]["http_sd_configs"][0]["url"] == (
        "http://gpufed-controller.monitoring.svc:8080/v1/sd-children")
    # each child is listed at the pod children.yaml runs it in (a StatefulSet ordinal)
    groups = meta_monitoring.children_groups(spec, assign(spec, []))
    pods = {f"{o['metadata']['name']}-{i}.{o['spec']['serviceName']}.monitoring.svc:9090"
            for o in objects if o["kind"] == "StatefulSet" and "-child-" in o["metadata"]["name"]
            for i in range(o["spec"]["replicas"])}
    assert {g["targets"][0] for g in groups} == pods
    # the master's rule files are the ones its config-sync fetches from the controller
    master = find(objects, "StatefulSet", "-master")["spec"]["template"]["spec"]["initContainers"][0]
    files = next(e["value"] for e in master["env"] if e["name"] == "FILES").split()
    assert set(files) == {p for p in bundle if p.startswith("master/") and p != FLAGS_FILE}


def test_alerting_gets_the_charts_alertmanager_pods_and_relay(tmp_path: Path) -> None:
    alerting = {
        "robots": [{"name": "sre", "url": "https://oapi.dingtalk.com/robot/send?access_token=${DINGTALK_SRE}"}],
        "receivers": [{"name": "sre", "robots": ["sre"]}],
        "default_receiver": "sre",
    }
    federation = yaml.safe_load((CHART / "values.yaml").read_text())["federation"]
    values = {**ONLY_A_TOKEN, "federation": {**federation, "alerting": alerting},
              "alertmanager": {"enabled": True, "replicas": 2}, "dingtalk": {"enabled": True}}
    objects = render(helm.Chart.load(CHART), values)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    assert spec.alerting is not None
    am = find(objects, "StatefulSet", "-alertmanager")
    assert [r.host for r in spec.alerting.replicas] == [
        f"gpufed-alertmanager-{i}.{am['spec']['serviceName']}.monitoring.svc" for i in range(2)]
    relay = find(objects, "Service", "-dingtalk")
    assert spec.alerting.relay_url == f"http://{relay['metadata']['name']}.monitoring.svc:8060"
    targets = {job["job_name"]: job["static_configs"][0]["targets"]
               for job in render_master_config(spec)["scrape_configs"] if "static_configs" in job}
    assert targets["alertmanager"] == [f"{r.host}:9093" for r in spec.alerting.replicas]
    assert targets["gpufed-dingtalk"] == ["gpufed-dingtalk.monitoring.svc:8060"]
