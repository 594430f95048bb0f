"""Compose ``deploy.resources`` from a sizing, per kind of service. Pure.

``gpufed render --target compose --fleet-nodes N`` sizes the spec for N nodes
(``federation.sizing.model.size``) and hands this mapping to the compose renderer, which sets
it on each service of that kind. Compose (compose-go) takes ``cpus`` as a decimal string and
``memory`` with a binary unit (``M`` is MiB); ``reservations`` are the model's requests,
``limits`` its limits.
"""

from __future__ import annotations

from typing import Any

from federation.sizing.model import Component, Sizing

#: The model's component -> the compose renderer's kind of service.
KINDS = {
    "child-prometheus": "child",
    "master-prometheus": "master",
    "alertmanager": "alertmanager",
    "dingtalk-relay": "relay",
    "controller": "controller",
    "grafana": "grafana",
}


def _resources(c: Component) -> dict[str, Any]:
    return {
        "limits": {"cpus": f"{c.cpu_limit:g}", "memory": f"{c.memory_limit_mib}M"},
        "reservations": {"cpus": f"{c.cpu_request:g}", "memory": f"{c.memory_request_mib}M"},
    }


def compose_resources(sizing: Sizing) -> dict[str, dict[str, Any]]:
    """Kind of service -> its ``deploy.resources``; kinds the sizing has no component for are absent."""
    return {KINDS[c.name]: _resources(c) for c in sizing.components if c.name in KINDS}
