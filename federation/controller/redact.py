"""Redaction of secrets in what the API shows: rendered files reference secrets, never hold them,
but a value under a secret-looking key that is not a reference is masked anyway."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

SECRET_KEY = re.compile(r"(password|secret|token|credentials|access_key|secret_key|api_key)$", re.I)
REFERENCE = re.compile(r"^(\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?][^}]*)?\}|\$\([A-Za-z_][A-Za-z0-9_]*\))$")
MASK = "<redacted>"
URL_SECRET = re.compile(r"((?:access_token|token|secret|password|sign)=)(?!\$\{|\$\()([^&\s\"']+)", re.I)


def _walk(value: Any) -> tuple[Any, bool]:
    changed = False
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if (
                isinstance(key, str)
                and SECRET_KEY.search(key)
                and isinstance(item, str)
                and item
                and not REFERENCE.match(item)
            ):
                out[key], changed = MASK, True
            else:
                out[key], sub = _walk(item)
                changed = changed or sub
        return out, changed
    if isinstance(value, list):
        items = [_walk(v) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    if isinstance(value, str) and URL_SECRET.search(value):
        return URL_SECRET.sub(lambda m: m.group(1) + MASK, value), True
    return value, False


def redact_text(text: str) -> str:
    """Secret-looking query parameters in free text (log lines, error messages) masked."""
    return URL_SECRET.sub(lambda m: m.group(1) + MASK, text)


def redact_file(path: str, content: bytes) -> bytes:
    """``content`` with secret values masked; unchanged bytes when nothing needed masking."""
    try:
        if path.endswith(".json"):
            data, changed = _walk(json.loads(content))
            return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode() if changed else content
        if path.endswith((".yml", ".yaml")):
            data, changed = _walk(yaml.load(content, Loader=yaml.CSafeLoader))
            return yaml.safe_dump(data, sort_keys=True).encode() if changed else content
    except (ValueError, yaml.YAMLError):
        return content
    return content
