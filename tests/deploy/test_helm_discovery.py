"""Discovery on any cluster (issue #39): the chart's ``discovery.*`` values reach ``gpufed
serve``'s region flags, which the real command's parser and checks accept; a region the
spec does not name is refused when rendering; NOTES.txt says what to label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from deploy_tools import serve_params
from test_helm import CHART, RELEASE, find, render

from federation.commands import serve
from federation.spec import load_gpufed_spec

TOKEN = {"controller": {"token": {"value": "a-token-0123456789abcdef"}}}
TWO_REGIONS = {"regions": [{"name": "cn-beijing", "shards": 2}, {"name": "hz", "shards": 1}]}


def controller_args(objects: list[dict[str, Any]]) -> list[str]:
    (container,) = find(objects, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_default_region_and_map_reach_the_flags_serve_checks(tmp_path: Path) -> None:
    chart = helm.Chart.load(CHART)
    objects = render(chart, {
        **TOKEN, "federation": TWO_REGIONS, "children": {"perRegion": {"cn-beijing": 2, "hz": 1}},
        "discovery": {"defaultRegion": "cn-beijing", "regionMap": {"cn-hangzhou": "hz"}}})
    params = serve_params(["gpufed", *controller_args(objects)])
    assert params["k8s_region_label"] == "topology.kubernetes.io/region"
    assert params["k8s_default_region"] == "cn-beijing" and params["k8s_region_map"] == ["cn-hangzhou=hz"]
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    flags = serve.RegionFlags(spec=load_gpufed_spec(spec_file))
    assert flags.mapping(params["k8s_region_map"]) == (("cn-hangzhou", "hz"),)  # type: ignore[arg-type]
    default = str(params["k8s_default_region"])
    assert flags.known(default, flag="--k8s-default-region") == "cn-beijing"


def test_only_a_token_keeps_the_topology_label_and_no_default() -> None:
    args = controller_args(render(helm.Chart.load(CHART), TOKEN))
    assert "--k8s-region-label=topology.kubernetes.io/region" in args
    assert not [a for a in args if a.startswith(("--k8s-default-region", "--k8s-region-map"))]


@pytest.mark.parametrize(("discovery", "message"), [
    ({"defaultRegion": "nowhere"}, 'discovery.defaultRegion "nowhere" is not in federation.regions'),
    ({"regionMap": {"cn-hangzhou": "hz"}},
     'discovery.regionMap.cn-hangzhou: "hz" is not in federation.regions'),
])
def test_a_region_the_spec_does_not_name_is_refused(discovery: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        helm.Chart.load(CHART).render({**TOKEN, "discovery": discovery}, **RELEASE)


def test_consul_discovery_gets_the_default_region() -> None:
    controller = {**TOKEN["controller"], "discovery": "consul", "consulAddress": "consul:8500"}
    values = {**TOKEN, "controller": controller, "discovery": {"defaultRegion": "cn-beijing"}}
    params = serve_params(["gpufed", *controller_args(render(helm.Chart.load(CHART), values))])
    assert params["consul_default_region"] == "cn-beijing"


def test_notes_say_what_no_targets_looks_like_and_what_to_label() -> None:
    chart = helm.Chart.load(CHART)
    notes = chart.render(TOKEN, **RELEASE)["gpufed/templates/NOTES.txt"]
    assert "kubectl label node <gpu-node> topology.kubernetes.io/region=cn-beijing" in notes
    assert "discovery[].skipped" in notes and "empty target list" in notes
    labelled = chart.render({**TOKEN, "discovery": {"defaultRegion": "cn-beijing"}}, **RELEASE)
    assert "else cn-beijing." in labelled["gpufed/templates/NOTES.txt"]
    assert "kubectl label node" not in labelled["gpufed/templates/NOTES.txt"]


def test_schema_accepts_the_discovery_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["discovery"] == {"regionLabel": "topology.kubernetes.io/region", "defaultRegion": "",
                                   "regionMap": {}}
