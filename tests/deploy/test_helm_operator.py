"""kube-prometheus-stack conventions (issue #39 item 3): monitors and rules its default
selectors pick, a PodMonitor, one registry override and split image values.

kube-prometheus-stack's Prometheus CR (templates/prometheus/prometheus.yaml) selects with
``matchLabels: {release: <its release name>}`` while ``*SelectorNilUsesHelmValues`` is true,
its default, for ServiceMonitors, PodMonitors and PrometheusRules alike.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
from test_helm import CHART, RELEASE, render

TOKEN = {"controller": {"token": {"value": "a-token-0123456789abcdef"}}}
KPS_DEFAULT_SELECTOR = {"matchLabels": {"release": "kps"}}  # helm install kps kube-prometheus-stack


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def test_kps_default_selectors_pick_the_monitor_and_the_rules(chart: helm.Chart) -> None:
    kps = {"additionalLabels": {"release": "kps"}}
    objects = render(chart, {**TOKEN, "serviceMonitor": {"enabled": True, **kps},
                             "prometheusRule": {"enabled": True, **kps}})
    (monitor,) = of_kind(objects, "ServiceMonitor")
    (rule,) = of_kind(objects, "PrometheusRule")
    assert selects(KPS_DEFAULT_SELECTOR, monitor["metadata"]["labels"])
    assert selects(KPS_DEFAULT_SELECTOR, rule["metadata"]["labels"])
    # and the monitor finds the chart's HTTP Services (the controller's among them)
    services = [s for s in of_kind(objects, "Service")
                if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
                and any(p["name"] == "http" for p in s["spec"]["ports"])]
    assert any(s["metadata"]["name"].endswith("-controller") for s in services)


def test_without_the_label_kps_would_not_pick_them(chart: helm.Chart) -> None:
    objects = render(chart, {**TOKEN, "serviceMonitor": {"enabled": True}})
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert not selects(KPS_DEFAULT_SELECTOR, monitor["metadata"]["labels"])


def test_pod_monitor_selects_pods_serving_http(chart: helm.Chart) -> None:
    pod_monitor = {"enabled": True, "additionalLabels": {"release": "kps"}}
    objects = render(chart, {**TOKEN, "podMonitor": pod_monitor})
    (monitor,) = of_kind(objects, "PodMonitor")
    assert selects(KPS_DEFAULT_SELECTOR, monitor["metadata"]["labels"])
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    pods = [w["spec"]["template"] for w in objects if w["kind"] in ("Deployment", "StatefulSet")]
    serving = [p for p in pods if selects(monitor["spec"]["selector"], p["metadata"]["labels"])
               and any(port["name"] == "http"
                       for c in p["spec"]["containers"] for port in c.get("ports", []))]
    assert len(serving) >= 3  # controller, children, master


def images_of(objects: list[dict[str, Any]]) -> set[str]:
    found = set()
    for obj in objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec") or obj.get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            found.add(container["image"])
    return found


def test_global_image_registry_moves_every_image(chart: helm.Chart) -> None:
    objects = render(chart, {**TOKEN, "global": {"imageRegistry": "mirror.example.com:5000"}})
    found = images_of(objects)
    assert len(found) >= 4 and all(i.startswith("mirror.example.com:5000/") for i in found), found


def test_digest_pins_and_the_old_string_form_still_works(chart: helm.Chart) -> None:
    digest = "sha256:" + "a" * 64
    objects = render(chart, {**TOKEN, "images": {"prometheus": {"digest": digest},
                                                 "busybox": "registry.example.com/busybox:1.36.1"},
                             "image": {"repository": "registry.example.com/infra/gpufed"}})
    found = images_of(objects)
    assert f"quay.io/prometheus/prometheus:v3.13.3@{digest}" in found
    assert "registry.example.com/busybox:1.36.1" in found
    assert "registry.example.com/infra/gpufed:0.1.0" in found  # a repository naming its host


def test_schema_refuses_a_bad_digest(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="digest"):
        chart.render({**TOKEN, "images": {"thanos": {"repository": "thanos/thanos", "digest": "sha256:zz"}}},
                     **RELEASE)
