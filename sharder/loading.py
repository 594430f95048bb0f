"""Reading the spec and static inventories from disk, with errors that name the spot.

This is the only sharder module that opens files for input. Validation errors from
pydantic are mapped to ``SpecError``/``InventoryError`` carrying the file, the field
path (``jobs[0].scrape_interval``) and the offending value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from sharder.errors import InventoryError, SpecError
from sharder.inventory import Target, sort_targets
from sharder.spec import FederationSpec


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def raise_first_error(
    exc: ValidationError, *, source: str, error_cls: type[SpecError] = SpecError, prefix: str = ""
) -> None:
    """Turn pydantic's error into ours: first problem, field path, value, file."""
    first = exc.errors()[0]
    loc = field_path(tuple(first["loc"]))
    field = f"{prefix}{'.' if prefix and loc and not loc.startswith('[') else ''}{loc}"
    message = str(first["msg"]).removeprefix("Value error, ")
    value = first.get("input")
    if isinstance(value, dict | list):
        value = None  # a whole sub-document is noise; the field path says where
    raise error_cls(message, field=field, value=value, source=source) from exc


def read_document(path: Path, *, error_cls: type[SpecError] = SpecError) -> Any:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise error_cls("file not found", source=source) from exc
    except OSError as exc:
        raise error_cls(f"cannot read file: {exc.strerror}", source=source) from exc
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise error_cls(f"malformed {path.suffix.lstrip('.') or 'YAML'}: {exc}", source=source) from exc


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any, *, source: str, error_cls: type[SpecError] = SpecError) -> M:
    if not isinstance(data, dict):
        raise error_cls(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise_first_error(exc, source=source, error_cls=error_cls)
        raise  # unreachable; keeps type checkers content


def load_spec(path: str | Path) -> FederationSpec:
    path = Path(path)
    return parse_model(FederationSpec, read_document(path), source=str(path))


def parse_inventory(data: Any, *, source: str) -> list[Target]:
    """Inventory documents: ``nodes`` expanded through ``defaults.exporters``, plus ``targets``.

    ```yaml
    defaults: {exporters: {gpu: 9400, node: 9100}}
    nodes:
      - {name: bj-n001, address: 10.1.0.1, region: cn-beijing, rack: a01, team: llm, gpus: 8}
    targets:
      - {address: 10.9.0.1, port: 9400, job: gpu, node: spare-1, region: cn-beijing}
    ```
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InventoryError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    unknown = sorted(set(data) - {"defaults", "nodes", "targets"})
    if unknown:
        raise InventoryError("unknown top-level keys", field=unknown[0], value=unknown[0], source=source)
    defaults = data.get("defaults") or {}
    exporters = defaults.get("exporters") or {}
    if not isinstance(exporters, dict):
        raise InventoryError("expected a mapping job -> port", field="defaults.exporters", source=source)
    raw: list[tuple[str, dict[str, Any]]] = []
    for i, node in enumerate(data.get("nodes") or []):
        if not isinstance(node, dict):
            raise InventoryError("expected a mapping", field=f"nodes[{i}]", value=node, source=source)
        node = dict(node)
        name = node.pop("name", None)
        jobs = node.pop("exporters", exporters)
        if not jobs:
            raise InventoryError(
                "no exporters for this node (set defaults.exporters)", field=f"nodes[{i}]", source=source
            )
        for job, port in sorted(jobs.items()):
            raw.append((f"nodes[{i}]", {**node, "node": name, "job": job, "port": port}))
    for i, target in enumerate(data.get("targets") or []):
        if not isinstance(target, dict):
            raise InventoryError("expected a mapping", field=f"targets[{i}]", value=target, source=source)
        raw.append((f"targets[{i}]", target))

    targets: list[Target] = []
    seen: dict[str, str] = {}
    for where, item in raw:
        try:
            target = Target.model_validate(item)
        except ValidationError as exc:
            raise_first_error(exc, source=source, error_cls=InventoryError, prefix=where)
            raise
        if target.identity in seen:
            raise InventoryError(
                f"duplicate target (also at {seen[target.identity]})",
                field=f"{where}.address",
                value=target.identity,
                source=source,
            )
        seen[target.identity] = where
        targets.append(target)
    return sort_targets(targets)


class StaticFileSource:
    """Targets from a YAML or JSON inventory file; re-read on every call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def list_targets(self) -> list[Target]:
        data = read_document(self.path, error_cls=InventoryError)
        return parse_inventory(data, source=str(self.path))
