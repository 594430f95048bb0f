"""Pure renderer: the Prometheus and Loki datasources, linked both ways by ``node``.

- Prometheus -> Loki: a *correlation* on the Prometheus datasource (Grafana 10+ provisions
  them in the datasource file, ``correlations:``; grafana/grafana
  pkg/services/provisioning/datasources/types.go@01c83423, ``Correlations``, and
  pkg/services/correlations/models.go@02083e2a, ``CorrelationConfig``). In Explore, a
  result's ``node`` field gets a link that runs the node's LogQL in Loki.
- Loki -> Prometheus: a *derived field* on the Loki datasource (``jsonData.derivedFields``,
  ``matcherType: label``) on the stream's ``node`` label, an internal link that runs the
  node's GPU utilisation in Prometheus.

Datasource uids are fixed (``gpufed``, ``loki``) because dashboards, correlations, derived
fields and the relay's Explore links all name them.
"""

from __future__ import annotations

from typing import Any

from logs.explore import LOKI_UID, node_query

PROMETHEUS_UID = "gpufed"
#: The query a Loki line's node opens in Prometheus (the GPU exporter's utilisation).
NODE_METRICS = 'max by (node, gpu) (DCGM_FI_DEV_GPU_UTIL{node="${__value.raw}"})'


def prometheus_datasource(url: str) -> dict[str, Any]:
    return {
        "name": "gpufed",
        "uid": PROMETHEUS_UID,
        "type": "prometheus",
        "access": "proxy",
        "url": url,
        "isDefault": True,
        "editable": False,
        "jsonData": {"httpMethod": "POST", "timeInterval": "15s"},
        "correlations": [
            {
                "targetUID": LOKI_UID,
                "label": "Logs of this node",
                "description": "The node's journal (kernel, XID, fabric manager, kubelet) and container logs",
                "config": {
                    "type": "query",
                    "field": "node",
                    "target": {"expr": node_query("${node}", node_is_template=True), "queryType": "range"},
                },
            }
        ],
    }


def loki_datasource(url: str, *, tenant: str = "") -> dict[str, Any]:
    """``tenant``: Loki with ``auth_enabled`` wants ``X-Scope-OrgID`` on every query."""
    source: dict[str, Any] = {
        "name": "loki",
        "uid": LOKI_UID,
        "type": "loki",
        "access": "proxy",
        "url": url,
        "isDefault": False,
        "editable": False,
        "jsonData": {
            "maxLines": 1000,
            "derivedFields": [
                {
                    "name": "node",
                    "matcherType": "label",
                    "matcherRegex": "node",
                    "datasourceUid": PROMETHEUS_UID,
                    "url": NODE_METRICS,
                    "urlDisplayLabel": "GPU metrics of ${__value.raw}",
                }
            ],
        },
    }
    if tenant:
        source["jsonData"]["httpHeaderName1"] = "X-Scope-OrgID"
        source["secureJsonData"] = {"httpHeaderValue1": tenant}
    return source


def datasources_file(
    *, prometheus_url: str | None, loki_url: str | None, loki_tenant: str = ""
) -> dict[str, Any]:
    """Either datasource may be absent (no master or Thanos to query; no logs tier): the
    links towards an absent one are left out."""
    sources: list[dict[str, Any]] = []
    if prometheus_url is not None:
        sources.append(prometheus_datasource(prometheus_url))
        if loki_url is None:
            del sources[0]["correlations"]
    if loki_url is not None:
        sources.append(loki_datasource(loki_url, tenant=loki_tenant))
        if prometheus_url is None:
            del sources[-1]["jsonData"]["derivedFields"]
    return {"apiVersion": 1, "datasources": sources}
