"""The ``grafana/`` bundle: datasources, dashboard providers, team folders, HA, API calls.

Pipeline position: ``federation.master.pipeline.grafana_part``::

    grafana/provisioning/datasources/gpufed.yml   Prometheus + Loki, correlated by node
    grafana/provisioning/dashboards/gpufed.yml    the shared folder, then one per team
    grafana/dashboards/gpufed/*.json              the shared dashboards (federation/dashboards)
    grafana/dashboards/teams/<team>/*.json        pinned copies (federation.grafana.teams)
    grafana/api-calls.json                        what files cannot provision (teams, permissions)
    grafana/ha.json                               replicas and their GF_* environment (HA only)

Provider paths start with ``$GPUFED_GRAFANA_DIR`` (Grafana expands environment variables
in provisioning files): compose and the chart set it to where this directory is mounted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping

import yaml

from federation.grafana import datasources, ha, teams
from federation.grafana.models import GrafanaSpec
from sharder.kernel.output import Bundle, dump_json, dump_yaml
from sharder.model.inventory import Target

ROOT_ENV = "$GPUFED_GRAFANA_DIR"
DATASOURCES_FILE = "grafana/provisioning/datasources/gpufed.yml"
PROVIDERS_FILE = "grafana/provisioning/dashboards/gpufed.yml"
HA_FILE = "grafana/ha.json"
API_FILE = "grafana/api-calls.json"


def _dump(model: dict[str, object]) -> bytes:
    return (json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def render_grafana_bundle(
    grafana: GrafanaSpec,
    *,
    targets: Iterable[Target],
    regions: list[str],
    dashboards: Mapping[str, bytes],
    prometheus_url: str | None,
    loki_url: str | None,
    loki_tenant: str = "",
) -> Bundle:
    """The files depend on the targets only through team -> regions, so once that is known
    the rest is memoised: the controller re-renders on every change of the fleet, and a
    node joining a team's known region changes none of these files."""
    by_team = teams.team_regions(targets, grafana.teams, all_regions=regions)
    return dict(
        _render(
            grafana.model_dump_json(),
            tuple((team, tuple(rs)) for team, rs in by_team.items()),
            tuple(sorted(dashboards.items())),
            grafana.prometheus_url or prometheus_url,
            grafana.loki_url or loki_url,
            loki_tenant,
        )
    )


@functools.lru_cache(maxsize=4)
def _render(
    grafana_json: str,
    by_team_key: tuple[tuple[str, tuple[str, ...]], ...],
    dashboards_key: tuple[tuple[str, bytes], ...],
    prometheus_url: str | None,
    loki_url: str | None,
    loki_tenant: str,
) -> tuple[tuple[str, bytes], ...]:
    grafana = GrafanaSpec.model_validate_json(grafana_json)
    by_team = {team: list(rs) for team, rs in by_team_key}
    dashboards = dict(dashboards_key)
    bundle: Bundle = {
        DATASOURCES_FILE: dump_yaml(
            datasources.datasources_file(
                prometheus_url=prometheus_url, loki_url=loki_url, loki_tenant=loki_tenant
            )
        ),
        PROVIDERS_FILE: dump_yaml(teams.providers(by_team, root=ROOT_ENV)),
        API_FILE: dump_json({"calls": teams.api_calls(by_team)}),
    }
    for name, body in sorted(dashboards.items()):
        bundle[f"grafana/dashboards/gpufed/{name}"] = body
    pinned = teams.team_dashboards(dashboards, regions=by_team, teams=grafana.teams)
    for team, files in pinned.items():
        for name, model in files.items():
            bundle[f"grafana/dashboards/teams/{team}/{name}"] = _dump(model)
    if grafana.ha is not None:
        bundle[HA_FILE] = dump_json(ha.ha_document(grafana.ha))
    return tuple(bundle.items())


def relay_with_grafana(relay_file: bytes, grafana_url: str) -> bytes:
    """The relay's config with ``grafana_url`` set (unless the file already names one), so its
    messages link to Grafana and to the Explore view of the alerts' nodes' logs."""
    config = yaml.safe_load(relay_file)
    config.setdefault("grafana_url", grafana_url)
    return dump_yaml(config)
