"""Reading the spec and inventories, with errors that name the spot: the one validation layer.

This is the only sharder module that opens files for input; ``sharder.kernel.documents`` turns
the bytes into data within bounds. Everything that becomes a ``Target`` goes through
:func:`parse_target` (one raw mapping -> ``Target`` or an ``InventoryError`` naming the
field and value) and a :class:`TargetIndex` (duplicates by endpoint, by identity, and a
node name seen at two addresses): the static file here, and the live registry sources and
REST bodies the same way, so every path refuses the same things with the same words.
Validation errors from pydantic become ``SpecError``/``InventoryError`` carrying the
file, the field path (``jobs[0].scrape_interval``) and the offending value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sharder.kernel import documents, secrets
from sharder.kernel.errors import InventoryError, SpecError, preview
from sharder.kernel.models import field_path
from sharder.model.endpoints import Endpoint, endpoint_of
from sharder.model.inventory import PLAIN_TEXT_PATTERN, Target, sort_targets
from sharder.model.spec import FederationSpec, JobSpec

MAX_DOCUMENT_BYTES = 1 << 30
"""About 8 million nodes of inventory; anything larger is a mistake (or /dev/zero)."""
INVENTORY_KEYS = frozenset({"defaults", "nodes", "targets"})
DEFAULTS_KEYS = frozenset({"exporters"})
# In a ``nodes`` entry the node is ``name`` and the job/port come from ``exporters``.
_NODE_FIELDS = {"node": "name", "job": "exporters", "port": "exporters"}


MAX_LABELS = 64
MAX_LABEL_VALUE = 1024
"""Characters in one label value (a 1 MB value once cost 16 MB per /v1/sd answer)."""
MAX_TARGET_BYTES = 8192
"""All of one target's text together: names, address, identity, path, labels."""
INTEGER_FIELDS = ("port", "gpus", "weight")

# sharder.model.inventory.PlainText's regex would say nothing to a reader.
PLAIN_TEXT_MESSAGE = "must not contain control characters or start/end with whitespace"


def raise_first_error(
    exc: ValidationError,
    *,
    source: str,
    error_cls: type[SpecError] = SpecError,
    prefix: str = "",
    rename: Mapping[str, str] | None = None,
) -> None:
    """Turn pydantic's error into ours: first problem, field path, value, file."""
    first = exc.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    if rename and loc and isinstance(loc[0], str) and loc[0] in rename:
        loc = (rename[loc[0]], *loc[1:])
    path = field_path(loc)
    field = f"{prefix}{'.' if prefix and path and not path.startswith('[') else ''}{path}"
    plain = (
        first["type"] == "string_pattern_mismatch"
        and first.get("ctx", {}).get("pattern") == PLAIN_TEXT_PATTERN
    )
    message = PLAIN_TEXT_MESSAGE if plain else str(first["msg"]).removeprefix("Value error, ")
    value = first.get("input")
    if message.startswith(secrets.LITERAL):
        value = None  # the message names the value's shape; the secret is not echoed
    if isinstance(value, dict | list):
        value = None  # a whole sub-document is noise; the field path says where
    raise error_cls(message, field=field, value=value, source=source) from None


