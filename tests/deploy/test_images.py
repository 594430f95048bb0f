"""Every image has one home (federation/master/images.py): the rendered compose tier,
compose/node.yml, the chart's values and the controller image's tool stages must all name
exactly what the table pins, and the table names nothing they do not use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from federation.master import images
from sharder.kernel import prometheus_versions
from sharder.model.spec import PrometheusSpec

ROOT = Path(__file__).resolve().parents[2]
#: chart values.yaml ``images.<key>`` -> table component
HELM_KEYS = {
    "prometheus": "prometheus",
    "alertmanager": "alertmanager",
    "thanos": "thanos",
    "busybox": "busybox",
    "nodeExporter": "node-exporter",
    "loki": "loki",
    "grafana": "grafana",
    "promtail": "promtail",
    "alloy": "alloy",
}
GPUFED_DEFAULT = f"${{GPUFED_IMAGE:-{images.ref('gpufed')}}}"


def _component(image: str) -> str:
    """The table component an image string names, or a failure naming the stray image."""
    if image == GPUFED_DEFAULT:
        return "gpufed"
    found = [name for name, pinned in images.IMAGES.items() if pinned.ref == image]
    assert found, f"{image} is not in federation/master/images.py (or its tag differs)"
    return found[0]


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import typer

    from federation.commands import render

    app = typer.Typer()
    render.register(app)
    out = tmp_path_factory.mktemp("render") / "current"
    result = CliRunner().invoke(app, ["render", "--spec", str(ROOT / "compose" / "federation.yaml"),
                                      "--out", str(out), "--target", "compose", "--no-check"])
    assert result.exit_code == 0, result.output
    return dict(yaml.safe_load((out / "compose" / "monitoring.yml").read_text())["services"])


def test_rendered_compose_pins_the_table(monitoring: dict[str, Any]) -> None:
    used = {name: _component(service["image"]) for name, service in monitoring.items()}
    # the spec has every section: each server image of the tier appears
    assert set(used.values()) == {"gpufed", "prometheus", "alertmanager", "thanos", "grafana", "consul",
                                  "postgres", "object-store", "loki"}
    assert used["minio"] == used["bucket-init"] == "object-store"
    assert not any("minio/minio" in s["image"] or "minio/mc" in s["image"] for s in monitoring.values())


def test_node_file_pins_the_table() -> None:
    node = yaml.safe_load((ROOT / "compose" / "node.yml").read_text())
    used = {name: _component(service["image"]) for name, service in node["services"].items()}
    assert used == {"gpufed-exporter": "gpufed", "node-exporter": "node-exporter", "alloy-config": "gpufed",
                    "alloy": "alloy", "promtail": "promtail"}
    example = (ROOT / "compose" / "node.env.example").read_text()
    assert f"GPUFED_IMAGE={images.ref('gpufed')}\n" in example


def normalised(ref: str) -> str:
    """A reference as Docker resolves it: no host part means docker.io, and a one-part
    Docker Hub name is under library/ (``busybox`` = ``docker.io/library/busybox``)."""
    first, _, rest = ref.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        ref = f"docker.io/{ref}"
    host, _, path = ref.partition("/")
    if host == "docker.io" and "/" not in path:
        ref = f"docker.io/library/{path}"
    return ref


def chart_ref(image: dict[str, str]) -> str:
    """The reference the chart's gpufed.imageRef helper builds from split values."""
    ref = f"{image['registry']}/{image['repository']}" if image.get("registry") else image["repository"]
    return ref + (f":{image['tag']}" if image.get("tag") else "") + (
        f"@{image['digest']}" if image.get("digest") else "")


def test_chart_values_pin_the_table() -> None:
    values = yaml.safe_load((ROOT / "helm" / "gpufed" / "values.yaml").read_text())
    assert set(values["images"]) == set(HELM_KEYS), "a chart image the table does not know"
    # split as kube-prometheus-stack does ({registry, repository, tag, digest})
    assert all(isinstance(values["images"][key], dict) for key in HELM_KEYS)
    assert {key: normalised(chart_ref(values["images"][key])) for key in HELM_KEYS} == {
        key: normalised(images.ref(component)) for key, component in HELM_KEYS.items()
    }
    assert normalised(chart_ref(values["image"])) == normalised(images.ref("gpufed"))


def test_normalised_follows_dockers_rule() -> None:
    assert normalised("busybox:1.36.1") == normalised("docker.io/library/busybox:1.36.1")
    assert normalised("grafana/loki:3.5.1") == "docker.io/grafana/loki:3.5.1"
    assert normalised("quay.io/thanos/thanos:v0.36.1") == "quay.io/thanos/thanos:v0.36.1"
    assert normalised("busybox:1.36.1") != normalised("quay.io/busybox:1.36.1")


def test_every_table_entry_is_used() -> None:
    text = "\n".join(
        p.read_text() for p in [ROOT / "compose" / "node.yml", ROOT / "helm" / "gpufed" / "values.yaml",
                                *sorted((ROOT / "federation" / "master").glob("compose*.py"))]
    )
    values = yaml.safe_load((ROOT / "helm" / "gpufed" / "values.yaml").read_text())
    chart = {normalised(chart_ref(image)) for image in [values["image"], *values["images"].values()]}
    unused = [name for name in images.IMAGES if f'"{name}"' not in text and images.ref(name) not in text
              and normalised(images.ref(name)) not in chart]
    assert not unused


def test_controller_image_tools_come_from_the_pinned_images() -> None:
    stages = dict(re.findall(r"^FROM (\S+) AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert {name: ref for ref, name in stages.items()} == {
        "prometheus": images.ref("prometheus"),
        "alertmanager": images.ref("alertmanager"),
    }


def test_default_spec_line_is_the_image_line() -> None:
    # The chart and compose render with the spec's default prometheus.version.
    assert PrometheusSpec().release().major == images.PROMETHEUS_IMAGE_LINE
    tag = images.IMAGES["prometheus"].tag
    assert prometheus_versions.parse_prometheus(tag).major == images.PROMETHEUS_IMAGE_LINE
