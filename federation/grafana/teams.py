"""Pure: one folder per team with its own copy of the GPU dashboards, variables pinned.

Teams are the inventory's ``team`` labels (and any extra the spec names); a team's regions
are those where it has nodes (plus the spec's). Each team gets a folder ``team-<name>``
holding the cluster, node, workload and quota dashboards with:

- ``team``: a hidden constant, and ``team="$team"`` added to every selector that already
  matches ``region=~"$region"`` (the GPU and ``up`` series carry the node's ``team``);
- ``region``: a custom variable listing only the team's regions, "All" = exactly those;
- ``namespace``: a custom variable listing only the team's namespaces, likewise;
- log links (panel and data links to Loki Explore) with ``team="<team>"`` in their selector.

Panels over region-wide recording rules (``gpufed:region_*``, ``gpufed:scheduler_*``) are
dropped: those series are aggregated over every team and carry no ``team`` label.

What Grafana cannot provision from files: teams, their members and folder permissions.
:func:`api_calls` renders them as the HTTP API requests to make once (``POST /api/teams``,
``POST /api/folders/<uid>/permissions``); Terraform users have ``grafana_team`` and
``grafana_folder_permission`` (grafana/terraform-provider-grafana). Pinning is navigation,
not isolation: a user who can query the datasource can query any team's series. Isolation
needs a datasource per team behind a label-enforcing proxy (prom-label-proxy), out of scope.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from federation.grafana.models import MAX_UID, TeamSpec
from logs.explore import scope_link
from sharder.model.inventory import Target

TEAM_DASHBOARDS = ("gpufed-cluster.json", "gpufed-node.json", "gpufed-workloads.json", "gpufed-quota.json")
TEAMLESS_PREFIXES = ("gpufed:region_", "gpufed:scheduler_")
REGION_MATCH = 'region=~"$region"'
TEAM_MATCH = 'team="$team"'
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^{}]*)\}")


def team_regions(
    targets: Iterable[Target], teams: Mapping[str, TeamSpec], *, all_regions: list[str]
) -> dict[str, list[str]]:
    """team -> its regions, in spec order: where it has nodes, plus what the spec adds."""
    found: dict[str, set[str]] = {name: set(spec.regions) for name, spec in teams.items()}
    for target in targets:
        if target.team:
            found.setdefault(target.team, set()).add(target.region)
    return {team: [r for r in all_regions if r in regions] for team, regions in sorted(found.items())}


def folder_uid(team: str) -> str:
    return f"team-{team}"


def _pin_expr(expr: str) -> str:
    def one(match: re.Match[str]) -> str:
        metric, body = match[1] or "", match[2]
        if REGION_MATCH not in body or TEAM_MATCH in body:
            return match[0]
        return f"{metric}{{{body.replace(REGION_MATCH, f'{REGION_MATCH}, {TEAM_MATCH}', 1)}}}"

    return _SELECTOR.sub(one, expr)


def _teamless(panel: dict[str, Any]) -> bool:
    return any(prefix in t["expr"] for t in panel.get("targets", []) for prefix in TEAMLESS_PREFIXES)


def _custom(variable: dict[str, Any], values: list[str]) -> dict[str, Any]:
    options = [{"text": v, "value": v, "selected": False} for v in values]
    return {
        "name": variable["name"],
        "label": variable["label"],
        "type": "custom",
        "query": ",".join(values),
        "options": options,
        "current": {"text": ["All"], "value": ["$__all"]},
        "multi": True,
        "includeAll": True,
        # "All" is these values and no others (an alternation, for =~ selectors); region and
        # namespace names hold only [a-z0-9-], no regex metacharacters
        "allValue": "|".join(values) if values else "^$",
        "hide": 0,
        "skipUrlSync": False,
    }


def pin_dashboard(
    model: dict[str, Any], *, team: str, regions: list[str], namespaces: list[str]
) -> dict[str, Any]:
    """A copy of one rendered dashboard scoped to ``team`` (see the module docstring)."""
    out = copy.deepcopy(model)
    out["uid"] = f"{model['uid']}-{team}"[:MAX_UID]
    out["title"] = f"{model['title']} · {team}"
    out["tags"] = [*model["tags"], folder_uid(team)]
    out["id"] = None
    for link in out.get("links", []):
        if link.get("type") == "dashboards":
            link["tags"] = [folder_uid(team)]
    variables: list[dict[str, Any]] = [
        {
            "name": "team",
            "label": "Team",
            "type": "constant",
            "query": team,
            "hide": 2,
            "current": {"text": team, "value": team},
            "options": [],
            "skipUrlSync": True,
        }
    ]
    for variable in out["templating"]["list"]:
        if variable["name"] == "region":
            variables.append(_custom(variable, regions))
        elif variable["name"] == "namespace":
            variables.append(_custom(variable, namespaces))
        else:
            if variable.get("type") == "query":
                variable["definition"] = _pin_expr(variable["definition"])
                variable["query"]["query"] = _pin_expr(variable["query"]["query"])
            variables.append(variable)
    out["templating"]["list"] = variables
    panels = []
    for panel in out["panels"]:
        if _teamless(panel):
            continue
        for target in panel.get("targets", []):
            target["expr"] = _pin_expr(target["expr"])
        # log links open the team's streams only (Promtail labels them with `team` too)
        data_links = panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
        for link in [*panel.get("links", []), *data_links]:
            if "/explore?" in link["url"]:
                link["url"] = scope_link(link["url"], {"team": team})
        panels.append(panel)
    out["panels"] = panels
    return out


def team_dashboards(
    dashboards: Mapping[str, bytes], *, regions: Mapping[str, list[str]], teams: Mapping[str, TeamSpec]
) -> dict[str, dict[str, dict[str, Any]]]:
    """team -> file name -> pinned dashboard, for the dashboards a team view makes sense of."""
    models = {name: json.loads(dashboards[name]) for name in TEAM_DASHBOARDS if name in dashboards}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for team, team_regions_ in regions.items():
        spec = teams.get(team, TeamSpec())
        out[team] = {
            name: pin_dashboard(model, team=team, regions=team_regions_, namespaces=list(spec.namespaces))
            for name, model in models.items()
        }
    return out


def providers(teams: Iterable[str], *, root: str) -> dict[str, Any]:
    """The dashboards provisioning file: the shared folder, then one folder per team.

    ``root`` may hold an env reference (``$GPUFED_GRAFANA_DIR``): Grafana expands them in
    provisioning files."""
    entries = [
        {
            "name": "gpufed",
            "type": "file",
            "folder": "gpufed",
            "folderUid": "gpufed",
            "disableDeletion": True,
            "allowUiUpdates": False,
            "options": {"path": f"{root}/dashboards/gpufed"},
        }
    ]
    for team in teams:
        entries.append(
            {
                "name": folder_uid(team),
                "type": "file",
                "folder": f"Team {team}",
                "folderUid": folder_uid(team),
                "disableDeletion": True,
                "allowUiUpdates": False,
                "options": {"path": f"{root}/dashboards/teams/{team}"},
            }
        )
    return {"apiVersion": 1, "providers": entries}


def api_calls(teams: Iterable[str]) -> list[dict[str, Any]]:
    """What files cannot provision, as requests to run once with an admin token: each team,
    and its folder's permissions (View for the team; Editor only through the API)."""
    calls: list[dict[str, Any]] = []
    for team in teams:
        calls.append(
            {
                "method": "POST",
                "path": "/api/teams",
                "body": {"name": team},
                "note": "returns the team's id; add members with POST /api/teams/<id>/members",
            }
        )
        calls.append(
            {
                "method": "POST",
                "path": f"/api/folders/{folder_uid(team)}/permissions",
                "body": {"items": [{"teamId": f"<id of team {team}>", "permission": 1}]},
                "note": "replaces the folder's permissions: View for the team; other roles lose access",
            }
        )
    return calls
