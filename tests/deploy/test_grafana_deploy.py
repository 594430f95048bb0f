"""Grafana as deployed: HA replicas on one PostgreSQL in compose and in the chart, provisioned
from the controller's render of the spec's ``grafana:`` section.

Grafana does not run here: compose files are checked by Compose v2 ``config``, the chart by
the Helm v4 SDK (``test_helm.py`` validates every object with kubernetes-validate --strict),
and the chart's sync script runs under the real ``sh`` and ``wget`` against a loopback
server answering as the controller's ``/v1/configs`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, require_tool
from test_logs_deploy import LOGS_VALUES, _chart_objects, _named, compose, monitoring, rendered  # noqa: F401

from federation.grafana import formats
from federation.grafana.render import DATASOURCES_FILE, PROVIDERS_FILE
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer
from federation.master.pipeline import grafana_part
from federation.spec import load_gpufed_spec


def test_compose_runs_two_grafanas_on_one_postgres(rendered: Path, monitoring: dict[str, Any]) -> None:  # noqa: F811
    services = monitoring["services"]
    replicas = [services["grafana"], services["grafana-1"]]
    db_keys = (
        "GF_DATABASE_TYPE",
        "GF_DATABASE_HOST",
        "GF_DATABASE_NAME",
        "GF_DATABASE_USER",
        "GF_DATABASE_PASSWORD",
    )
    envs = [{k: r["environment"][k] for k in db_keys} for r in replicas]
    assert envs[0] == envs[1] and envs[0]["GF_DATABASE_HOST"] == "postgres:5432"
    postgres = services["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD"] == envs[0]["GF_DATABASE_PASSWORD"]
    assert all(r["depends_on"]["postgres"]["condition"] == "service_healthy" for r in replicas)
    assert {v["source"] for r in replicas for v in r["volumes"] if v["type"] == "volume"} == {
        "grafana-data",
        "grafana-data-1",
    }
    published = sorted(int(p["published"]) for r in replicas for p in r["ports"])
    assert published == [3000, 3001]
    # both provision from the rendered grafana/ tree: providers' $GPUFED_GRAFANA_DIR resolves into it
    for replica in replicas:
        env = replica["environment"]
        tree = rendered.parent / env["GPUFED_GRAFANA_DIR"].removeprefix("/gpufed/")
        providers = formats.parse_providers(
            yaml.safe_load((tree / "provisioning/dashboards/gpufed.yml").read_text())
        )
        for provider in providers.providers:
            folder = Path(provider.options.path.replace("$GPUFED_GRAFANA_DIR", str(tree)))
            assert list(folder.glob("*.json")), provider.name
        assert env["GF_PATHS_PROVISIONING"] == f"{env['GPUFED_GRAFANA_DIR']}/provisioning"
        assert env["GF_UNIFIED_ALERTING_ENABLED"] == "false"
    example = (rendered / "compose" / ".env.example").read_text()
    assert "\nGRAFANA_DB_PASSWORD=\n" in example.split("# Optional")[0]


def test_chart_grafana_ha_reads_the_controllers_render(tmp_path: Path) -> None:
    objects = _chart_objects(yaml.safe_load(LOGS_VALUES.read_text()))
    deployment = _named(objects, "Deployment", "gpufed-grafana")
    assert deployment["spec"]["replicas"] == 2
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GF_DATABASE_HOST"]["value"] == "grafana-db.monitoring.svc:5432"
    assert env["GF_DATABASE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "grafana-db",
        "key": "password",
    }
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(_named(objects, "ConfigMap", "gpufed-spec")["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    bundle = grafana_part(spec, [], None)  # type: ignore[arg-type]
    sources = formats.parse_datasources(yaml.safe_load(bundle[DATASOURCES_FILE])).datasources
    urls = {s.uid: s.url for s in sources}
    assert urls == {
        "gpufed": "http://gpufed-thanos-query.monitoring.svc:10904",
        "loki": "http://gpufed-loki-read.monitoring.svc:3100",
    }
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert {"gpufed-thanos-query", "gpufed-loki-read"} <= names
    assert env["GPUFED_GRAFANA_DIR"]["value"] + "/provisioning" == env["GF_PATHS_PROVISIONING"]["value"]


def test_chart_refuses_grafana_ha_without_a_database() -> None:
    import helm_python as helm

    values = yaml.safe_load(LOGS_VALUES.read_text())
    values["grafana"]["server"]["database"]["host"] = ""
    with pytest.raises(helm.HelmError, match="share one PostgreSQL"):
        _chart_objects(values)


@pytest.mark.parametrize(("separators", "prefix"), [((",", ":"), "grafana/"), ((", ", ": "), "logs/")])
def test_tree_sync_script_copies_every_file_under_its_prefix(
    tmp_path: Path, separators: tuple[str, str], prefix: str
) -> None:
    """The chart's init script, run by the real sh + wget, against /v1/configs's answer shape."""
    from federation.master.pipeline import logs_part

    spec = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    parts = {"grafana/": grafana_part(spec, [], None), "logs/": logs_part(spec, [], None)}  # type: ignore[arg-type]
    bundle = parts[prefix]
    published = {**parts["grafana/"], **parts["logs/"], "master/prometheus.yml": b"global: {}\n"}
    listing = json.dumps(
        {"files": [{"path": p, "bytes": len(b)} for p, b in sorted(published.items())], "status": {}},
        separators=separators,
    ).encode()

    class Controller(LoopbackHandler):
        def do_GET(self) -> None:
            path = self.path.removeprefix("/v1/configs").lstrip("/")
            body = listing if not path else published.get(path)
            self.reply(200 if body is not None else 404, body or b"")

    server = LoopbackHTTPServer(Controller).start()
    objects = _chart_objects(yaml.safe_load(LOGS_VALUES.read_text()))
    script = tmp_path / "tree-sync.sh"
    script.write_text(_named(objects, "ConfigMap", "gpufed-tree-sync")["data"]["tree-sync.sh"])
    try:
        done = subprocess.run(
            [require_tool("sh"), str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={
                "PATH": os.environ["PATH"],
                "GPUFED_URL": server.url,
                "CONFIG_DIR": str(tmp_path / "config"),
                "RETRIES": "1",
                "PREFIX": prefix,
            },
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    copied = {
        p.relative_to(tmp_path / "config").as_posix(): p.read_bytes()
        for p in (tmp_path / "config").rglob("*")
        if p.is_file()
    }
    assert copied == bundle and (PROVIDERS_FILE in copied or "logs/rules/fake/gpufed-xid.yml" in copied)


def test_chart_sidecar_datasources_link_logs_like_the_renderer() -> None:
    """The sidecar ConfigMap (Grafana run elsewhere) carries the same links as gpufed's render."""
    from federation.grafana import datasources

    objects = _chart_objects(yaml.safe_load(LOGS_VALUES.read_text()))
    data = yaml.safe_load(_named(objects, "ConfigMap", "gpufed-datasource")["data"]["gpufed-datasource.yaml"])
    parsed = formats.parse_datasources(data, source="gpufed-datasource.yaml")
    by_uid = {d.uid: d for d in parsed.datasources}
    ours = datasources.datasources_file(prometheus_url="http://p", loki_url="http://l")["datasources"]
    assert [c.model_dump(exclude_defaults=True) for c in by_uid["gpufed"].correlations] == [
        {k: v for k, v in ours[0]["correlations"][0].items() if k != "description"}
    ]
    assert by_uid["loki"].jsonData["derivedFields"] == ours[1]["jsonData"]["derivedFields"]
    assert by_uid["loki"].url == "http://gpufed-loki-read.monitoring.svc:3100"
