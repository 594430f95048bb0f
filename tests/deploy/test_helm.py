"""helm/gpufed rendered by the real Helm v4 SDK and every object checked by Kubernetes' schemas.

``helm-python-sdk`` embeds Helm's Go SDK (``libhelm_c``) and renders without a cluster;
``helm-sdkpy`` was measured and dropped: it needs Python >= 3.12 (this project runs 3.11)
and only lints. ``kubernetes-validate --strict`` refuses unknown fields, per minor version.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from deploy_tools import exporter_settings_from, schema_errors, serve_params

from federation.dashboards import dashboard_files
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer
from federation.spec import load_gpufed_spec
from thanos import formats

CHART = ROOT / "helm" / "gpufed"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
BAD_FILES = sorted((CHART / "ci" / "bad").glob("*.yaml"))
KUBE_VERSIONS = ("1.29", "1.33")
#: Prometheus Operator and cert-manager kinds: no schema in kubernetes-validate (the Operator's are
#: checked by promtool instead; the Certificate in tests/deploy/test_helm_tls.py).
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"}
RELEASE = {"name": "gpufed", "namespace": "monitoring"}


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    out = chart.render(values, **RELEASE)
    return [
        doc
        for path, text in sorted(out.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def values(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()) or {})


def find(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix))


def test_ci_values_files_exist() -> None:
    assert {p.name for p in CI_FILES} >= {
        "default-values.yaml", "minimal-values.yaml", "full-values.yaml", "ha-values.yaml"}
    assert len(BAD_FILES) >= 8


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_renders_and_every_object_validates(chart: helm.Chart, values_file: Path, tmp_path: Path) -> None:
    objects = render(chart, values(values_file))
    assert len(objects) >= 15
    validated = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            assert obj["apiVersion"] in ("monitoring.coreos.com/v1", "cert-manager.io/v1") and obj["spec"]
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
            validated += 1
    assert validated >= 2 * 15
    # the spec the controller reads is a valid federation.yaml, not just valid YAML
    spec_map = find(objects, "ConfigMap", "-spec")
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(spec_map["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    assert spec.children.target_discovery == "http_sd"
    assert spec.children.http_sd_url.endswith(".monitoring.svc:8080")


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_lint_is_clean(values_file: Path) -> None:
    for version in KUBE_VERSIONS:
        report = helm.lint(CHART, values(values_file), strict=True, kube_version=f"v{version}.0")
        assert not report["errors"], report
        assert all(m["severity"] <= 1 for m in report["messages"]), report["messages"]


@pytest.mark.parametrize("bad_file", BAD_FILES, ids=lambda p: p.stem)
def test_schema_rejects_bad_values_with_a_clear_message(chart: helm.Chart, bad_file: Path) -> None:
    text = bad_file.read_text()
    expected = text.splitlines()[0].removeprefix("# expect: ")
    assert expected != text.splitlines()[0], f"{bad_file.name}: first line must be '# expect: ...'"
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render(yaml.safe_load(text), **RELEASE)
    assert expected in str(caught.value)
    # refused for that reason only: the rest of the file is valid
    assert len(schema_errors(str(caught.value))) == 1, str(caught.value)



def test_strict_validation_is_not_a_no_op(chart: helm.Chart) -> None:
    objects = render(chart, values(CHART / "ci" / "default-values.yaml"))
    deployment = find(objects, "Deployment", "-controller")
    deployment["spec"]["template"]["spec"]["containers"][0]["bogusField"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.33", strict=True)


def test_components_are_wired(chart: helm.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(chart, values(CHART / "ci" / "full-values.yaml"))
    controller = find(objects, "Deployment", "-controller")
    assert controller["spec"]["replicas"] == 3
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--consul=consul-server.consul.svc:8500" in args
    params = serve_params(["gpufed", *args])
    assert (params["store"], params["leader_election"], params["lock_ttl"]) == (
        "consul://consul-server.consul.svc:8500/gpufed/prod", "consul", 20)
    cluster_rules = find(objects, "ClusterRole", "-controller")["rules"]
    granted = {(r, v) for rule in cluster_rules for r in rule["resources"] for v in rule["verbs"]}
    assert {("endpointslices", "watch"), ("pods", "list"), ("nodes", "watch")} <= granted
    assert not [o for o in objects if o["kind"] == "Role"]  # a Consul lock needs no Lease

    exporter = find(objects, "DaemonSet", "-exporter")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in exporter["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert exporter["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    plain = {name: e["value"].replace("$(NODE_NAME)", "gpu-7") for name, e in env.items() if "value" in e}
    settings = exporter_settings_from(plain, monkeypatch)
    assert (settings.node_name, settings.kubernetes, settings.pod_attribution) == ("gpu-7", True, "kubelet")
    assert (settings.dra_resource_slices, settings.pod_resources_max_age) == (True, 60.0)
    slice_rules = find(objects, "ClusterRole", "-exporter")["rules"]
    assert {(r, v) for rule in slice_rules for r in rule["resources"] for v in rule["verbs"]} >= {
        ("resourceslices", "list"), ("resourceslices", "watch")}
    assert exporter["serviceAccountName"].endswith("-exporter")
    assert exporter["tolerations"] and exporter["nodeSelector"]["gpufed.io/monitored"] == "yes"

    children = [o for o in objects if o["kind"] == "StatefulSet" and "-child-" in o["metadata"]["name"]]
    assert sorted(c["spec"]["replicas"] for c in children) == [2, 4, 4]

    am = find(objects, "StatefulSet", "-alertmanager")
    peers = [a for a in am["spec"]["template"]["spec"]["containers"][0]["args"] if "--cluster.peer=" in a]
    assert len(peers) == 3 and all(".gpufed-alertmanager.monitoring.svc:9094" in p for p in peers)
    # The spec's external URLs (the links in alerts) reach both components' flags.
    assert "--web.external-url=https://alertmanager.gpu.example.com" in am["spec"]["template"]["spec"][
        "containers"][0]["args"]
    master = find(objects, "StatefulSet", "-master")["spec"]["template"]["spec"]["containers"][0]
    assert "--web.external-url=https://prometheus.gpu.example.com" in master["args"]
    assert find(objects, "Service", "-alertmanager")["spec"]["clusterIP"] == "None"

    relay = find(objects, "StatefulSet", "-dingtalk")["spec"]["template"]["spec"]["containers"][0]
    assert relay["envFrom"] == [{"secretRef": {"name": "gpufed-dingtalk"}}]

    hook = next(o for o in objects if o["kind"] == "Pod")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "/v1/sd/cn-beijing-0-r0\"" in hook["spec"]["containers"][0]["command"][-1]


def controller_parts(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(Deployment, its container, ``gpufed serve``'s parsed parameters)."""
    deployment = find(objects, "Deployment", "-controller")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpufed"]
    params = serve_params(["gpufed", *container["args"]])
    # serve chmods its data dir to 0700: a directory it creates under the volume, not the
    # volume's root, which belongs to root (the pod runs as 65534)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "data"]
    assert Path(params["data_dir"]).parent == Path(mount["mountPath"])  # type: ignore[arg-type]
    return deployment, container, params


