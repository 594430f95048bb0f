"""Prometheus relabelling (``replace`` and ``keep``), as Promtail applies ``relabel_configs``
to a target's discovered labels: enough to compute the labels a rendered config gives a
journal entry. Semantics of prometheus/prometheus model/relabel/relabel.go: source values
joined by ``separator``, the regex anchored at both ends, ``replace`` writes the expanded
replacement (an empty result deletes the target label), ``keep`` drops a non-match; labels
starting with ``__`` are dropped after relabelling.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """The final label set, or None when a ``keep`` rule drops the target."""
    out = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(out.get(name, "") for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is None:
                continue
            # An empty ${VAR} leaves ``replacement:`` null, which yaml.v2 decodes as "".
            replacement = rule.get("replacement", "$1") or ""
            result = match.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", replacement))
            if result:
                out[rule["target_label"]] = result
            else:
                out.pop(rule["target_label"], None)
        else:
            raise NotImplementedError(f"relabel action {action!r}")
    return {k: v for k, v in out.items() if not k.startswith("__")}
