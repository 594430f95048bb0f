"""Parse rendered Promtail, Loki and Loki-ruler files strictly: the check this tier gets.

No Promtail, Loki or Grafana binary can run here, so each rendered file is parsed against
models of the upstream config structs (``logs.promtail_structs``, ``logs.loki_structs``)
that refuse unknown keys, the way ``thanos.formats`` stands in for Thanos. What these
checks do not cover: LogQL itself (no LogQL parser is in reach from Python; the selector
part of each query is checked by :func:`check_selector`, the pipeline is not), and runtime
behaviour (whether Loki accepts the bucket, whether the journal is readable).
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from logs import loki_structs, promtail_structs
from sharder.kernel.models import LABEL_NAME_RE, field_path


class LogsFormatError(ValueError):
    """A file Promtail or Loki would refuse; names the field and the value."""

    def __init__(self, message: str, *, field: str = "", value: Any = None, source: str = "") -> None:
        self.field, self.value, self.source = field, value, source
        where = " ".join(
            p for p in (f"{source}:" if source else "", f"field '{field}'" if field else "") if p
        )
        shown = f" (value {value!r})" if value is not None and not isinstance(value, dict | list) else ""
        super().__init__(f"{where} {message}{shown}".strip())


class Rule(BaseModel):
    """One rule of a Prometheus-format group, as Loki's ruler reads it (rulefmt.RuleNode)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    record: str = ""
    alert: str = ""
    expr: str = Field(min_length=1)
    for_: str = Field(default="", alias="for")
    keep_firing_for: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RuleGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    interval: str = ""
    limit: int = 0
    rules: list[Rule] = Field(min_length=1)


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    groups: list[RuleGroup] = Field(min_length=1)


_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


def check_selector(query: str) -> dict[str, tuple[str, str]]:
    """The stream selector a LogQL query starts with, ``{...}``: label -> (operator, value).

    Each matcher must be well formed, and one must not match the empty string: Loki refuses
    ``{}`` and ``{a=~".*"}``. The rest of the query (line filters, parsers, the range
    aggregation) is not parsed here."""
    start = query.find("{")
    end = query.find("}", start)
    if start < 0 or end < 0:
        raise ValueError(f"no stream selector in {query!r}")
    body, pos = query[start + 1 : end], 0
    matchers: dict[str, tuple[str, str]] = {}
    while pos < len(body):
        match = _MATCHER.match(body, pos)
        if match is None:
            raise ValueError(f"bad matcher at {body[pos:]!r} in {query!r}")
        matchers[match[1]] = (match[2], match[3])
        pos = match.end()
        if pos < len(body):
            if body[pos] != ",":
                raise ValueError(f"expected ',' at {body[pos:]!r} in {query!r}")
            pos += 1
    if not any(
        (op == "=" and value) or (op == "=~" and value not in ("", ".*")) for op, value in matchers.values()
    ):
        raise ValueError(f"{query!r}: a selector needs one matcher that does not match the empty string")
    return matchers


def _load(text: str | bytes, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LogsFormatError(f"not YAML: {exc}", source=source) from exc
    if not isinstance(data, dict):
        raise LogsFormatError("expected a mapping at the top level", source=source)
    return data


def _validate(model: type[BaseModel], data: Any, *, source: str, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = field_path(tuple(first["loc"]))
        field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        raise LogsFormatError(
            str(first["msg"]).removeprefix("Value error, "),
            field=field,
            value=first.get("input"),
            source=source,
        ) from exc


def _stages(stages: list[dict[str, Any]], *, source: str, at: str) -> None:
    for i, stage in enumerate(stages):
        where = f"{at}[{i}]"
        if len(stage) != 1:
            raise LogsFormatError("a pipeline stage is a mapping with one key", field=where, source=source)
        ((name, block),) = stage.items()
        kind = promtail_structs.STAGES.get(name)
        if kind is None:
            raise LogsFormatError(
                f"unknown pipeline stage (gpufed renders {sorted(promtail_structs.STAGES)})",
                field=where,
                value=name,
                source=source,
            )
        if kind is dict:
            for label, extracted in (block or {}).items():
                if not LABEL_NAME_RE.match(label) or not (extracted is None or isinstance(extracted, str)):
                    raise LogsFormatError(
                        "labels maps a label name to an extracted name or null",
                        field=f"{where}.labels",
                        value=label,
                        source=source,
                    )
            continue
        parsed = _validate(kind, block or {}, source=source, prefix=f"{where}.{name}")
        if isinstance(parsed, promtail_structs.RegexStage):
            try:
                re.compile(parsed.expression)
            except re.error as exc:
                raise LogsFormatError(
                    f"bad regex: {exc}", field=f"{where}.regex.expression", source=source
                ) from exc
        if isinstance(parsed, promtail_structs.MatchStage):
            try:
                check_selector(parsed.selector)
            except ValueError as exc:
                raise LogsFormatError(str(exc), field=f"{where}.match.selector", source=source) from exc
            _stages(parsed.stages, source=source, at=f"{where}.match.stages")


def parse_promtail(text: str | bytes, *, source: str = "promtail.yml") -> promtail_structs.PromtailConfig:
    config = _validate(promtail_structs.PromtailConfig, _load(text, source), source=source)
    names = [job.job_name for job in config.scrape_configs]
    if len(set(names)) != len(names):
        raise LogsFormatError("duplicate job_name", field="scrape_configs", source=source)
    for i, job in enumerate(config.scrape_configs):
        _stages(job.pipeline_stages, source=source, at=f"scrape_configs[{i}].pipeline_stages")
        for j, rule in enumerate(job.relabel_configs):
            try:
                re.compile(rule.regex)
            except re.error as exc:
                raise LogsFormatError(
                    f"bad regex: {exc}", field=f"scrape_configs[{i}].relabel_configs[{j}]", source=source
                ) from exc
    return config


def parse_loki(text: str | bytes, *, source: str = "loki.yml") -> loki_structs.LokiConfig:
    return _validate(loki_structs.LokiConfig, _load(text, source), source=source)  # type: ignore[no-any-return]


def parse_rules(text: str | bytes, *, source: str = "rules.yml") -> RuleFile:
    rules: RuleFile = _validate(RuleFile, _load(text, source), source=source)
    for g, group in enumerate(rules.groups):
        for r, rule in enumerate(group.rules):
            where = f"groups[{g}].rules[{r}]"
            if bool(rule.record) == bool(rule.alert):
                raise LogsFormatError("a rule is either record or alert", field=where, source=source)
            if rule.record and not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z", rule.record):
                raise LogsFormatError(
                    "not a metric name", field=f"{where}.record", value=rule.record, source=source
                )
            try:
                check_selector(rule.expr)
            except ValueError as exc:
                raise LogsFormatError(str(exc), field=f"{where}.expr", source=source) from exc
    return rules