def test_two_controller_replicas_elect_a_leader_on_a_lease(chart: helm.Chart) -> None:
    """Two replicas, a Kubernetes Lease, the state in Consul KV (ci/ha-values.yaml)."""
    objects = render(chart, values(CHART / "ci" / "ha-values.yaml"))
    deployment, container, params = controller_parts(objects)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert params["store"] == "consul://consul-server.consul.svc:8500/gpufed"
    assert params["leader_election"] == "kubernetes"
    assert params["advertise_url"] == "http://$(POD_IP):8080" and params["lock_ttl"] == 15
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
                   "POD_IP": "status.podIP"}
    # the Lease serve takes is the one the Role grants, in the release namespace
    lease = params["lease_name"]
    role = find(objects, "Role", "-controller-lease")
    assert role["metadata"].get("namespace", RELEASE["namespace"]) == RELEASE["namespace"]
    verbs = {(v, tuple(rule.get("resourceNames", ()))) for rule in role["rules"] for v in rule["verbs"]
             if rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]}
    assert verbs == {("create", ()), ("get", (lease,)), ("update", (lease,))}
    binding = find(objects, "RoleBinding", "-controller-lease")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "monitoring"}]
    # shared state: no volume claim; one replica always up through a drain; spread over nodes
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert find(objects, "PodDisruptionBudget", "-controller")["spec"]["minAvailable"] == 1
    assert deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    # discovery follows the exporters' Service, in the release namespace
    assert params["in_cluster"] and params["namespace"] == "monitoring"
    service = find(objects, "Service", "-exporter")
    assert service["metadata"]["name"] == params["k8s_service"]
    assert service["spec"]["ports"][0]["name"] == "metrics"
    exporter = find(objects, "DaemonSet", "-exporter")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= exporter.items()


