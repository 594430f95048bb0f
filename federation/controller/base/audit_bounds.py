"""Audit entries hold bounded values: long id lists are cut to a cap with their count.

An applied change is kept in the audit log (``detail.change``). A change may list up to
``changes.MAX_ENTRIES`` ids of up to 1,000 characters each, so a verbatim copy could make
one entry megabytes, and every later read of an audit page would pay for it. The entry
keeps the first :data:`AUDIT_IDS` items of each list or mapping, and a sibling
``<field>_count`` with how many there were; the change itself (the plan, the state) keeps
everything. Strings are cut to :data:`AUDIT_CHARS` characters with the cut said in the
string. Entries written before this cap are cut the same way when they are read.
"""

from __future__ import annotations

from typing import Any

AUDIT_IDS = 20
"""Items of one list or mapping an audit entry keeps."""
AUDIT_CHARS = 1000
"""Characters of one string an audit entry keeps (ids are at most 1,000, reasons 500)."""


def bounded(detail: dict[str, Any]) -> dict[str, Any]:
    """``detail`` with every list and mapping cut to :data:`AUDIT_IDS` (plus ``<key>_count``)."""
    return _mapping(detail, depth=0)


def _mapping(value: dict[str, Any], *, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, (key, item) in enumerate(value.items()):
        if depth > 0 and n >= AUDIT_IDS:
            break
        name = _string(str(key))
        if isinstance(item, list) and len(item) > AUDIT_IDS:
            out[name] = [_value(v, depth=depth + 1) for v in item[:AUDIT_IDS]]
            out[f"{name}_count"] = len(item)
        elif isinstance(item, dict) and len(item) > AUDIT_IDS:
            out[name] = _mapping(item, depth=depth + 1)
            out[f"{name}_count"] = len(item)
        else:
            out[name] = _value(item, depth=depth + 1)
    return out


def _value(value: Any, *, depth: int) -> Any:
    if depth > 8:
        return "<nested too deep>"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return [_value(v, depth=depth + 1) for v in value[:AUDIT_IDS]]
    if isinstance(value, dict):
        return _mapping(value, depth=depth)
    return value


def _string(value: str) -> str:
    if len(value) <= AUDIT_CHARS:
        return value
    return f"{value[:AUDIT_CHARS]}... ({len(value)} characters)"
