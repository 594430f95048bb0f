"""Grafana's provisioning files as strict models, and the checks a pinned dashboard gets.

No Grafana runs here; rendered files are parsed against models of Grafana's provisioning
structs instead, unknown keys refused (Grafana itself ignores them, which is how a
misspelt ``folderUid`` silently lands dashboards in General):

- datasources: grafana/grafana pkg/services/provisioning/datasources/types.go@01c83423
  (``upsertDataSourceFromConfigV1``), correlations: pkg/services/correlations/models.go@02083e2a
  (``CorrelationConfig``: ``type`` query only, ``field``, ``target``, ``transformations``),
  Loki derived fields: public/app/plugins/datasource/loki/types.ts (``DerivedFieldConfig``)
- dashboard providers: pkg/services/provisioning/dashboards/types.go@06aca5e8
  (``DashboardProviderConfigs``; ``folderUid``, ``allowUiUpdates`` and
  ``updateIntervalSeconds`` were added later, per Grafana's provisioning docs)

A dashboard is checked for what breaks one silently: every ``$variable`` a query or a
variable uses is defined, uids fit Grafana's 40 characters, panel ids are unique.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sharder.kernel.models import field_path


class GrafanaFormatError(ValueError):
    def __init__(self, message: str, *, field: str = "", source: str = "") -> None:
        self.field, self.source = field, source
        where = " ".join(
            p for p in (f"{source}:" if source else "", f"field '{field}'" if field else "") if p
        )
        super().__init__(f"{where} {message}".strip())


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CorrelationTransformation(_Strict):
    type: Literal["regex", "logfmt"]
    expression: str = ""
    field: str = ""
    mapValue: str = ""


class CorrelationConfig(_Strict):
    type: Literal["query"]
    field: str = Field(min_length=1)
    target: dict[str, Any]
    transformations: list[CorrelationTransformation] = Field(default_factory=list)


class Correlation(_Strict):
    targetUID: str = Field(min_length=1)
    label: str = ""
    description: str = ""
    config: CorrelationConfig


class DerivedField(_Strict):
    name: str = Field(min_length=1)
    matcherRegex: str = Field(min_length=1)
    matcherType: Literal["regex", "label"] = "regex"
    url: str = ""
    urlDisplayLabel: str = ""
    datasourceUid: str = ""
    targetBlank: bool = False


class Datasource(_Strict):
    orgId: int = 1
    orgName: str = ""
    version: int = 0
    name: str = Field(min_length=1)
    type: str = Field(min_length=1)
    access: Literal["proxy", "direct"] = "proxy"
    url: str = ""
    user: str = ""
    database: str = ""
    basicAuth: bool = False
    basicAuthUser: str = ""
    withCredentials: bool = False
    isDefault: bool = False
    correlations: list[Correlation] = Field(default_factory=list)
    jsonData: dict[str, Any] = Field(default_factory=dict)
    secureJsonData: dict[str, str] = Field(default_factory=dict)
    editable: bool = False
    uid: str = Field(default="", max_length=40)

    @model_validator(mode="after")
    def _derived(self) -> Datasource:
        for field in self.jsonData.get("derivedFields", []):
            DerivedField.model_validate(field)
        return self


class DatasourcesFile(_Strict):
    apiVersion: Literal[1]
    datasources: list[Datasource] = Field(default_factory=list)
    deleteDatasources: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _links(self) -> DatasourcesFile:
        uids = {d.uid for d in self.datasources}
        if sum(d.isDefault for d in self.datasources) > 1:
            raise ValueError("more than one datasource is the default")
        for source in self.datasources:
            for link in source.correlations:
                if link.targetUID not in uids:
                    raise ValueError(f"{source.uid}: correlation to unknown datasource {link.targetUID!r}")
            for field in source.jsonData.get("derivedFields", []):
                if field.get("datasourceUid") and field["datasourceUid"] not in uids:
                    raise ValueError(
                        f"{source.uid}: derived field to unknown datasource {field['datasourceUid']!r}"
                    )
        return self


class ProviderOptions(_Strict):
    path: str = Field(min_length=1)
    foldersFromFilesStructure: bool = False


class Provider(_Strict):
    name: str = Field(min_length=1)
    type: Literal["file"] = "file"
    orgId: int = 1
    folder: str = ""
    folderUid: str = Field(default="", max_length=40)
    editable: bool = False
    disableDeletion: bool = False
    updateIntervalSeconds: int = 10
    allowUiUpdates: bool = False
    options: ProviderOptions


class ProvidersFile(_Strict):
    apiVersion: Literal[1]
    providers: list[Provider] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> ProvidersFile:
        for attr in ("name", "folderUid", "options"):
            values = [str(getattr(p, attr)) for p in self.providers]
            if len(set(values)) != len(values):
                raise ValueError(f"two providers share a {attr}")
        return self


def _parse(model: type[BaseModel], data: Any, *, source: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        raise GrafanaFormatError(
            str(first["msg"]).removeprefix("Value error, "),
            field=field_path(tuple(first["loc"])),
            source=source,
        ) from exc


def parse_datasources(data: Any, *, source: str = "datasources.yml") -> DatasourcesFile:
    return _parse(DatasourcesFile, data, source=source)  # type: ignore[no-any-return]


def parse_providers(data: Any, *, source: str = "dashboards.yml") -> ProvidersFile:
    return _parse(ProvidersFile, data, source=source)  # type: ignore[no-any-return]


_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
BUILTINS = {
    "__interval",
    "__rate_interval",
    "__range",
    "__from",
    "__to",
    "__all",
    "__value",
    "__field",
    "__data",
    "__series",
    "__url_time_range",
    "__timeFilter",
    "__auto",
    "labels",
    "value",
}


def check_dashboard(model: dict[str, Any], *, source: str = "dashboard") -> None:
    """Variables referenced are defined, uids fit, panel ids are unique."""
    if len(model.get("uid", "")) > 40:
        raise GrafanaFormatError("uid longer than 40 characters", field="uid", source=source)
    defined = {v["name"] for v in model["templating"]["list"]}
    for i, variable in enumerate(model["templating"]["list"]):
        text = variable.get("definition", "") if variable.get("type") == "query" else ""
        for name in _VAR.findall(text):
            if name not in defined | BUILTINS:
                raise GrafanaFormatError(
                    f"uses undefined variable ${name}", field=f"templating.list[{i}]", source=source
                )
    ids = [p["id"] for p in model["panels"]]
    if len(set(ids)) != len(ids):
        raise GrafanaFormatError("panel ids repeat", field="panels", source=source)
    for p, panel in enumerate(model["panels"]):
        for t, target in enumerate(panel.get("targets", [])):
            for name in _VAR.findall(target.get("expr", "")):
                if name not in defined | BUILTINS:
                    raise GrafanaFormatError(
                        f"uses undefined variable ${name}",
                        field=f"panels[{p}].targets[{t}].expr",
                        source=source,
                    )