def test_one_controller_replica_keeps_sqlite_on_a_volume(chart: helm.Chart) -> None:
    objects = render(chart, values(CHART / "ci" / "minimal-values.yaml"))
    deployment, _container, params = controller_parts(objects)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert params["store"] is None and params["leader_election"] == "none"
    claim = find(objects, "PersistentVolumeClaim", "-controller")["metadata"]["name"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim}} in volumes
    assert not [o for o in objects if o["kind"] == "Role"]
    # one replica: no budget for the controller (children have theirs, test_helm_workloads.py)
    budgets = [o["metadata"]["name"] for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert not [name for name in budgets if name.endswith("-controller")]


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.stem)
def test_controller_knows_every_child_pod(chart: helm.Chart, values_file: Path, tmp_path: Path) -> None:
    """``--child-url`` names each child the spec yields, at the pod children.yaml runs it in."""
    from sharder.engine.assigning import assign

    objects = render(chart, values(values_file))
    _deployment, _container, params = controller_parts(objects)
    urls = dict(value.split("=", 1) for value in params["child_url"])  # type: ignore[union-attr]
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    assignment = assign(load_gpufed_spec(spec_file), [])
    children = {child for shard in assignment.shards for child, _ in assignment.children(shard)}
    assert set(urls) == children
    pods = {
        f"{o['metadata']['name']}-{i}.{o['spec']['serviceName']}.monitoring.svc"
        for o in objects if o["kind"] == "StatefulSet" and "-child-" in o["metadata"]["name"]
        for i in range(o["spec"]["replicas"])
    }
    scheme = "https://" if values(values_file).get("tls", {}).get("enabled") else "http://"
    hosts = {url.removeprefix(scheme).removesuffix(":9090") for url in urls.values()}
    assert hosts == pods
    # the pod that runs a child fetches that child's config: config-sync.sh's naming
    script = find(objects, "ConfigMap", "-scripts")["data"]["config-sync.sh"]
    for child, url in urls.items():
        pod = url.removeprefix(scheme).split(".")[0]
        region = next(r for r in chart_regions(objects) if pod.startswith(f"gpufed-child-{r}-"))
        rf = str(assignment.replication_factor)
        done = subprocess.run(["sh", "-c", script.split("fetch() {")[0] + 'echo "$CHILD"'],
                              env={"PATH": os.environ["PATH"], "CHILD_REGION": region, "CHILD_REPLICAS": rf,
                                   "POD_NAME": pod}, capture_output=True, text=True, timeout=30, check=True)
        assert done.stdout.strip() == child


def chart_regions(objects: list[dict[str, Any]]) -> list[str]:
    """Longest first, so a region that is a prefix of another is not matched by mistake."""
    regions = {o["metadata"]["labels"]["gpufed.io/region"] for o in objects
               if o["kind"] == "StatefulSet" and "-child-" in o["metadata"]["name"]}
    return sorted(regions, key=len, reverse=True)


def test_hashring_checksum_follows_the_receive_set(chart: helm.Chart) -> None:
    base = values(CHART / "ci" / "ha-values.yaml")

    def checksum(replicas: int) -> str:
        objects = render(chart, {**base, "thanos": {**base["thanos"], "receive": {"replicas": replicas}}})
        receive = find(objects, "StatefulSet", "-thanos-receive")
        ring = find(objects, "ConfigMap", "-hashrings")["data"]["hashrings.json"]
        assert ring.count(".svc:10901") == replicas
        return str(receive["spec"]["template"]["metadata"]["annotations"]["checksum/hashrings"])

    assert checksum(3) != checksum(4)
    objects = render(chart, base)
    (ring,) = json.loads(find(objects, "ConfigMap", "-hashrings")["data"]["hashrings.json"])
    assert ring["algorithm"] == "ketama"  # as thanos/render.py renders it, not Thanos' hashmod default
    (container,) = find(objects, "StatefulSet", "-thanos-receive")["spec"]["template"]["spec"]["containers"]
    assert "--receive.hashrings-algorithm=ketama" in container["args"]
    formats.parse_hashrings(json.dumps([ring]))
    with pytest.raises(helm.HelmError, match="cannot exceed"):
        render(chart, {**base, "thanos": {**base["thanos"], "receive": {"replicas": 1}}})


