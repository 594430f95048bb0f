"""Structured logs: one line per event as logfmt (`key=value`) or JSON, on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time


class StructuredFormatter(logging.Formatter):
    """`ts=... level=... logger=... msg="..."`; JSON when asked, for log shippers."""

    def __init__(self, fmt: str = "logfmt") -> None:
        super().__init__()
        self._json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self._json:
            return json.dumps(fields, sort_keys=False)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: str) -> str:
    """logfmt: bare when safe, JSON-quoted when the value has spaces, quotes or `=`."""
    return json.dumps(value) if not value or any(c in value for c in ' ="\n') else value


def configure(*, level: str = "INFO", fmt: str = "logfmt") -> None:
    """Install the formatter on the root logger; called once from the CLI."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
