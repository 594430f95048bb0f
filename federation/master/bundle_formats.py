"""Part of the one bundle check: files no binary here can check, parsed strictly instead.

``federation.master.pipeline.check_bundle`` runs promtool and amtool where they apply and this
for the rest: Promtail, Loki and Loki-ruler files (``logs.formats``) and Grafana's
provisioning files (``federation.grafana.formats``), so a render, the controller's
publisher and the demo refuse a bad one before the tree is swapped, as they refuse a
config promtool rejects. A refusal is a ``ConfigCheckError`` naming the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import yaml

from federation.grafana.formats import parse_datasources, parse_providers
from logs.formats import parse_loki, parse_promtail, parse_rules
from sharder.kernel.errors import ConfigCheckError
from sharder.kernel.output import Bundle

#: Only files under these have a model; the check never looks at the (large) target lists.
PREFIXES = ("logs/", "grafana/provisioning/")


def _yaml(parse: Callable[..., Any]) -> Callable[[bytes, str], Any]:
    return lambda data, source: parse(yaml.safe_load(data), source=source)


def _checker(path: str) -> Callable[[bytes, str], Any] | None:
    if path == "logs/promtail.yml":
        return lambda data, source: parse_promtail(data, source=source)
    if path.startswith("logs/loki") and path.endswith(".yml"):
        return lambda data, source: parse_loki(data, source=source)
    if path.startswith("logs/rules/") and path.endswith(".yml"):
        return lambda data, source: parse_rules(data, source=source)
    if path.startswith("grafana/provisioning/datasources/"):
        return _yaml(parse_datasources)
    if path.startswith("grafana/provisioning/dashboards/"):
        return _yaml(parse_providers)
    return None


def check_formats(bundle: Bundle, paths: Iterable[str]) -> int:
    """Parse every file of ``paths`` that has a format model; returns how many were checked."""
    checked = 0
    for path in paths:
        check = _checker(path)
        if check is None:
            continue
        try:
            check(bundle[path], path)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigCheckError(str(exc), path=path) from exc
        checked += 1
    return checked
