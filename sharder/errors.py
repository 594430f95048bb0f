"""Exceptions raised by the sharder.

    SharderError
    ├── SpecError          a federation spec or inventory that does not validate
    │   └── InventoryError an inventory (static file, registry data) that does not validate
    ├── AssignmentError    input that is valid alone but cannot be assigned
    │                      (a region with targets and no shard, too few shards for r)
    ├── OutputError        an output directory gpufed will not (or cannot) replace
    └── ConfigCheckError   a rendered config that promtool rejects (carries its message)

Every error names the offending field and value, and the file when there is one, so a
user can fix the input without reading a traceback.
"""

from __future__ import annotations

from typing import Any


class SharderError(Exception):
    """Base class for every error the sharder raises on bad input."""


class SpecError(SharderError):
    def __init__(self, message: str, *, field: str = "", value: Any = None, source: str = "") -> None:
        self.field = field
        self.value = value
        self.source = source
        self.reason = message
        parts = [source + ":" if source else "", f"field '{field}'" if field else ""]
        prefix = " ".join(p for p in parts if p)
        shown = f" (value {value!r})" if value is not None else ""
        super().__init__(f"{prefix} {message}{shown}".strip() if prefix else f"{message}{shown}")


class InventoryError(SpecError):
    pass


class AssignmentError(SharderError):
    pass


class OutputError(SharderError):
    pass


class ConfigCheckError(SharderError):
    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)
