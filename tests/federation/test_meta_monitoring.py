"""Meta-monitoring: the master's jobs about gpufed itself and the controller's children list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.master import meta_monitoring
from federation.master.render import MASTER_FILE, render_master_bundle, render_master_config
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.engine.assigning import assign
from sharder.kernel.errors import SpecError
from sharder.kernel.promtool import Promtool
from sharder.model.loading import parse_model
from tests.controller.harness import build, fleet, spec_document

RULES = Path(__file__).resolve().parents[2] / "federation" / "rules" / "federation.yml"


def spec_of(monitoring: dict[str, Any] | None = None, *, rf: int = 1, alerting: bool = True) -> GpufedSpec:
    doc = spec_document(regions={"r1": 2, "r2": 1}, replication_factor=rf)
    doc["master"] = {"replicas": 2, **({"monitoring": monitoring} if monitoring is not None else {})}
    if alerting:
        doc["alerting"] = {
            "replicas": [{"name": f"am-{i}", "host": f"alertmanager-{i}"} for i in range(2)],
            "robots": [{"name": "sre", "url": "https://oapi.dingtalk.com/robot/send?access_token=${T}"}],
            "receivers": [{"name": "sre", "robots": ["sre"]}],
            "default_receiver": "sre",
            "routes": [{"region": "r1", "robot": "sre"}, {"region": "r2", "robot": "sre"}],
        }
    return parse_model(GpufedSpec, doc, source="test")


def jobs_by_name(spec: GpufedSpec) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in render_master_config(spec)["scrape_configs"]}


def test_master_scrapes_every_gpufed_component_under_the_rule_packs_job_names() -> None:
    jobs = jobs_by_name(spec_of())
    assert sorted(jobs) == [
        "alertmanager", "gpufed-child", "gpufed-controller", "gpufed-dingtalk", "gpufed-master"
    ]
    assert jobs["gpufed-child"]["http_sd_configs"][0]["url"] == "http://127.0.0.1:8080/v1/sd-children"
    assert jobs["alertmanager"]["static_configs"][0]["targets"] == [
        "alertmanager-0:9093", "alertmanager-1:9093"
    ]
    assert jobs["gpufed-master"]["static_configs"][0]["targets"] == [
        "master-prometheus-0:9090", "master-prometheus-1:9090"
    ]
    assert jobs["gpufed-dingtalk"]["static_configs"][0]["targets"] == ["gpufed-dingtalk:8060"]
    # the rule pack's PrometheusChildDown selects exactly the children's job
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    child_down = next(r for r in rules if r.get("alert") == "PrometheusChildDown")
    assert 'job=~"gpufed-child.*"' in child_down["expr"]


def test_without_alerting_there_is_no_alertmanager_or_relay_job_and_overrides_apply() -> None:
    spec = spec_of({"controllers": ["c-0:8080", "c-1:8080"], "masters": ["m:9090"]}, alerting=False)
    jobs = jobs_by_name(spec)
    assert "alertmanager" not in jobs and "gpufed-dingtalk" not in jobs
    assert jobs["gpufed-controller"]["static_configs"][0]["targets"] == ["c-0:8080", "c-1:8080"]
    assert jobs["gpufed-master"]["static_configs"][0]["targets"] == ["m:9090"]


def test_disabled_keeps_only_the_masters_own_job() -> None:
    assert list(jobs_by_name(spec_of({"enabled": False}))) == ["gpufed-master"]


def test_rendered_master_config_passes_promtool(tmp_path: Path) -> None:
    (tmp_path / "master").mkdir()
    (tmp_path / MASTER_FILE).write_bytes(
        render_master_bundle(spec_of(), rule_pack={})[MASTER_FILE]
    )
    Promtool().check(tmp_path, MASTER_FILE)


def test_children_groups_carry_the_labels_and_the_pods_ordinal() -> None:
    template = "http://set-{region}-{ordinal}.set-{region}.ns.svc:9090"
    spec = spec_of({"child_url": "http://child-{child}:9090", "child_url_by_region": {"r2": template}}, rf=2)
    assignment = assign(spec, fleet(4, region="r1") + fleet(2, region="r2", start=100))
    groups = meta_monitoring.children_groups(spec, assignment)
    by_child = {g["labels"]["child"]: g for g in groups}
    assert sorted(by_child) == ["r1-0-r0", "r1-0-r1", "r1-1-r0", "r1-1-r1", "r2-0-r0", "r2-0-r1"]
    assert by_child["r1-1-r1"] == {
        "targets": ["child-r1-1-r1:9090"],
        "labels": {"child": "r1-1-r1", "region": "r1", "shard": "r1-1", "replica": "1"},
    }
    assert by_child["r2-0-r1"]["targets"] == ["set-r2-1.set-r2.ns.svc:9090"]


def test_a_path_in_the_child_url_becomes_the_metrics_path() -> None:
    spec = spec_of({"child_url": "http://127.0.0.1:7000/{child}"})
    groups = meta_monitoring.children_groups(spec, assign(spec, fleet(3, region="r1")))
    assert {g["targets"][0] for g in groups} == {"127.0.0.1:7000"}
    paths = [g["labels"]["__metrics_path__"] for g in groups]
    assert paths == ["/r1-0/metrics", "/r1-1/metrics", "/r2-0/metrics"]
    # alerts name the child, not the proxy every child shares
    assert [g["labels"]["instance"] for g in groups] == [g["labels"]["child"] for g in groups]
    assert meta_monitoring.children_groups(spec, None) == []


@pytest.mark.parametrize(
    ("monitoring", "named"),
    [
        ({"child_url": "http://{pod}:9090"}, "child_url 'http://{pod}:9090'"),
        ({"child_url": "ftp://{child}:9090"}, "child_url 'ftp://{child}:9090'"),
        ({"controllers": ["controller"]}, "expected HOST:PORT, got 'controller'"),
        ({"child_url_by_region": {"r9": "http://{child}:9090"}}, "regions ['r9']"),
    ],
)
def test_bad_monitoring_settings_name_the_field_and_value(monitoring: dict[str, Any], named: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(monitoring)
    assert named in str(caught.value)


@pytest.mark.asyncio
async def test_controller_serves_its_children_for_the_master(tmp_path: Path) -> None:
    doc = spec_document(regions={"r1": 2, "r2": 1})
    doc["master"] = {"monitoring": {"child_url": "http://child-{child}:9090"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    harness = build(tmp_path, spec=load_gpufed_spec(path))
    harness.feed(fleet(6, region="r1") + fleet(3, region="r2", start=100))
    async with harness.client() as client:
        response = await client.get("/v1/sd-children")
    assert response.status_code == 200
    groups = response.json()
    assert [(g["targets"], g["labels"]["shard"]) for g in groups] == [
        (["child-r1-0:9090"], "r1-0"), (["child-r1-1:9090"], "r1-1"), (["child-r2-0:9090"], "r2-0")
    ]
    # the master config the controller publishes is gpufed render's, meta-monitoring included
    harness.controller.publish_configs()
    async with harness.client() as client:
        published = await client.get("/v1/configs/master/prometheus.yml")
    assert published.status_code == 200
    config = yaml.safe_load(published.text)
    assert config == render_master_config(load_gpufed_spec(path))
    child_job = next(j for j in config["scrape_configs"] if j["job_name"] == "gpufed-child")
    assert child_job["http_sd_configs"][0]["url"] == "http://127.0.0.1:8080/v1/sd-children"
