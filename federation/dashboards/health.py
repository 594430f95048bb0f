"""The **federation health** dashboard: is the monitoring itself working?

Sources, all read at the master tier:

* children's scrape results (``up``, ``scrape_*``), remote-written with the child's
  ``cluster``/``region``/``shard``/``replica`` external labels, so "per child" means
  per ``(shard, replica)``; ``shard!=""`` leaves out what the master scrapes itself.
  These panels are per child on purpose, so they keep both labels: during a hand-over a
  moving target counts on its old and its new child, as both scrape it;
* each child Prometheus' own metrics (``prometheus_remote_storage_*``, ``prometheus_sd_*``,
  agent/TSDB series) from the master's meta-monitoring job, named ``gpufed-child*`` as
  in ``federation/rules/federation.yml``, whose targets carry ``shard``/``region``/
  ``replica`` labels;
* the controller (``gpufed_controller_*``) and discovery (``gpufed_discovery_*``);
* Alertmanager's own metrics, the master's notifier (``prometheus_notifications_*``) and
  the DingTalk relay (``gpufed_dingtalk_*``, ``alertmanager/dingtalk/metrics.py``).
"""

from __future__ import annotations

from typing import Any

from federation.dashboards.grafana import Dashboard, Panel, Query, Row, Variable

TARGETS = 'job!~"gpufed-child.*|gpufed-heartbeat", shard!="", region=~"$region", shard=~"$shard"'
CHILD = 'job=~"gpufed-child.*", region=~"$region", shard=~"$shard"'
UP_MAP = (("1", "Up", "green"), ("0", "Down", "red"))
CONTROLLER = ("Source: the gpufed controller (`gpufed serve`, metric {name}); no data while it is "
              "not scraped.")
DISCOVERY = "Source: gpufed discovery in the controller (metric {name}); no data while it is not scraped."
RELAY = "Source: the DingTalk relay's /metrics (metric {name}); no data while it is not scraped."


def _ts(title: str, queries: tuple[Query, ...], description: str, **kw: Any) -> Panel:
    return Panel(title, "timeseries", queries, description, **kw)