def read_document(path: Path, *, error_cls: type[SpecError] = SpecError) -> Any:
    """A file's data: JSON for ``*.json``, YAML otherwise; every failure is one ``error_cls``."""
    source = str(path)
    try:
        with path.open("rb") as stream:  # a FIFO or /dev/zero must not read forever
            raw = stream.read(MAX_DOCUMENT_BYTES + 1)
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise error_cls(f"larger than {MAX_DOCUMENT_BYTES >> 20} MiB; split the inventory", source=source)
    except FileNotFoundError:
        raise error_cls("file not found", source=source) from None
    except IsADirectoryError:
        raise error_cls("is a directory, not a file", source=source) from None
    except OSError as exc:
        raise error_cls(f"cannot read file: {exc.strerror}", source=source) from None
    try:
        text = documents.decode(raw)
        if path.suffix == ".json":
            return documents.parse_json(text)
        return documents.parse_yaml(text)
    except documents.DocumentError as exc:
        raise error_cls(str(exc), source=source) from None


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any, *, source: str, error_cls: type[SpecError] = SpecError) -> M:
    if not isinstance(data, dict):
        raise error_cls(f"expected a mapping at the top level, got {_kind(data)}", source=source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise_first_error(exc, source=source, error_cls=error_cls)
        raise  # unreachable; keeps type checkers content


def load_spec(path: str | Path) -> FederationSpec:
    path = Path(path)
    return parse_model(FederationSpec, read_document(path), source=str(path))


def parse_target(
    raw: Any,
    *,
    where: str = "",
    source: str = "",
    jobs: Mapping[str, JobSpec] | None = None,
    rename: Mapping[str, str] | None = None,
    strict_numbers: bool = False,
) -> Target:
    """One raw target mapping -> a validated, normalised ``Target``, or ``InventoryError``.

    ``strict_numbers``: a JSON body (the registry's REST API) gives numbers as numbers, so
    ``"port": "9400"`` is refused there; sources whose metadata are strings only (Consul
    service meta, Kubernetes labels) keep reading ``"8"`` as 8.

    ``where`` is the entry's path in its document (``targets[3]``), prefixed to field names
    in errors. With ``jobs`` (the spec's jobs by name) a target without an explicit
    ``weight`` gets its job's (``JobSpec.target_weight``). Registry sources and REST
    bodies call this too, so every input is refused with the same words.
    """
    if not isinstance(raw, dict):
        raise InventoryError(f"expected a mapping, got {_kind(raw)}", field=where, value=raw, source=source)
    refused = (bool, str) if strict_numbers else (bool,)
    for name in INTEGER_FIELDS:  # pydantic's lax mode reads true as 1 and "9400" as 9400
        if isinstance(raw.get(name), refused):
            field = (rename or {}).get(name, name)
            kind = "a boolean" if isinstance(raw[name], bool) else "a string"
            raise InventoryError(
                f"expected an integer, got {kind}",
                field=_join(where, field),
                value=raw[name],
                source=source,
            )
    weight = _job_weight(raw, jobs)
    if weight is not None:
        raw = {**raw, "weight": weight}  # before validation: a copy of the model costs more
    try:
        target = Target.model_validate(raw)
    except ValidationError as exc:
        raise_first_error(exc, source=source, error_cls=InventoryError, prefix=where, rename=rename)
        raise
    _check_size(target, where=where, source=source)
    job = jobs.get(target.job) if jobs is not None else None
    if job is not None and target.explicit_weight is None:
        target = target.model_copy(update={"explicit_weight": job.target_weight(target.gpus)})
    return target


def _join(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _check_size(target: Target, *, where: str, source: str) -> None:
    """Bounds per target, so one registration cannot grow every SD answer and the state."""
    labels = target.labels
    if len(labels) > MAX_LABELS:
        raise InventoryError(
            f"{len(labels)} labels; a target has at most {MAX_LABELS}",
            field=_join(where, "labels"),
            source=source,
        )
    size = len(labels) and sum(len(k) + len(v) for k, v in labels.items())
    for name, value in labels.items():
        if len(value) > MAX_LABEL_VALUE:
            raise InventoryError(
                f"a value of {len(value)} characters; label values have at most {MAX_LABEL_VALUE}",
                field=_join(where, f"labels.{name}"),
                source=source,
            )
    size += len(target.address) + len(target.job) + len(target.node) + len(target.region)
    size += len(target.rack) + len(target.team) + len(target.metrics_path or "")
    size += len(target.explicit_identity or "")
    if size > MAX_TARGET_BYTES:
        raise InventoryError(
            f"{size} characters of text in one target; the most is {MAX_TARGET_BYTES}",
            field=where or "target",
            source=source,
        )


def _job_weight(raw: dict[Any, Any], jobs: Mapping[str, JobSpec] | None) -> int | None:
    """The job's weight for a raw target that sets none and has a plain GPU count, else None."""
    name, gpus = raw.get("job"), raw.get("gpus", 0)
    if jobs is None or "weight" in raw or not isinstance(name, str) or type(gpus) is not int:
        return None
    job = jobs.get(name)
    return job.target_weight(gpus) if job is not None and 0 <= gpus <= 64 else None


class TargetIndex:
    """Targets seen so far, refusing a second entry for the same endpoint, identity or node.

    An *endpoint* is what Prometheus would scrape: scheme, host, port and metrics path,
    after normalisation and with the job's defaults filled in. Errors name both entries.
    """

    def __init__(self, *, source: str = "", jobs: Mapping[str, JobSpec] | None = None) -> None:
        self.source = source
        self.jobs = jobs or {}
        self.endpoints: dict[Endpoint, str] = {}
        self.identities: dict[str, str] = {}
        self.nodes: dict[str, tuple[str, str]] = {}
        self.targets: list[Target] = []

    def endpoint(self, target: Target) -> Endpoint:
        return endpoint_of(target, self.jobs)

    def add(self, target: Target, *, where: str) -> None:
        instance = target.instance
        identity = target.explicit_identity or instance
        endpoint = self.endpoint(target)
        other = self.endpoints.get(endpoint)
        if other is not None:  # the field names this entry, the message the other one
            raise InventoryError(
                f"duplicate target (also at {other})",
                field=f"{where}.address",
                value=instance,
                source=self.source,
            )
        other = self.identities.get(identity)
        if other is not None:
            raise InventoryError(
                f"duplicate target identity (also at {other}); set 'identity' on targets that share"
                " an address and port",
                field=f"{where}.identity",
                value=identity,
                source=self.source,
            )
        known = self.nodes.get(target.node)
        if known is not None and known[0] != target.address:
            raise InventoryError(
                f"node {preview(target.node)} has address {known[0]} at {known[1]} and"
                f" {target.address} here; one node has one address",
                field=f"{where}.address",
                value=target.address,
                source=self.source,
            )
        self.endpoints[endpoint] = where
        self.identities[identity] = where
        if known is None:
            self.nodes[target.node] = (target.address, where)
        self.targets.append(target)


def parse_inventory(
    data: Any, *, source: str, jobs: Mapping[str, JobSpec] | None = None, consume: bool = False
) -> list[Target]:
    """Inventory documents: ``nodes`` expanded through ``defaults.exporters``, plus ``targets``.

    ```yaml
    defaults: {exporters: {gpu: 9400, node: 9100}}
    nodes:
      - {name: bj-n001, address: 10.1.0.1, region: cn-beijing, rack: a01, team: llm, gpus: 8}
    targets:
      - {address: 10.9.0.1, port: 9400, job: gpu, node: spare-1, region: cn-beijing}
    ```

    A ``targets`` entry without ``port`` takes its job's port from ``defaults.exporters``.
    ``consume=True`` clears each entry of ``data`` once it is a target, so a large
    document and its targets are not both held in full (the file source owns its data).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InventoryError(f"expected a mapping at the top level, got {_kind(data)}", source=source)
    _no_unknown_keys(data, INVENTORY_KEYS, where="", source=source)
    defaults = _mapping(data.get("defaults"), where="defaults", source=source)
    _no_unknown_keys(defaults, DEFAULTS_KEYS, where="defaults", source=source)
    exporters = _mapping(defaults.get("exporters"), where="defaults.exporters", source=source)
    index = TargetIndex(source=source, jobs=jobs)
    with documents.gc_paused():
        nodes = _sequence(data.get("nodes"), where="nodes", source=source)
        consume_nodes = consume and nodes is not data.get("targets")  # one list aliased as both
        for i, node in enumerate(nodes):
            _add_node(index, node, where=f"nodes[{i}]", exporters=exporters, jobs=jobs)
            if consume_nodes:
                nodes[i] = None
        entries = _sequence(data.get("targets"), where="targets", source=source)
        for i, item in enumerate(entries):
            where = f"targets[{i}]"
            job = item.get("job") if isinstance(item, dict) else None
            if isinstance(job, str) and job in exporters and "port" not in item:
                item = {**item, "port": exporters[job]}
            index.add(parse_target(item, where=where, source=source, jobs=jobs), where=where)
            if consume:
                entries[i] = None
        targets = index.targets
        del index  # its lookup tables are the largest thing left besides the targets
        return sort_targets(targets)


def _add_node(
    index: TargetIndex,
    node: Any,
    *,
    where: str,
    exporters: dict[Any, Any],
    jobs: Mapping[str, JobSpec] | None,
) -> None:
    source = index.source
    if not isinstance(node, dict):
        raise InventoryError(f"expected a mapping, got {_kind(node)}", field=where, value=node, source=source)
    fields = dict(node)
    name = fields.pop("name", None)
    if "node" in fields or "job" in fields or "port" in fields:
        bad = next(k for k in ("node", "job", "port") if k in fields)
        raise InventoryError(
            f"'{bad}' is not a node field (nodes have name and exporters)",
            field=f"{where}.{bad}",
            source=source,
        )
    jobs_here = _mapping(fields.pop("exporters", exporters), where=f"{where}.exporters", source=source)
    if not jobs_here:
        raise InventoryError(
            "no exporters for this node (set defaults.exporters)", field=where, source=source
        )
    for job, port in jobs_here.items():  # file order: deterministic, and errors follow the file
        raw = {**fields, "node": name, "job": job, "port": port}
        weight = _job_weight(raw, jobs)
        if weight is not None:
            raw["weight"] = weight  # our own dict: spares parse_target a copy
        target = parse_target(raw, where=where, source=source, jobs=jobs, rename=_NODE_FIELDS)
        index.add(target, where=where)


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing (null)"}
    return names.get(type(value), type(value).__name__)


def _mapping(value: Any, *, where: str, source: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InventoryError(
            f"expected a mapping, got {_kind(value)}", field=where, value=value, source=source
        )
    return value


def _sequence(value: Any, *, where: str, source: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InventoryError(f"expected a list, got {_kind(value)}", field=where, value=value, source=source)
    return value


def _no_unknown_keys(data: dict[Any, Any], known: frozenset[str], *, where: str, source: str) -> None:
    unknown = sorted((k for k in data if k not in known), key=repr)
    if unknown:
        field = f"{where}.{unknown[0]}" if where else str(unknown[0])
        raise InventoryError(
            f"unknown key (known: {', '.join(sorted(known))})", field=field, value=unknown[0], source=source
        )


class StaticFileSource:
    """Targets from a YAML or JSON inventory file; re-read on every call.

    ``jobs`` (the spec's jobs by name) lets duplicate detection see each job's scheme and
    metrics path, and gives targets their job's weight.
    """

    def __init__(self, path: str | Path, *, jobs: Mapping[str, JobSpec] | None = None) -> None:
        self.path = Path(path)
        self.jobs = jobs

    def list_targets(self) -> list[Target]:
        data = read_document(self.path, error_cls=InventoryError)
        return parse_inventory(data, source=str(self.path), jobs=self.jobs, consume=True)
