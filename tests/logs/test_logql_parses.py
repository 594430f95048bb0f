"""Every LogQL query gpufed renders goes through Grafana Labs' own LogQL grammar.

``@grafana/lezer-logql`` (the parser Grafana's Loki query editor uses) is installed by
scripts/bootstrap.sh from scripts/logql/package-lock.json; ``node`` runs
scripts/logql/check.cjs on the queries. It checks syntax, not semantics: Loki itself also
refuses a selector whose matchers all match the empty string, which ``logs.formats
.check_selector`` checks. A broken query is refused here too, so the check can fail.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from federation.dashboards import DASHBOARDS_DIR
from federation.grafana.render import DATASOURCES_FILE
from federation.master.pipeline import grafana_part, load_inputs, logs_part
from logs import explore, promtail, rules

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "logql" / "check.cjs"
FILLED = {
    "${__from}": "1",
    "${__to}": "2",
    "${__field.labels.node}": "bj-r00-n007",
    "${node}": "bj-r00-n007",
    "${region:percentencode}": "cn-beijing%7Ccn-shanghai",
    "${node:percentencode}": ".%2A",
}


def parse(queries: list[str]) -> list[dict[str, object]]:
    from conftest import require_tool

    node = require_tool("node")
    if not (CHECK.parent / "node_modules" / "@grafana" / "lezer-logql").is_dir():
        pytest.fail("scripts/logql/node_modules is missing: run scripts/bootstrap.sh (npm ci)")
    done = subprocess.run(
        [node, str(CHECK)],
        input=json.dumps(queries),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=CHECK.parent,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def _pane_query(url: str) -> str:
    for placeholder, value in FILLED.items():
        url = url.replace(placeholder, value)
    (pane,) = json.loads(parse_qs(urlsplit(url).query)["panes"][0]).values()
    return str(pane["queries"][0]["expr"])


def rendered_queries() -> dict[str, str]:
    spec, targets = load_inputs(ROOT / "examples" / "federation.yaml", ROOT / "examples" / "inventory.yaml")
    assert spec.logs is not None
    bundle = logs_part(spec, targets, None)  # type: ignore[arg-type]
    queries: dict[str, str] = {}
    for group in yaml.safe_load(bundle[rules.rules_file(spec.logs)])["groups"]:
        for rule in group["rules"]:
            queries[f"ruler {rule.get('record') or rule.get('alert')}"] = rule["expr"]
    for job in yaml.safe_load(bundle[promtail.CONFIG_FILE])["scrape_configs"]:
        for i, stage in enumerate(job.get("pipeline_stages", [])):
            if "match" in stage:
                queries[f"promtail {job['job_name']} match {i}"] = stage["match"]["selector"]
    grafana = yaml.safe_load(grafana_part(spec, targets, None)[DATASOURCES_FILE])  # type: ignore[arg-type]
    for source in grafana["datasources"]:
        for link in source.get("correlations", []):
            queries[f"correlation {source['uid']}"] = link["config"]["target"]["expr"].replace(
                "${node}", "n1"
            )
    queries["relay one GPU"] = explore.nodes_query(["bj-r00-n007"], pci_bus_id="00000000:3B:00.0")
    queries["relay nodes"] = explore.nodes_query(["bj-r00-n007", "gpu.node-2"])
    for uid in ("gpufed-cluster", "gpufed-node"):
        model = json.loads((DASHBOARDS_DIR / f"{uid}.json").read_text())
        panel = next(p for p in model["panels"] if p["type"] != "row")
        queries[f"{uid} panel link"] = _pane_query(panel["links"][0]["url"])
        linked = [p for p in model["panels"] if p.get("fieldConfig", {}).get("defaults", {}).get("links")]
        queries[f"{uid} data link"] = _pane_query(linked[0]["fieldConfig"]["defaults"]["links"][0]["url"])
    return queries


def test_every_rendered_logql_query_parses() -> None:
    queries = rendered_queries()
    assert len(queries) >= 10
    results = parse(list(queries.values()))
    bad = {name: r for name, r in zip(queries, results, strict=True) if r["errors"]}
    assert not bad, bad


@pytest.mark.parametrize(
    "broken",
    ['{node="a" |= ', 'sum by (node (count_over_time({a="b"}[5m]))', 'count_over_time({a="b"} |= "x" [5m'],
)
def test_the_grammar_refuses_broken_queries(broken: str) -> None:
    assert parse([broken])[0]["errors"]