def federation_dashboard() -> Dashboard:
    shards = Row("Shards and targets", (
        _ts("Targets per shard (controller)", (Query(
            'sum by (shard) (max by (shard) (gpufed_controller_targets{shard=~"$shard"}))', "{{shard}}"),),
            "Targets the controller assigned to each shard. "
            + CONTROLLER.format(name="gpufed_controller_targets{shard}"), width=8),
        _ts("Targets scraped per child", (Query(
            f"count by (shard, replica) (up{{{TARGETS}}})", "{{shard}}/{{replica}}"),),
            "Targets each child actually scrapes (its `up` series). A child scraping a different count "
            "than its shard was assigned has a stale target list; during a hand-over a moving target "
            "counts on both its old and its new shard.", width=8),
        _ts("Scrape success per child", (Query(
            f"avg by (shard, replica) (up{{{TARGETS}}})", "{{shard}}/{{replica}}"),),
            "Share of each child's targets answering scrapes (mean of `up`).", unit="percentunit",
            min=0, max=1, width=8),
        Panel("Targets down", "table", (Query(
            f"max by (shard, replica, job, node, instance) (up{{{TARGETS}}} unless gpufed:up_copy:silent"
            f" or gpufed:up_copy:silent{{{TARGETS}}} * 0) == 0", instant=True),),
            "Targets not answering scrapes, or unknown (their child's samples stopped reaching the master:"
            " rule pack freshness records), with the child that owns them. Empty when every target is up.",
            width=12, height=6),
        _ts("Scrape duration (slowest target) per child", (Query(
            f"max by (shard, replica) (scrape_duration_seconds{{{TARGETS}}})", "{{shard}}/{{replica}}"),),
            "Slowest scrape on each child; near the scrape timeout means lost samples.", unit="s",
            width=12, height=6),
        _ts("Samples per scrape round per child", (Query(
            f"sum by (shard, replica) (scrape_samples_post_metric_relabeling{{{TARGETS}}})",
            "{{shard}}/{{replica}}"),), "Samples kept after metric relabelling, summed over the child's "
            "targets: the child's ingest per scrape interval.", width=12),
        _ts("Hand-overs", (
            Query("sum(gpufed_controller_handovers_in_flight)", "in flight"),
            Query("sum by (result) (increase(gpufed_controller_handovers_total[$__rate_interval]))",
                  "completed ({{result}})"),
        ), "Targets moving between shards: in flight (old and new owner both scrape during the grace "
           "period) and finished hand-overs by result. "
           + CONTROLLER.format(name="gpufed_controller_handovers_in_flight, _handovers_total"),
            width=12),
    ))
    children = Row("Child Prometheus servers", (
        Panel("Child up", "stat", (Query(f"max by (shard, replica) (up{{{CHILD}}})", "{{shard}}/{{replica}}",
                                         instant=True),),
              "Whether the master's meta-monitoring job (gpufed-child*) reaches each child.",
              mappings=UP_MAP, thresholds=(("red", None), ("green", 1.0)), width=8, height=6),
        Panel("Config reload", "stat", (Query(
            f"max by (shard, replica) (prometheus_config_last_reload_successful{{{CHILD}}})",
            "{{shard}}/{{replica}}", instant=True),), "1 when the child's last config reload worked; "
            "a failed reload leaves it on its old targets.", mappings=(("1", "OK", "green"),
                                                                       ("0", "Failed", "red")),
            thresholds=(("red", None), ("green", 1.0)), width=8, height=6),
        _ts("Active series per child", (Query(
            f"max by (shard, replica) (prometheus_agent_active_series{{{CHILD}}})"
            f" or max by (shard, replica) (prometheus_tsdb_head_series{{{CHILD}}})",
            "{{shard}}/{{replica}}"),),
            "Series held by each child: agent mode's prometheus_agent_active_series, else the TSDB head.",
            width=8, height=6),
        _ts("Service discovery errors per child", (Query(
            f"sum by (shard, replica) (rate(prometheus_sd_http_failures_total{{{CHILD}}}[$__rate_interval]))"
            f" or sum by (shard, replica) (rate(prometheus_sd_file_read_errors_total{{{CHILD}}}"
            f"[$__rate_interval]))", "{{shard}}/{{replica}}"),),
            "HTTP SD (from the controller) or file SD read failures per second. While they fail the "
            "child keeps its last target list.", unit="ops", width=24, height=6),
    ))
    lag = (
        "max by (shard, replica, remote_name) ("
        f"prometheus_remote_storage_highest_timestamp_in_seconds{{{CHILD}}}"
        f" - ignoring(remote_name, url) group_right"
        f" prometheus_remote_storage_queue_highest_sent_timestamp_seconds{{{CHILD}}})"
    )
    remote = Row("remote_write", (
        _ts("remote_write lag", (Query(lag, "{{shard}}/{{replica}} → {{remote_name}}"),),
            "Newest sample ingested minus newest sample sent, per child and remote (the "
            "PrometheusRemoteWriteBehind alert fires above 120 s for 10 minutes).", unit="s",
            thresholds=(("green", None), ("orange", 60.0), ("red", 120.0))),
        _ts("Samples sent", (Query(
            f"sum by (shard, replica, remote_name) (rate(prometheus_remote_storage_samples_total{{{CHILD}}}"
            f"[$__rate_interval]))", "{{shard}}/{{replica}} → {{remote_name}}"),),
            "Samples per second each child sends.", unit="ops"),
        _ts("remote_write failures", (
            Query("sum by (shard, replica, remote_name) ("
                  f"rate(prometheus_remote_storage_samples_failed_total{{{CHILD}}}[$__rate_interval]))",
                  "{{shard}}/{{replica}} failed"),
            Query("sum by (shard, replica, remote_name) ("
                  f"rate(prometheus_remote_storage_samples_retried_total{{{CHILD}}}[$__rate_interval]))",
                  "{{shard}}/{{replica}} retried"),
            Query("sum by (shard, replica, remote_name) ("
                  f"rate(prometheus_remote_storage_samples_dropped_total{{{CHILD}}}[$__rate_interval]))",
                  "{{shard}}/{{replica}} dropped"),
        ), "Samples per second that failed for good (lost), were retried, or were dropped by relabelling.",
            unit="ops"),
        _ts("Pending samples and shards", (
            Query("sum by (shard, replica, remote_name) "
                  f"(prometheus_remote_storage_samples_pending{{{CHILD}}})",
                  "{{shard}}/{{replica}} pending"),
            Query(f"max by (shard, replica, remote_name) (prometheus_remote_storage_shards{{{CHILD}}})",
                  "{{shard}}/{{replica}} shards"),
        ), "Samples queued for sending and the number of parallel send shards; both rising together "
           "means the receiver cannot keep up."),
        _ts("Master: remote-write requests received", (Query(
            'sum by (code) (rate(prometheus_http_requests_total{handler="/api/v1/write"}[$__rate_interval]))',
            "HTTP {{code}}"),), "Write requests the master Prometheus (remote-write receiver) answered, by "
            "status code. No data when the master is Thanos Receive or does not scrape itself.",
            unit="reqps", width=24, height=6),
    ))
    discovery = Row("Discovery", (
        _ts("Time since last successful discovery", (Query(
            "time() - max by (source) (gpufed_discovery_last_success_timestamp_seconds)", "{{source}}"),),
            "Seconds since each registry source (file, Consul, Kubernetes) last listed targets; while a "
            "source fails the controller keeps its last known targets. "
            + DISCOVERY.format(name="gpufed_discovery_last_success_timestamp_seconds{source}"), unit="s",
            thresholds=(("green", None), ("orange", 120.0), ("red", 600.0))),
        _ts("Discovery errors", (Query(
            "sum by (source, reason) (increase(gpufed_discovery_errors_total[$__rate_interval]))",
            "{{source}}: {{reason}}"),),
            DISCOVERY.format(name="gpufed_discovery_errors_total{source,reason}")),
    ))
    alerting = Row("Alerting", (
        _ts("Firing alerts by component", (Query(
            'count by (component, severity) (ALERTS{alertstate="firing"})', "{{component}} {{severity}}"),),
            "Alerts the master's rule evaluation holds firing (rule pack federation/rules).", width=8,
            stacked=True),
        _ts("Alerts sent to Alertmanager", (
            Query("sum by (alertmanager) (rate(prometheus_notifications_sent_total[$__rate_interval]))",
                  "sent to {{alertmanager}}"),
            Query("sum by (alertmanager) (rate(prometheus_notifications_errors_total[$__rate_interval]))",
                  "errors to {{alertmanager}}"),
        ), "Alert notifications the master's notifier sent per Alertmanager, and errors.", unit="ops",
            width=8),
        _ts("Alertmanager notifications", (
            Query("sum by (integration) (rate(alertmanager_notifications_total[$__rate_interval]))",
                  "{{integration}} sent"),
            Query("sum by (integration) (rate(alertmanager_notifications_failed_total[$__rate_interval]))",
                  "{{integration}} failed"),
        ), "Notifications per integration (gpufed routes to DingTalk through the webhook integration), "
           "summed over the HA replicas.", unit="ops", width=8),
        _ts("Alertmanager alerts", (Query(
            "max by (state) (alertmanager_alerts)", "{{state}}"),),
            "Alerts each Alertmanager holds, by state (the HA replicas hold the same set).", width=12),
        _ts("Alertmanager cluster members", (Query(
            "min by (instance) (alertmanager_cluster_members)", "{{instance}}"),),
            "Gossip peers each replica sees; fewer than the replica count means a split cluster that "
            "can send duplicate notifications (the relay drops them).", width=12),
    ))
    dingtalk = Row("DingTalk relay", (
        _ts("DingTalk messages sent", (
            Query("sum by (robot) (rate(gpufed_dingtalk_messages_sent_total[$__rate_interval]))",
                  "{{robot}} messages"),
            Query("sum by (robot) (rate(gpufed_dingtalk_alerts_sent_total[$__rate_interval]))",
                  "{{robot}} alerts"),
        ), "Messages DingTalk accepted and the alerts inside them. "
           + RELAY.format(name="gpufed_dingtalk_messages_sent_total"), unit="ops", width=8),
        _ts("DingTalk send failures", (Query(
            "sum by (robot, kind, reason) (increase(gpufed_dingtalk_send_failures_total[$__rate_interval]))",
            "{{robot}} {{kind}}: {{reason}}"),),
            "Messages DingTalk did not take, by kind and reason; a series appears with the first failure. "
            + RELAY.format(name="gpufed_dingtalk_send_failures_total"), width=8),
        _ts("DingTalk throttling", (
            Query("sum by (robot) (increase(gpufed_dingtalk_throttled_total[$__rate_interval]))",
                  "{{robot}} throttled (503)"),
            Query("sum by (robot) (gpufed_dingtalk_queued_messages)", "{{robot}} queued"),
            Query("sum by (robot) (increase(gpufed_dingtalk_merged_parts_total[$__rate_interval]))",
                  "{{robot}} merged"),
        ), "Webhooks answered 503 because DingTalk's 20-messages-a-minute limit left no slot in time, "
           "message parts waiting for a slot, and parts merged into another message. "
           + RELAY.format(name="gpufed_dingtalk_throttled_total"), width=8),
        _ts("Relay webhook latency", (Query(
            "histogram_quantile(0.99, sum by (le, robot) (rate(gpufed_dingtalk_webhook_seconds_bucket"
            "[$__rate_interval])))", "{{robot}} p99"),),
            "99th percentile time to handle an Alertmanager webhook; Alertmanager gives up after 10 s. "
            "A robot's series appears with its first webhook. "
            + RELAY.format(name="gpufed_dingtalk_webhook_seconds"), unit="s", width=8),
        _ts("Duplicates dropped", (Query(
            "sum by (robot) (increase(gpufed_dingtalk_dedup_dropped_total[$__rate_interval]))",
            "{{robot}}"),),
            "Notifications dropped because another Alertmanager replica already sent them. "
            + RELAY.format(name="gpufed_dingtalk_dedup_dropped_total"), width=8),
        _ts("Relay config reloads", (Query(
            "sum by (result) (increase(gpufed_dingtalk_config_reloads_total[$__rate_interval]))",
            "{{result}}"),), "Config reloads (SIGHUP) by result; a failed reload keeps the old config. "
            + RELAY.format(name="gpufed_dingtalk_config_reloads_total"), width=8),
        _ts("Info digests", (
            Query("sum by (robot) (increase(gpufed_dingtalk_digests_sent_total[$__rate_interval]))",
                  "{{robot}} sent"),
            Query("sum (increase(gpufed_dingtalk_digest_email_failures_total[$__rate_interval]))",
                  "e-mail kept for the next try"),
            Query("sum by (outcome) (increase("
                  "gpufed_dingtalk_digest_email_refused_recipients_total[$__rate_interval]))",
                  "recipients refused: {{outcome}}"),
        ), "Digests sent (robot \"@email\": the e-mail), e-mails the smarthost took for nobody (kept), and "
           "recipients it refused: deferred (4xx, sent to them alone at the next check) or final (5xx, "
           "never sent). " + RELAY.format(name="gpufed_dingtalk_digests_sent_total"), width=8),
    ))
    return Dashboard(
        uid="gpufed-federation", title="gpufed / Federation health",
        description="Shards, targets, child Prometheus servers, remote_write, discovery, hand-overs and "
                    "the alerting path (Alertmanager, DingTalk relay).",
        tags=("gpufed", "federation"),
        variables=(
            Variable("region", "Region", 'up{shard!=""}'),
            Variable("shard", "Shard", 'up{shard!="", region=~"$region"}'),
        ),
        rows=(shards, children, remote, discovery, alerting, dingtalk),
    )
