"""Grafana never runs on admin/admin (issue #39 item 6): without ``grafana.server.adminSecret``
the chart generates ``<release>-grafana-admin`` once (kept across upgrades and uninstall)
and NOTES.txt says how to read it; with one, Grafana reads that Secret."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import yaml
from test_helm import CHART, RELEASE, find, render, values

GRAFANA = CHART / "ci" / "logs-values.yaml"  # Grafana run by the chart, with adminSecret: grafana-admin


def without_admin_secret() -> dict[str, Any]:
    given = values(GRAFANA)
    given["grafana"]["server"]["adminSecret"] = ""
    return given


def admin_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment", "-grafana")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "grafana"]
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
            if e["name"].startswith("GF_SECURITY_ADMIN_")}


def test_a_generated_admin_secret_is_kept_and_read() -> None:
    objects = render(helm.Chart.load(CHART), without_admin_secret())
    secret = find(objects, "Secret", "-grafana-admin")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    password = secret["stringData"]["admin-password"]
    assert len(password) == 32 and password != "admin" and secret["stringData"]["admin-user"] == "admin"
    assert admin_env(objects) == {
        "GF_SECURITY_ADMIN_USER": {"name": "gpufed-grafana-admin", "key": "admin-user"},
        "GF_SECURITY_ADMIN_PASSWORD": {"name": "gpufed-grafana-admin", "key": "admin-password"},
    }
    notes = helm.Chart.load(CHART).render(without_admin_secret(), **RELEASE)["gpufed/templates/NOTES.txt"]
    assert "get secret gpufed-grafana-admin -o jsonpath='{.data.admin-password}' | base64 -d" in notes


def test_a_given_admin_secret_is_used_and_none_generated() -> None:
    objects = render(helm.Chart.load(CHART), values(GRAFANA))
    secrets = [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"]
    assert not [name for name in secrets if name.endswith("-grafana-admin")]
    assert {ref["name"] for ref in admin_env(objects).values()} == {"grafana-admin"}


def test_values_document_no_default_admin() -> None:
    text = (CHART / "values.yaml").read_text()
    assert "Grafana's default admin" not in text
    assert yaml.safe_load(text)["grafana"]["server"]["adminSecret"] == ""
