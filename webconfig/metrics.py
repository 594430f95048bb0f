"""The web config's refusals as Prometheus metrics, one collector for every gpufed server.

``WebCollector(served)`` reads the counts that ``Served``'s TLS context and guard keep (a
client_python custom collector: its data source is the constructor argument, nothing is
registered at import). Each server registers it in its own registry, so
``gpufed serve``, ``gpufed-exporter`` and ``gpufed-dingtalk`` expose the same names:

- ``gpufed_web_tls_handshake_failures_total{reason}`` and
  ``gpufed_web_tls_certificate_reloads_total``, when ``tls_server_config`` is set;
- ``gpufed_web_auth_failures_total{reason}``, when ``basic_auth_users`` is set;
- ``gpufed_web_rate_limited_requests_total``, when ``rate_limit`` is set.

A family is exported only where its part of the file is configured, and then every reason
from zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from webconfig.refusals import AUTH_REASONS, HANDSHAKE_REASONS, RATE_LIMITED

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from webconfig.serving import Served


class WebCollector(Collector):
    def __init__(self, served: Served) -> None:
        self._served = served

    def collect(self) -> Iterator[Metric]:
        served = self._served
        if served.tls is not None:
            failures = served.tls.handshake_failures.snapshot()
            family = CounterMetricFamily(
                "gpufed_web_tls_handshake_failures",
                "TLS handshakes refused by this server, by reason (--web.config.file).",
                labels=["reason"])
            for reason in HANDSHAKE_REASONS:
                family.add_metric([reason], failures[reason])
            yield family
            yield CounterMetricFamily(
                "gpufed_web_tls_certificate_reloads",
                "Times the server certificate, key or client CA was reloaded after a change on disk.",
                value=served.tls.reloads)
        refused = served.guard.refused.snapshot()
        if served.config.basic_auth_users:
            family = CounterMetricFamily(
                "gpufed_web_auth_failures",
                "Requests refused by basic auth (--web.config.file basic_auth_users), by reason.",
                labels=["reason"])
            for reason in AUTH_REASONS:
                family.add_metric([reason], refused[reason])
            yield family
        if served.config.rate_limit is not None:
            yield CounterMetricFamily(
                "gpufed_web_rate_limited_requests",
                "Requests refused with 429 by the web config's rate_limit.",
                value=refused[RATE_LIMITED])
