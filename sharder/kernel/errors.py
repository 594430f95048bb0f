"""Exceptions raised by the sharder.

    SharderError
    ├── SpecError          a federation spec or inventory that does not validate
    │   └── InventoryError an inventory (static file, registry data) that does not validate
    ├── AssignmentError    input that is valid alone but cannot be assigned
    │                      (a region with targets and no shard, too few shards for r)
    │   └── MassRemovalError  a change that would drop more targets than allowed at once
    ├── OutputError        an output directory gpufed will not (or cannot) replace
    │   └── LockedError    another run holds the output's lock
    └── ConfigCheckError   a rendered config that promtool rejects (carries its message)

Every error names the offending field and value, and the file when there is one, so a
user can fix the input without reading a traceback. Values and field paths are echoed
through :func:`preview`, which caps their size: an error about a 10 MB string, or about a
structure that aliases expand to gigabytes, is still one short line.
"""

from __future__ import annotations

import reprlib
from typing import Any

from sharder.kernel import secrets

MAX_SHOWN = 120
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring, _repr.maxother, _repr.maxlong = MAX_SHOWN, MAX_SHOWN, 40


def preview(value: Any, *, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` bounded in size and in the work it takes, for error messages."""
    try:
        text = _repr.repr(value)
    except Exception:  # a value whose repr fails still gets a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clip(text: str, *, limit: int = MAX_SHOWN) -> str:
    """A field path or name from the input, cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SharderError(Exception):
    """Base class for every error the sharder raises on bad input."""


class SpecError(SharderError):
    def __init__(self, message: str, *, field: str = "", value: Any = None, source: str = "") -> None:
        self.field = field
        self.value = value
        self.source = source
        message = clip(message, limit=3 * MAX_SHOWN)
        self.reason = message
        parts = [source + ":" if source else "", f"field '{clip(field)}'" if field else ""]
        prefix = " ".join(p for p in parts if p)
        value = secrets.shown(value, field=field)
        if isinstance(value, secrets.Shape):
            shown = f" (value: {value})"  # the value's shape; a secret never appears in output
        else:
            shown = f" (value {preview(value)})" if value is not None else ""
        super().__init__(f"{prefix} {message}{shown}".strip() if prefix else f"{message}{shown}")


class InventoryError(SpecError):
    pass


class AssignmentError(SharderError):
    pass


class MassRemovalError(AssignmentError):
    pass


class OutputError(SharderError):
    pass


class LockedError(OutputError):
    pass


class ConfigCheckError(SharderError):
    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)
