"""The ``grafana:`` section of federation.yaml: typed, validated, nothing rendered here.

    grafana:
      url: https://grafana.example.com     # what links (DingTalk, dashboards) open
      teams:                               # teams come from the inventory's `team` labels;
        llm: {namespaces: [llm-train, llm-serve]}   # this adds their Kubernetes namespaces
      ha:
        replicas: 2
        database: {host: postgres:5432, password: {env: GRAFANA_DB_PASSWORD}}
        alerting: alertmanager             # or unified: Grafana's own alerting, HA peers gossip

Team names become folder uids and dashboard uid suffixes, so they are lower-case names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sharder.kernel.models import NAME_RE, StrictModel
from thanos.objstore import SecretRef

#: Grafana's dashboard and folder uids are at most 40 characters.
MAX_UID = 40


class TeamSpec(StrictModel):
    namespaces: list[str] = Field(default_factory=list, description="Kubernetes namespaces the team owns")
    regions: list[str] = Field(
        default_factory=list, description="extra regions; those where the team has nodes are added"
    )


class DatabaseSpec(StrictModel):
    type: Literal["postgres"] = "postgres"
    host: str = Field(default="postgres:5432", description="host:port")
    name: str = "grafana"
    user: str = "grafana"
    password: SecretRef
    ssl_mode: Literal["disable", "require", "verify-full"] = "disable"
    bundled: bool = Field(default=True, description="compose: run a postgres service at `host`")


class HASpec(StrictModel):
    replicas: int = Field(default=2, ge=2, le=5)
    database: DatabaseSpec
    alerting: Literal["alertmanager", "unified"] = Field(
        default="alertmanager",
        description="alertmanager: Grafana alerting off, gpufed's Alertmanager pages;"
        " unified: Grafana alerting on, its replicas gossip (ha_peers)",
    )
    alerting_port: int = Field(default=9094, ge=1, le=65535)


class GrafanaSpec(StrictModel):
    url: str = Field(default="http://grafana:3000", description="Grafana's external URL (links)")
    prometheus_url: str | None = Field(default=None, description="default: Thanos Query, else the master")
    loki_url: str | None = Field(default=None, description="default: logs.loki")
    teams: dict[str, TeamSpec] = Field(default_factory=dict)
    ha: HASpec | None = None

    @field_validator("teams")
    @classmethod
    def _team_names(cls, teams: dict[str, TeamSpec]) -> dict[str, TeamSpec]:
        for name in teams:
            if not NAME_RE.match(name) or len(name) > 24:
                raise ValueError(f"team {name!r}: lower-case letters, digits and '-', at most 24 characters")
        return teams

    @model_validator(mode="after")
    def _url(self) -> GrafanaSpec:
        for field in ("url", "prometheus_url", "loki_url"):
            value = getattr(self, field)
            if value is not None and not value.startswith(("http://", "https://")):
                raise ValueError(f"grafana.{field} must be an http(s) URL, got {value!r}")
        return self
