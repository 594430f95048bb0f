"""Redaction of secrets in what the API shows: rendered files reference secrets, never hold them
(the spec refuses literals, ``sharder.kernel.secrets``), but a value under a secret-looking name that
is not a reference is masked anyway, by the same list the spec, the logs and the audit use."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import yaml

from federation.controller.http import url_scan
from sharder.kernel import secrets

MASK = secrets.MASK


HEADER_VALUES = frozenset({"values", "secrets"})
"""Prometheus' ``http_headers: {NAME: {values: [...], secrets: [...], files: [...]}}``: under a
credential's header name, these lists hold the credential itself (``files`` name paths)."""


def _masked(item: Any) -> tuple[Any, bool]:
    if isinstance(item, str) and item and not secrets.is_reference(item):
        return MASK, True
    return item, False


def _walk(value: Any) -> tuple[Any, bool]:
    changed = False
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            secret = isinstance(key, str) and secrets.is_secret_name(key) and not key.endswith("_file")
            if secret and isinstance(item, str):  # a path (``_file``) names where the secret is
                out[key], sub = _masked(item)
            elif secret and isinstance(item, dict) and HEADER_VALUES & item.keys():
                header = dict(item)
                sub = False
                for name in HEADER_VALUES & item.keys():
                    if isinstance(item[name], list):
                        pairs = [_masked(v) for v in item[name]]
                        header[name] = [v for v, _ in pairs]
                        sub = sub or any(c for _, c in pairs)
                out[key] = header
            else:
                out[key], sub = _walk(item)
            changed = changed or sub
        return out, changed
    if isinstance(value, list):
        items = [_walk(v) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    if isinstance(value, str):
        masked = redact_text(value)
        return masked, masked != value
    return value, False


def redact_text(text: str) -> str:
    """URL userinfo, secret-looking query parameters, webhook URLs whose path is the credential
    and scheme-less ``user:password@host`` in free text (log lines, errors) masked."""
    return secrets.mask_userinfo(url_scan.substitute(text, lambda url: secrets.mask_url(url, MASK)), MASK)


def mask_labels(labels: dict[str, str]) -> dict[str, str]:
    """Target labels as every response serves them (the registry, ``explain``, HTTP SD)."""
    return secrets.mask_labels(labels, MASK)


def shapes_only(errors: list[Any]) -> list[Any]:
    """Error rows (``field``, ``value``, ``message``) with each value's shape where it holds a
    credential, and the message masked: an error never echoes a secret."""
    out = []
    for row in errors:
        if isinstance(row, dict):
            row = dict(row)
            value = row.get("value")
            if isinstance(value, str):
                shown = secrets.shown(value, field=str(row.get("field") or ""))
                if shown == value and redact_text(value) != value:  # a credential inside a quote
                    shown = secrets.Shape(secrets.shape(value))
                row["value"] = str(shown)
            if isinstance(row.get("message"), str):
                row["message"] = redact_text(row["message"])
        out.append(row)
    return out


def redact_data(value: Any) -> Any:
    """Parsed data (an audit entry, a status) with secret values masked."""
    return _walk(value)[0]


class RedactingFilter(logging.Filter):
    """Masks URL credentials in every log record that passes a handler (installed by ``serve``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


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


class MaskedFiles:
    """``redact_file`` once per published version of a file: a repeat read costs a copy.

    Keyed by path; a hit needs the very bytes object the publisher holds (``is``), so a
    republished file is masked afresh and nothing is compared byte by byte. Paths the
    publisher no longer holds are dropped, so the cache is as big as the published tree.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[bytes, bytes]] = {}
        self._lock = threading.Lock()

    def get(self, files: Mapping[str, bytes], path: str) -> bytes:
        raw = files[path]
        hit = self._cache.get(path)
        if hit is not None and hit[0] is raw:
            return hit[1]
        masked = redact_file(path, raw)
        with self._lock:
            if len(self._cache) >= len(files):
                self._cache = {p: v for p, v in self._cache.items() if p in files}
            self._cache[path] = (raw, masked)
        return masked
