"""Grafana provisioning: golden files, strict parsing, team pinning, PromQL through promtool.

Regenerate the golden files with ``GPUFED_REGEN_GOLDEN=1 pytest tests/grafana_provisioning``.
Grafana cannot run here: datasources and providers are parsed against models of Grafana's
provisioning structs (``federation.grafana.formats``), and every query of the team
dashboards, with its variables filled in, goes through the real ``promtool check rules``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from federation.grafana import formats, teams
from federation.grafana.render import API_FILE, DATASOURCES_FILE, HA_FILE, PROVIDERS_FILE
from federation.master.pipeline import grafana_part, load_inputs
from sharder.kernel.output import Bundle

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "grafana-example"
REGEN = os.environ.get("GPUFED_REGEN_GOLDEN") == "1"
GOLDEN_FILES = (DATASOURCES_FILE, PROVIDERS_FILE, API_FILE, HA_FILE)


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    spec, targets = load_inputs(ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml")
    return grafana_part(spec, targets, None)  # type: ignore[arg-type]


def team_files(bundle: Bundle) -> dict[str, dict[str, Any]]:
    return {p: json.loads(b) for p, b in bundle.items() if p.startswith("grafana/dashboards/teams/")}


def test_golden(bundle: Bundle) -> None:
    if REGEN:
        for rel in GOLDEN_FILES:
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_bytes(bundle[rel])
    for rel in GOLDEN_FILES:
        assert (GOLDEN / rel).read_bytes() == bundle[rel], f"{rel} differs; see the module docstring"


def test_datasources_link_metrics_and_logs_both_ways(bundle: Bundle) -> None:
    parsed = formats.parse_datasources(yaml.safe_load(bundle[DATASOURCES_FILE]))
    by_uid = {d.uid: d for d in parsed.datasources}
    assert set(by_uid) == {"gpufed", "loki"} and by_uid["gpufed"].isDefault
    link = by_uid["gpufed"].correlations[0]
    assert (link.targetUID, link.config.field, link.config.target["expr"]) == (
        "loki",
        "node",
        '{node="${node}"}',
    )
    derived = by_uid["loki"].jsonData["derivedFields"][0]
    assert (derived["matcherType"], derived["matcherRegex"], derived["datasourceUid"]) == (
        "label",
        "node",
        "gpufed",
    )
    assert 'node="${__value.raw}"' in derived["url"]


def test_one_folder_per_team_from_the_inventory(bundle: Bundle) -> None:
    providers = formats.parse_providers(yaml.safe_load(bundle[PROVIDERS_FILE])).providers
    _, targets = load_inputs(ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml")
    inventory_teams = sorted({t.team for t in targets if t.team})
    assert [p.folderUid for p in providers] == ["gpufed", *(f"team-{t}" for t in inventory_teams)]
    for provider in providers[1:]:
        team = provider.folderUid.removeprefix("team-")
        assert provider.options.path == f"$GPUFED_GRAFANA_DIR/dashboards/teams/{team}"
        names = {p.rsplit("/", 1)[1] for p in bundle if p.startswith(f"grafana/dashboards/teams/{team}/")}
        assert names == set(teams.TEAM_DASHBOARDS)
    calls = json.loads(bundle[API_FILE])["calls"]
    assert [c["path"] for c in calls if c["path"].startswith("/api/folders/")] == [
        f"/api/folders/team-{t}/permissions" for t in inventory_teams
    ]


def test_team_dashboards_are_pinned(bundle: Bundle) -> None:
    spec, targets = load_inputs(ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml")
    assert spec.grafana is not None
    uids = []
    for path, model in team_files(bundle).items():
        team = path.split("/")[3]
        formats.check_dashboard(model, source=path)
        uids.append(model["uid"])
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["team"] == {**variables["team"], "type": "constant", "query": team, "hide": 2}
        regions = sorted({t.region for t in targets if t.team == team})
        if "region" in variables:
            assert variables["region"]["type"] == "custom"
            assert sorted(o["value"] for o in variables["region"]["options"]) == regions
            assert sorted(variables["region"]["allValue"].split("|")) == regions
        if "namespace" in variables:
            wanted = spec.grafana.teams[team].namespaces if team in spec.grafana.teams else []
            assert [o["value"] for o in variables["namespace"]["options"]] == wanted
        for panel in model["panels"]:
            data_links = panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
            for link in [*panel.get("links", []), *data_links]:
                url = re.sub(r"\$\{[^}]+\}", "x", link["url"])  # Grafana's placeholders, filled
                (pane,) = json.loads(parse_qs(urlsplit(url).query)["panes"][0]).values()
                assert pane["queries"][0]["expr"].startswith(f'{{team="{team}", '), (path, link["title"])
            for target in panel.get("targets", []):
                assert "gpufed:region_" not in target["expr"]
                for body in re.findall(r"\{([^{}]*)\}", target["expr"]):
                    if 'region=~"$region"' in body:
                        assert 'team="$team"' in body, (path, target["expr"])
    assert len(uids) == len(set(uids)) and all(len(u) <= 40 for u in uids)


def _fill(expr: str) -> str:
    """Variables as Grafana would substitute them, so promtool can parse the query."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?([A-Za-z_]\w*)(?::\w+)?\}?", "x", expr)