def test_dashboards_and_rules_are_the_source_files(chart: helm.Chart) -> None:
    copies = sorted((CHART / "dashboards").glob("*.json"))
    assert [p.name for p in copies] == [p.name for p in dashboard_files()]
    for copy, source in zip(copies, dashboard_files(), strict=True):
        assert copy.read_bytes() == source.read_bytes(), f"run: cp {source} {copy}"
    rules = sorted((CHART / "rules").glob("*.yml"))
    sources = sorted((ROOT / "federation" / "rules").glob("*.yml"))
    assert [(p.name, p.read_bytes()) for p in rules] == [(p.name, p.read_bytes()) for p in sources]

    objects = render(chart, values(CHART / "ci" / "default-values.yaml"))
    maps = [o for o in objects if o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert sorted(k for m in maps for k in m["data"]) == [p.name for p in dashboard_files()]
    for m in maps:
        ((name, body),) = m["data"].items()
        assert body == (CHART / "dashboards" / name).read_text().rstrip("\n")


def test_prometheus_rule_passes_promtool(chart: helm.Chart, tmp_path: Path) -> None:
    objects = render(chart, values(CHART / "ci" / "full-values.yaml"))
    rule = find(objects, "PrometheusRule", "gpufed")
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(rule["spec"]["groups"]) >= 3


class FakeController(LoopbackHandler):
    """Serves ``/v1/configs/<path>`` (the controller's route) from ``files``; records reload POSTs."""

    files: ClassVar[dict[str, bytes]] = {}
    reloads: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = self.files.get(self.path.removeprefix("/v1/configs/"))
        self.reply(200 if body is not None else 404, body or b"")

    def do_POST(self) -> None:
        self.reloads.append(self.path)
        self.reply(200)


def test_config_sync_script_fetches_the_pods_child_and_reloads(chart: helm.Chart, tmp_path: Path) -> None:
    """The sidecar's shell script, run by a real sh + wget against a stand-in controller."""
    objects = render(chart, values(CHART / "ci" / "default-values.yaml"))
    script = tmp_path / "config-sync.sh"
    script.write_text(find(objects, "ConfigMap", "-scripts")["data"]["config-sync.sh"])
    server = LoopbackHTTPServer(FakeController).start()
    url = server.url
    FakeController.files = {"children/cn-beijing-1-r1/prometheus.yml": b"global: {}\n"}
    FakeController.reloads = []

    def run(pod: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], "GPUFED_URL": url, "FILES": "children/${CHILD}/prometheus.yml",
               "LOOP_SECONDS": "0", "RELOAD_URL": f"{url}/-/reload", "CHILD_REGION": "cn-beijing",
               "CHILD_REPLICAS": "2", "POD_NAME": pod, "CONFIG_DIR": str(tmp_path / "config"),
               "RETRIES": "1", "RETRY_SECONDS": "0"}
        (tmp_path / "config").mkdir(exist_ok=True)
        return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=30,
                              check=False)

    try:
        assert run("gpufed-child-cn-beijing-3").returncode == 0  # ordinal 3, k=2: shard 1, replica 1
        assert (tmp_path / "config" / "prometheus.yml").read_bytes() == b"global: {}\n"
        assert FakeController.reloads == ["/-/reload"]
        assert run("gpufed-child-cn-beijing-3").returncode == 0  # unchanged: no reload
        assert FakeController.reloads == ["/-/reload"]
        assert run("gpufed-child-cn-beijing-4").returncode == 1  # child cn-beijing-2-r0 is not served
        assert (tmp_path / "config" / "prometheus.yml").read_bytes() == b"global: {}\n"
        assert not list((tmp_path / "config").glob("*.tmp"))
    finally:
        server.stop()


def test_children_must_be_whole_shards(chart: helm.Chart) -> None:
    base = values(CHART / "ci" / "default-values.yaml")
    federation = {**chart.values["federation"], "sharding": {"replication_factor": 2}}
    whole = r"must be a multiple of federation\.sharding\.replication_factor"
    with pytest.raises(helm.HelmError, match=whole):
        render(chart, {**base, "federation": federation, "children": {"perRegion": {"cn-beijing": 3}}})


@pytest.mark.parametrize(
    ("version", "agent", "expand"),
    [(None, "--agent", False), ("3.13", "--agent", False), ("2.53", "--enable-feature=agent", True)],
)
def test_prometheus_flags_follow_the_specs_line(
    chart: helm.Chart, version: str | None, agent: str, expand: bool
) -> None:
    """Prometheus 3.x exits on --enable-feature=agent: the chart spells flags as the spec's line does."""
    vals = values(CHART / "ci" / "ha-values.yaml")
    if version is not None:
        vals.setdefault("federation", {})["prometheus"] = {"version": version}
    objects = render(chart, vals)
    children = [o for o in objects if o["kind"] == "StatefulSet" and "-child-" in o["metadata"]["name"]]
    assert children
    for child in children:
        args = child["spec"]["template"]["spec"]["containers"][0]["args"]
        assert agent in args and ("--agent" in args) != ("--enable-feature=agent" in args)
    masters = [o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith("-master")]
    assert masters
    master_args = masters[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--enable-feature=expand-external-labels" in master_args) == expand
