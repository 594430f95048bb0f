"""Split a Consul health answer into its entries' raw JSON, without decoding it all.

A blocking query answers the *whole* service list on every change: 10,000 exporters are
about 12 MB of JSON, and decoding that into Python objects is most of what following
Consul costs. Consul encodes each entry as an object whose first key is ``"Node"`` with
an object value (Go's encoding/json writes struct fields in order), and inside JSON
strings every ``"`` is escaped, so the byte pattern ``},{"Node":{`` (whitespace allowed)
can only be a boundary between top-level entries. :func:`split_entries` cuts there;
the caller decodes only the fragments it has not seen before and caches the rest by
their exact bytes. Anything unexpected returns None and the caller decodes the whole
body the ordinary way, so the shortcut never changes a result, only its cost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container
from typing import Any, TypeVar

T = TypeVar("T")


def _same(entry: Any) -> Any:
    return entry

_BOUNDARY = re.compile(rb'\}\s*,\s*\{\s*"Node"\s*:\s*\{')
_FIRST = re.compile(rb'\{\s*"Node"\s*:\s*\{')


def split_entries(body: bytes) -> list[bytes] | None:
    """The raw entries of a JSON array of health entries, or None if unsure."""
    text = body.strip()
    if text[:1] != b"[" or text[-1:] != b"]":
        return None
    inner = text[1:-1].strip()
    if not inner:
        return []
    if not _FIRST.match(inner) or inner[-1:] != b"}":
        return None
    fragments: list[bytes] = []
    start = 0
    for match in _BOUNDARY.finditer(inner):
        fragments.append(inner[start : match.start() + 1])
        start = match.start() + match.group().index(b"{")
    fragments.append(inner[start:])
    return fragments


class NotAList(ValueError):
    """The answer is JSON, but not the array of entries Consul sends."""


def decode_answer(
    body: bytes, *, known: Container[bytes], convert: Callable[[Any], T] = _same
) -> tuple[list[bytes], dict[bytes, T]]:
    """(one key per entry, in order; ``convert(entry)`` of each key not in ``known``).

    Keys are the entries' raw bytes when :func:`split_entries` succeeds and every new
    fragment decodes on its own; otherwise the whole body is decoded and each entry is
    keyed by its canonical JSON. Each entry is converted as soon as it is decoded, so a
    first answer of 10,000 entries never holds all of them as Python objects at once.
    Raises ``ValueError`` for a body that is not JSON and :class:`NotAList` for JSON
    that is not an array.
    """
    parts = split_entries(body)
    if parts is not None:
        decoded: dict[bytes, T] = {}
        try:
            for part in parts:
                if part not in known and part not in decoded:
                    decoded[part] = convert(json.loads(part))
        except ValueError:
            pass  # a cut in the wrong place: fall through to the full decode
        else:
            return parts, decoded
    entries = json.loads(body)
    if not isinstance(entries, list):
        raise NotAList(f"expected a JSON array, got {type(entries).__name__}")
    keys = [json.dumps(entry, sort_keys=True).encode() for entry in entries]
    return keys, {key: convert(entry) for key, entry in zip(keys, entries, strict=True) if key not in known}
