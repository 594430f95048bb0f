"""The relay's metrics, registered on a registry the app owns (nothing at import time)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RelayMetrics:
    """Per-robot counters behind ``/metrics``; one instance per app."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter("gpufed_dingtalk_messages_sent", "Messages DingTalk accepted.",
                            ["robot"], registry=registry)
        self.alerts_sent = Counter("gpufed_dingtalk_alerts_sent", "Alerts inside accepted messages.",
                                   ["robot"], registry=registry)
        self.failed = Counter("gpufed_dingtalk_send_failures", "Messages DingTalk did not take.",
                              ["robot", "kind", "reason"], registry=registry)
        self.throttled = Counter("gpufed_dingtalk_throttled",
                                 "Webhooks answered 503 because no rate-limit slot came in time.",
                                 ["robot"], registry=registry)
        self.queued = Gauge("gpufed_dingtalk_queued_messages", "Message parts waiting for a slot.",
                            ["robot"], registry=registry)
        self.merged = Counter("gpufed_dingtalk_merged_parts",
                              "Queued parts sent inside another part's message.", ["robot"],
                              registry=registry)
        self.dedup_dropped = Counter("gpufed_dingtalk_dedup_dropped",
                                     "Notifications dropped as duplicates from another replica.",
                                     ["robot"], registry=registry)
        self.stale_dropped = Counter("gpufed_dingtalk_stale_dropped",
                                     "Notifications dropped because every alert in them was older than"
                                     " the state already sent for its group.", ["robot"], registry=registry)
        self.stale_alerts = Counter("gpufed_dingtalk_stale_alerts_dropped",
                                    "Alerts left out of a notification as older than the state already"
                                    " sent for their group (FIRING after RESOLVED).", ["robot"],
                                    registry=registry)
        self.memory_errors = Counter("gpufed_dingtalk_memory_errors",
                                     "Ordering/dedup memory file loads or saves that failed (--data-dir).",
                                     ["op"], registry=registry)
        self.webhook_seconds = Histogram("gpufed_dingtalk_webhook_seconds", "Webhook handling time.",
                                         ["robot"], registry=registry)
        self.digest_alerts = Counter("gpufed_dingtalk_digest_alerts",
                                     "Info alerts (HA copies and repeats included) taken into a robot's"
                                     " digest batch instead of sent.",
                                     ["robot"], registry=registry)
        self.digests_sent = Counter("gpufed_dingtalk_digests_sent",
                                    "Digest messages DingTalk accepted (robot=\"@email\": e-mails the"
                                    " smarthost took).", ["robot"], registry=registry)
        self.digest_email_failures = Counter("gpufed_dingtalk_digest_email_failures",
                                             "E-mail digests the smarthost did not take (kept for the"
                                             " next try).", registry=registry)
        self.digest_email_refused = Counter(
            "gpufed_dingtalk_digest_email_refused_recipients",
            "Recipients the smarthost refused an e-mail digest for while it may have taken it for"
            " others: deferred (4xx, tried again for them alone) or final (5xx, not tried again).",
            ["outcome"], registry=registry)
        for outcome in ("deferred", "final"):
            self.digest_email_refused.labels(outcome)
        self.reloads = Counter("gpufed_dingtalk_config_reloads", "Config reloads by result.",
                               ["result"], registry=registry)

    def init_robot(self, robot: str) -> None:
        """Export zeros for a robot so rate() works before its first event."""
        self.sent.labels(robot)
        self.alerts_sent.labels(robot)
        self.throttled.labels(robot)
        self.queued.labels(robot).set(0)
        self.dedup_dropped.labels(robot)
        self.stale_dropped.labels(robot)
        self.stale_alerts.labels(robot)
        self.merged.labels(robot)
        self.digest_alerts.labels(robot)
        self.digests_sent.labels(robot)
