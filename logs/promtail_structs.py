"""Promtail's config structs as strict models: unknown keys are refused, as Promtail does.

Promtail loads its file with ``yaml.UnmarshalStrict`` (grafana/loki
clients/pkg/promtail/config/config.go@01eea28c, ``Config``), so a misspelt key stops it at
startup; these models refuse the same keys here, before a node ever runs the file. Field
names follow the upstream structs:

- ``Config``: clients/pkg/promtail/config/config.go@01eea28c
- ``client.Config``: clients/pkg/promtail/client/config.go@01d63c8a (``url``, ``batchwait``
  and ``batchsize`` carry no yaml tag, so yaml.v2 lower-cases the Go names)
- ``scrapeconfig.Config``, ``JournalTargetConfig``: clients/pkg/promtail/scrapeconfig/
  scrapeconfig.go@003b95a3
- ``relabel.Config``: prometheus/prometheus model/relabel/relabel.go
- pipeline stages: clients/pkg/logentry/stages (``match``, ``regex``, ``labels``, ``docker``,
  ``cri``): only the stages gpufed renders are modelled; any other stage name is refused.

Only the fields gpufed might write are modelled where a struct is large (the server block
embeds dskit's ``server.Config`` with some sixty fields); an unmodelled field is refused
too, which errs on the side of a false alarm, never a silent pass.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from sharder.kernel.models import LABEL_NAME_RE


class GoStruct(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _label_names(values: dict[str, str]) -> dict[str, str]:
    for name in values:
        if not LABEL_NAME_RE.match(name):
            raise ValueError(f"not a valid label name: {name!r}")
    return values


LabelSet = Annotated[dict[str, str], AfterValidator(_label_names)]


class ServerConfig(GoStruct):
    http_listen_address: str = ""
    http_listen_port: int = 80
    grpc_listen_address: str = ""
    grpc_listen_port: int = 9095
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"
    register_instrumentation: bool = True
    disable: bool = False
    health_check_target: bool | None = None
    enable_runtime_reload: bool = False


class BackoffConfig(GoStruct):
    min_period: str = "500ms"
    max_period: str = "5m"
    max_retries: int = 10


class ClientConfig(GoStruct):
    name: str = ""
    url: str = Field(min_length=1)
    batchwait: str = "1s"
    batchsize: int = 1048576
    backoff_config: BackoffConfig = Field(default_factory=BackoffConfig)
    external_labels: LabelSet = Field(default_factory=dict)
    timeout: str = "10s"
    tenant_id: str = ""
    # prometheus/common HTTPClientConfig, inlined: the subset a push client uses.
    basic_auth: dict[str, str] | None = None
    bearer_token_file: str = ""
    tls_config: dict[str, Any] | None = None
    proxy_url: str = ""

    @field_validator("url")
    @classmethod
    def _push_path(cls, value: str) -> str:
        if not value.endswith("/loki/api/v1/push"):
            raise ValueError("a Promtail client URL ends with Loki's push path /loki/api/v1/push")
        return value


class PositionsConfig(GoStruct):
    filename: str = Field(min_length=1)
    sync_period: str = "10s"
    ignore_invalid_yaml: bool = False


class JournalTargetConfig(GoStruct):
    max_age: str = "7h"
    json_: bool = Field(default=False, alias="json")
    labels: LabelSet = Field(default_factory=dict)
    path: str = ""


class RelabelConfig(GoStruct):
    source_labels: list[str] = Field(default_factory=list)
    separator: str = ";"
    regex: str = "(.*)"
    modulus: int = 0
    target_label: str = ""
    replacement: str = "$1"
    action: Literal[
        "replace",
        "keep",
        "drop",
        "hashmod",
        "labelmap",
        "labeldrop",
        "labelkeep",
        "lowercase",
        "uppercase",
        "keepequal",
        "dropequal",
    ] = "replace"


class StaticConfig(GoStruct):
    targets: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)


class RegexStage(GoStruct):
    expression: str = Field(min_length=1)
    source: str | None = None


class CRIStage(GoStruct):
    max_partial_lines: int = 100
    max_partial_line_size: int = 0
    max_partial_line_size_truncate: bool = False


class MatchStage(GoStruct):
    selector: str = Field(min_length=1)
    pipeline_name: str = ""
    action: Literal["keep", "drop"] = "keep"
    drop_counter_reason: str = ""
    stages: list[dict[str, Any]] = Field(default_factory=list)


#: stage name -> model of its block; ``labels`` maps a label to an extracted name (None: same).
STAGES: dict[str, Any] = {
    "regex": RegexStage,
    "cri": CRIStage,
    "docker": GoStruct,
    "match": MatchStage,
    "labels": dict,
}


class ScrapeConfig(GoStruct):
    job_name: str = Field(min_length=1)
    pipeline_stages: list[dict[str, Any]] = Field(default_factory=list)
    journal: JournalTargetConfig | None = None
    relabel_configs: list[RelabelConfig] = Field(default_factory=list)
    static_configs: list[StaticConfig] = Field(default_factory=list)


class PromtailConfig(GoStruct):
    server: ServerConfig = Field(default_factory=ServerConfig)
    clients: list[ClientConfig] = Field(min_length=1)
    positions: PositionsConfig
    scrape_configs: list[ScrapeConfig] = Field(min_length=1)
    target_config: dict[str, Any] = Field(default_factory=dict)
    limits_config: dict[str, Any] = Field(default_factory=dict)
