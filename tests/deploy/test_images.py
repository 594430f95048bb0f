"""The stack's image tags have one home (federation/master/images.py): compose, the chart's
values, compose/node.yml and the controller image's tool stages must all say the same."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from federation.master import compose, images
from sharder.kernel import prometheus_versions
from sharder.model.spec import PrometheusSpec

ROOT = Path(__file__).resolve().parents[2]
HELM_KEYS = {"prometheus": "prometheus", "alertmanager": "alertmanager", "node-exporter": "nodeExporter"}


def test_chart_values_pin_the_table() -> None:
    values = yaml.safe_load((ROOT / "helm" / "gpufed" / "values.yaml").read_text())
    pinned = {component: values["images"][key] for component, key in HELM_KEYS.items()}
    assert pinned == {component: images.ref(component) for component in HELM_KEYS}


def test_compose_files_pin_the_table() -> None:
    assert compose.IMAGES["prometheus"] == images.ref("prometheus")
    assert compose.IMAGES["alertmanager"] == images.ref("alertmanager")
    node = yaml.safe_load((ROOT / "compose" / "node.yml").read_text())
    assert node["services"]["node-exporter"]["image"] == images.ref("node-exporter")


def test_controller_image_tools_come_from_the_pinned_images() -> None:
    stages = dict(re.findall(r"^FROM (\S+) AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert {name: ref for ref, name in stages.items()} == {
        "prometheus": images.ref("prometheus"),
        "alertmanager": images.ref("alertmanager"),
    }


def test_default_spec_line_is_the_image_line() -> None:
    # The chart and compose render with the spec's default prometheus.version.
    assert PrometheusSpec().release().major == images.PROMETHEUS_IMAGE_LINE
    tag = images.STACK_IMAGES["prometheus"].tag
    assert prometheus_versions.parse_prometheus(tag).major == images.PROMETHEUS_IMAGE_LINE
