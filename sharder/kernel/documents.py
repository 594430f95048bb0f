"""Bytes -> plain Python data for specs and inventories, with hard bounds on what input costs.

Pipeline position: the first step of ``sharder.model.loading``; nothing here knows the schema.
Every failure is a :class:`DocumentError` (a ``ValueError``) with a one-line reason, so
the caller only adds the file name. Foreign parser errors are mapped here and nowhere else.

YAML is read from libyaml's *event* stream (``CSafeLoader`` when PyYAML was built with it,
the pure-Python parser otherwise) and built into dicts/lists here, instead of through
PyYAML's node graph. That is what keeps a 50 MB inventory at a few hundred MB and seconds:
the node graph holds two ``Mark`` objects per scalar (about 2.4 GB for 400,000 nodes) and
its millions of small objects make the cyclic GC rescan the heap over and over, so the
build also runs with the collector paused (:func:`gc_paused`). Scalars still go through
PyYAML's own resolver and constructors, so ``yes``, ``0x1f``, ``~`` and ``!!str`` mean
what they mean in YAML 1.1.

Bounds: documents nest at most :data:`MAX_DEPTH` deep; aliases may add at most
``max(MAX_ALIAS_NODES, nodes in the document)`` nodes on expansion (a "billion laughs"
document of a few hundred bytes is refused at once instead of expanding to gigabytes
later, when pydantic or an error message walks it); an alias to an anchor still being
built (a recursive document) is refused.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from yaml import events
from yaml.nodes import ScalarNode

MAX_DEPTH = 64
MAX_ALIAS_NODES = 100_000
Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"


class DocumentError(ValueError):
    """A document that cannot be read as data; the message is one line without the file."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building millions of acyclic objects (see module docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode(raw: bytes) -> str:
    """UTF-8 text (a BOM is dropped); undecodable bytes are named by offset and line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DocumentError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} (line {line})"
        ) from None


def parse_json(text: str) -> Any:
    def constant(name: str) -> Any:
        raise DocumentError(f"malformed JSON: {name} is not a JSON value")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise DocumentError("malformed JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"malformed JSON: {exc}") from None


def parse_yaml(
    text: str | bytes, *, max_alias_nodes: int = MAX_ALIAS_NODES, max_depth: int = MAX_DEPTH
) -> Any:
    """One YAML document as plain data; None for an empty stream."""
    loader = Loader(text)
    try:
        with gc_paused():
            return _Builder(loader, max_alias_nodes=max_alias_nodes, max_depth=max_depth).run()
    except DocumentError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        if "nesting depth" in (exc.problem or ""):
            # libyaml from PyYAML 6.0.4 on scans ahead and stops at its own depth limit (1000)
            # before our builder sees the 65th level: one message whichever release runs.
            raise DocumentError(f"nested deeper than {max_depth} levels{where}") from None
        what = "; ".join(_one_line_text(p) for p in (exc.context, exc.problem) if p)
        raise DocumentError(f"malformed YAML: {what or 'unreadable'}{where}") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"malformed YAML: {_one_line(exc)}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar PyYAML's constructors refuse
        raise DocumentError(f"malformed YAML: {exc}") from None
    finally:
        loader.dispose()


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _one_line_text(text: str) -> str:
    return " ".join(text.split())


class _Frame:
    """A mapping or sequence being built."""

    __slots__ = ("anchor", "has_key", "is_map", "key", "merges", "size", "value")

    def __init__(self, value: Any, *, is_map: bool, anchor: str | None) -> None:
        self.value = value
        self.is_map = is_map
        self.anchor = anchor
        self.key: Any = None
        self.has_key = False
        self.size = 1
        self.merges: list[Any] = []


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, *, max_alias_nodes: int, max_depth: int) -> None:
        self.loader = loader
        self.max_alias_nodes = max_alias_nodes
        self.max_depth = max_depth
        resolvers = loader.yaml_implicit_resolvers
        # Plain scalars starting with any other character can only be strings.
        self.resolvable = None if None in resolvers else frozenset(k for k in resolvers if k)
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.building: set[str] = set()
        self.nodes = 0
        self.aliased = 0
        self.event: Any = None

    def run(self) -> Any:
        try:
            return self.build()
        except DocumentError as exc:
            mark = getattr(self.event, "start_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise DocumentError(f"{exc}{where}") from None

    def build(self) -> Any:
        # The hot loop of a 50 MB inventory: locals, and plain strings never leave it.
        get = self.loader.get_event
        scalar_event, alias_event = events.ScalarEvent, events.AliasEvent
        map_start, seq_start = events.MappingStartEvent, events.SequenceStartEvent
        map_end, seq_end = events.MappingEndEvent, events.SequenceEndEvent
        resolvable = self.resolvable
        stack: list[_Frame] = []
        result: Any = None
        documents = 0
        while True:
            self.event = event = get()
            kind = type(event)
            if kind is scalar_event:
                value = event.value
                if event.tag is not None or (
                    event.implicit[0] and (resolvable is None or not value or value[0] in resolvable)
                ):
                    value = self.scalar(event)
                size = 1
                if event.anchor:
                    self.anchors[event.anchor] = (value, 1)
            elif kind is map_start or kind is seq_start:
                is_map = kind is map_start
                self.check_collection_tag(event.tag, _MAP if is_map else _SEQ)
                if len(stack) >= self.max_depth:
                    raise DocumentError(f"nested deeper than {self.max_depth} levels")
                if event.anchor:
                    self.building.add(event.anchor)
                stack.append(_Frame({} if is_map else [], is_map=is_map, anchor=event.anchor))
                continue
            elif kind is map_end or kind is seq_end:
                frame = stack.pop()
                value, size = self.finish(frame), frame.size
                if frame.anchor:
                    self.building.discard(frame.anchor)
                    self.anchors[frame.anchor] = (value, size)
            elif kind is alias_event:
                value, size = self.alias(event)
            elif kind is events.DocumentStartEvent:
                documents += 1
                if documents > 1:
                    raise DocumentError("expected one YAML document, found more (a second '---')")
                continue
            elif kind is events.StreamEndEvent:
                return result
            else:
                continue
            self.nodes += 1
            if not stack:
                if value is _MergeKey:
                    raise DocumentError("'<<' (YAML merge) is only allowed as a mapping key")
                result = value
                continue
            top = stack[-1]
            top.size += size
            if not top.is_map:
                if value is _MergeKey:
                    raise DocumentError("'<<' (YAML merge) is only allowed as a mapping key")
                top.value.append(value)
            elif not top.has_key:
                top.key, top.has_key = value, True
            else:
                top.has_key = False
                if value is _MergeKey:
                    raise DocumentError("'<<' (YAML merge) is only allowed as a mapping key")
                self.put(top, top.key, value)

    def scalar(self, event: events.ScalarEvent) -> Any:
        """A scalar that may not be a plain string: resolved and built as PyYAML would."""
        value, tag = event.value, event.tag
        if tag is None or tag == "!":
            if event.implicit[0] and tag is None:
                tag = self.loader.resolve(ScalarNode, value, event.implicit)
            else:
                tag = _STR
        if tag == _STR:
            return value
        if tag == _MERGE:
            return _MergeKey
        construct = self.loader.yaml_constructors.get(tag)
        if construct is None or tag in (_MAP, _SEQ) or not tag.startswith("tag:yaml.org,2002:"):
            raise DocumentError(f"unsupported YAML tag {tag!r} on scalar {_short(value)}")
        return construct(self.loader, ScalarNode(tag, value))

    @staticmethod
    def check_collection_tag(tag: str | None, expected: str) -> None:
        if tag is not None and tag != "!" and tag != expected:
            raise DocumentError(f"unsupported YAML tag {tag!r} on a collection")

    def alias(self, event: events.AliasEvent) -> tuple[Any, int]:
        name = event.anchor
        if name in self.building:
            raise DocumentError(f"alias *{_short(name)} refers to itself (recursive document)")
        if name not in self.anchors:
            raise DocumentError(f"alias *{_short(name)} has no anchor before it")
        value, size = self.anchors[name]
        self.aliased += size
        if self.aliased > max(self.max_alias_nodes, self.nodes):
            raise DocumentError(
                f"aliases expand to more than {max(self.max_alias_nodes, self.nodes)} nodes"
                " (an alias bomb?); write the values out instead"
            )
        return value, size

    @staticmethod
    def put(frame: _Frame, key: Any, value: Any) -> None:
        if key is _MergeKey:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                raise DocumentError("a '<<' merge key needs a mapping or a list of mappings")
            frame.merges.extend(sources)
            return
        try:
            frame.value[key] = value
        except TypeError:
            raise DocumentError(f"a mapping key must be a plain value, not {type(key).__name__}") from None

    @staticmethod
    def finish(frame: _Frame) -> Any:
        if not frame.merges:
            return frame.value
        merged: dict[Any, Any] = {}
        for source in reversed(frame.merges):  # the first merged mapping wins, as in PyYAML
            merged.update(source)
        merged.update(frame.value)
        frame.value.clear()
        frame.value.update(merged)  # same object, so an anchor on this mapping stays valid
        return frame.value


class _MergeKey:
    """Marks YAML's ``<<`` key while its mapping is being built."""


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