def test_every_team_query_parses_with_promtool(bundle: Bundle, promtool: str, tmp_path: Path) -> None:
    rules = []
    for model in (m for _, m in sorted(team_files(bundle).items())):
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                rules.append({"record": f"check:q{len(rules)}", "expr": _fill(target["expr"])})
        for variable in model["templating"]["list"]:
            if variable.get("type") == "query" and variable["definition"].startswith("label_values("):
                selector = variable["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
                rules.append({"record": f"check:q{len(rules)}", "expr": _fill(selector)})
    assert len(rules) > 100
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "team-queries", "rules": rules}]})
    )
    done = subprocess.run(
        [promtool, "check", "rules", "rules.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ha_replicas_share_one_database(bundle: Bundle) -> None:
    ha = json.loads(bundle[HA_FILE])
    envs = [r["env"] for r in ha["replicas"].values()]
    assert len(envs) == 2 and [r["host"] for r in ha["replicas"].values()] == ["grafana", "grafana-1"]
    assert all(e["GF_DATABASE_TYPE"] == "postgres" and e["GF_DATABASE_HOST"] == "postgres:5432" for e in envs)
    assert all(e["GF_DATABASE_PASSWORD"] == "${GRAFANA_DB_PASSWORD}" for e in envs)
    assert all(e["GF_UNIFIED_ALERTING_ENABLED"] == "false" for e in envs)


def test_unified_alerting_gossips_between_replicas() -> None:
    from federation.grafana.ha import ha_document
    from federation.grafana.models import HASpec

    ha = ha_document(
        HASpec.model_validate(
            {"replicas": 3, "alerting": "unified", "database": {"password": {"file": "/run/secrets/db"}}}
        )
    )
    envs = [r["env"] for r in ha["replicas"].values()]
    assert {e["GF_UNIFIED_ALERTING_HA_PEERS"] for e in envs} == {"grafana:9094,grafana-1:9094,grafana-2:9094"}
    assert [e["GF_UNIFIED_ALERTING_HA_ADVERTISE_ADDRESS"] for e in envs] == [
        "grafana:9094",
        "grafana-1:9094",
        "grafana-2:9094",
    ]
    assert all(
        e["GF_DATABASE_PASSWORD__FILE"] == "/run/secrets/db" and "GF_DATABASE_PASSWORD" not in e for e in envs
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["datasources"][0].update(isDefualt=True), "Extra inputs"),
        (lambda d: d["datasources"][0]["correlations"][0]["config"].update(type="external"), "query"),
        (lambda d: d["datasources"][0]["correlations"][0].update(targetUID="tempo"), "unknown datasource"),
        (lambda d: d["datasources"][1]["jsonData"]["derivedFields"][0].update(matcherType="labels"), "label"),
    ],
)
def test_datasource_model_refuses_bad_files(bundle: Bundle, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load(bundle[DATASOURCES_FILE])
    mutate(data)
    with pytest.raises((formats.GrafanaFormatError, ValueError), match=message):
        formats.parse_datasources(data)


def test_provider_model_refuses_misspelt_folder_uid(bundle: Bundle) -> None:
    data = yaml.safe_load(bundle[PROVIDERS_FILE])
    data["providers"][1]["folderUID"] = data["providers"][1].pop("folderUid")
    with pytest.raises(formats.GrafanaFormatError, match="folderUID"):
        formats.parse_providers(data)


def test_a_loki_tenant_is_sent_as_x_scope_orgid() -> None:
    from federation.grafana.datasources import datasources_file

    data = datasources_file(prometheus_url="http://p", loki_url="http://l", loki_tenant="gpu-dc1")
    loki = {d.uid: d for d in formats.parse_datasources(data).datasources}["loki"]
    assert loki.jsonData["httpHeaderName1"] == "X-Scope-OrgID"
    assert loki.secureJsonData == {"httpHeaderValue1": "gpu-dc1"}
    bare = {d["uid"]: d for d in datasources_file(prometheus_url=None, loki_url="http://l")["datasources"]}
    assert list(bare) == ["loki"] and "derivedFields" not in bare["loki"]["jsonData"]
