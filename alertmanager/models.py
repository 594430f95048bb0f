"""Typed alerting spec: the ``alerting`` section of federation.yaml, and nothing else.

``alertmanager.render`` turns it into ``alertmanager.yml`` and the relay's robot file,
``alertmanager.ha`` into per-replica flags. Checks that need the rest of the spec (the
region names) live in ``check_regions`` so this package never imports ``federation``.

    alerting:
      relay_url: http://gpufed-dingtalk:8060
      replicas: [{name: am-0, host: alertmanager-0}, {name: am-1, host: alertmanager-1}]
      robots: [{name: bj-oncall, url: "https://oapi.dingtalk.com/robot/send?access_token=${BJ_TOKEN}"}]
      receivers: [{name: sre, robots: [bj-oncall]}]
      default_receiver: sre
      routes: [{region: cn-beijing, robot: bj-oncall, critical: [sre]}]
      unrouted_critical: all-regions      # or a receiver name
      watchdog: {receiver: deadman}       # a webhook receiver, never a robot
      severity_routes: {critical: [wecom-oncall, sms], warning: [ops-mail]}   # beside the robots
      info_digest: {period: 7d}           # the relay batches info alerts: one message a week

Channels (docs/alerting.md): a receiver may hold DingTalk robots (through the relay),
webhooks (an SMS gateway adapter is one), e-mail and WeCom (Alertmanager's
``wechat_configs``; its secret only as a file, so Alertmanager 0.31 or later). The WeCom
and digest models live in ``alertmanager.channels``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, ValidationInfo, field_validator, model_validator

from alertmanager.channels import WECOM_SECRET_FILE_SINCE, InfoDigestSpec, WeComSpec
from alertmanager.channels import no_env_ref as _no_env_ref
from alertmanager.errors import AlertingError
from sharder.kernel import prometheus_versions, secrets
from sharder.kernel.models import LABEL_NAME_RE, NAME_RE, StrictModel, parse_duration

Severity = Literal["critical", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")
#: Labels the rule pack (federation/rules) sets on every alert it fires. Only these may
#: appear in an inhibition ``equal`` unless the user declares more in guaranteed_labels.
GUARANTEED_LABELS = frozenset({"alertname", "severity", "region", "node", "cluster"})
MATCHER_RE = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|[^"\s]*)\s*$')
RECEIVER_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
HHMM_RE = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$|^24:00$")
_DAY = "(monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
WEEKDAYS_RE = re.compile(rf"^{_DAY}(:{_DAY})?$")


def _positive_duration(value: str) -> str:
    if parse_duration(value) <= 0:
        raise ValueError(f"duration must be above zero: {value!r}")
    return value


def _zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {value!r} (example: Asia/Shanghai)") from exc
    return value


class Timing(StrictModel):
    """Notification pacing of one route node; repeat_interval is one value per node."""

    group_wait: str = "30s"
    group_interval: str = "5m"
    repeat_interval: str = "4h"

    @field_validator("group_wait", "group_interval", "repeat_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        return _positive_duration(value)

    @model_validator(mode="after")
    def _repeat_after_group(self) -> Timing:
        if parse_duration(self.repeat_interval) < parse_duration(self.group_interval):
            raise ValueError(
                f"repeat_interval {self.repeat_interval} is shorter than group_interval "
                f"{self.group_interval}; Alertmanager would repeat only every group_interval"
            )
        return self


class SeverityTiming(Timing):
    """A severity's child route: its pacing and, optionally, when it may notify."""

    active_time_intervals: list[str] = Field(default_factory=list)
    mute_time_intervals: list[str] = Field(default_factory=list)


class SeverityTimings(StrictModel):
    critical: SeverityTiming = SeverityTiming(group_wait="10s", group_interval="1m", repeat_interval="15m")
    warning: SeverityTiming = SeverityTiming(group_wait="30s", group_interval="5m", repeat_interval="2h")
    info: SeverityTiming = SeverityTiming(group_wait="2m", group_interval="30m", repeat_interval="12h")


class TimeRange(StrictModel):
    start_time: str
    end_time: str

    @field_validator("start_time", "end_time")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if not HHMM_RE.match(value):
            raise ValueError(f"expected HH:MM (00:00 to 24:00), got {value!r}")
        return value


class TimeIntervalSpec(StrictModel):
    """A named Alertmanager time interval (``time_intervals`` at the top level)."""

    name: str
    weekdays: list[str] = Field(default_factory=list, description="e.g. monday:friday")
    times: list[TimeRange] = Field(default_factory=list)
    location: str | None = Field(default=None, description="IANA zone, e.g. Asia/Shanghai")

    @field_validator("weekdays")
    @classmethod
    def _weekdays(cls, values: list[str]) -> list[str]:
        for value in values:
            if not WEEKDAYS_RE.match(value):
                raise ValueError(f"not a weekday or range: {value!r} (examples: monday, monday:friday)")
        return values

    @field_validator("location")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        return None if value is None else _zone(value)


class Mentions(StrictModel):
    """Mirrors the relay's ``Mentions``: who a robot @-mentions."""

    mobiles: list[str] = Field(default_factory=list)
    user_ids: list[str] = Field(default_factory=list)
    all_on_critical: bool = False


class RobotSpec(StrictModel):
    """A DingTalk group robot; url and secret may be ``${ENV}`` references the relay expands."""

    name: str
    url: str
    secret: str | None = None
    keywords: list[str] = Field(default_factory=list)
    mentions: Mentions = Field(default_factory=Mentions)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("robot names are lower-case letters, digits and '-' (they are URL segments)")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or "access_token=" not in value:
            raise ValueError("robot url must be http(s) and carry ?access_token=...")
        why = secrets.url_secret(value)
        if why is not None:
            raise ValueError(
                f"{secrets.LITERAL}: {why}; write access_token=${{NAME}} (the relay expands it)"
            )
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and not secrets.is_reference(value):
            raise ValueError(
                f"{secrets.LITERAL}: the robot secret is {secrets.shape(value)};"
                " write ${NAME} (the relay expands it)"
            )
        return value


class WebhookSpec(StrictModel):
    url: str
    send_resolved: bool = True
    max_alerts: int = Field(default=0, ge=0)
    credentials_file: str | None = Field(default=None, description="bearer token read by Alertmanager")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("webhook url must start with http:// or https://")
        why = secrets.url_secret(value)
        if why is not None:
            raise ValueError(
                f"{secrets.LITERAL}: {why}; Alertmanager sends credentials_file as a bearer token"
            )
        return _no_env_ref(value, "webhook url")


class EmailSpec(StrictModel):
    to: str
    sender: str = Field(alias="from")
    smarthost: str
    require_tls: bool = True
    auth_username: str | None = None
    auth_password_file: str | None = None
    send_resolved: bool = False

    @field_validator("to", "sender", "smarthost", "auth_username")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return None if value is None else _no_env_ref(value, "email settings")


class ReceiverSpec(StrictModel):
    """A pass-through receiver: robots (through the relay), webhooks, e-mail and WeCom."""

    name: str
    robots: list[str] = Field(default_factory=list)
    webhooks: list[WebhookSpec] = Field(default_factory=list)
    emails: list[EmailSpec] = Field(default_factory=list)
    wecom: list[WeComSpec] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not RECEIVER_RE.match(value):
            raise ValueError("receiver names are letters, digits, '_', '.' and '-'")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> ReceiverSpec:
        if not (self.robots or self.webhooks or self.emails or self.wecom):
            raise ValueError(f"receiver {self.name!r} has no robots, webhooks, emails or wecom")
        return self


class RegionRouteSpec(StrictModel):
    """One region's subtree: its robot for every severity, plus receivers per severity."""

    region: str
    robot: str
    critical: list[str] = Field(default_factory=list)
    warning: list[str] = Field(default_factory=list)
    info: list[str] = Field(default_factory=list)
    group_by: list[str] | None = None

    def extra(self, severity: Severity) -> list[str]:
        return list(getattr(self, severity))


class InhibitRuleSpec(StrictModel):
    """Source alerts mute target alerts that share every ``equal`` label.

    Rendered with a ``label!=""`` source matcher per ``equal`` label (``inhibit_rule``):
    Alertmanager counts a label two alerts both lack as equal, so a source alert missing
    one would otherwise mute every target alert that misses it too.
    """

    source_matchers: list[str] = Field(min_length=1)
    target_matchers: list[str] = Field(min_length=1)
    equal: list[str] = Field(default_factory=list, validate_default=True)

    @field_validator("equal")
    @classmethod
    def _scoped(cls, values: list[str]) -> list[str]:
        if not values:
            raise ValueError(
                "an inhibition rule needs `equal`: without it ANY matching source alert, in any cluster,"
                " region or node, mutes EVERY matching target alert everywhere. List the labels both"
                " must share, e.g. equal: [cluster, region, node]"
            )
        for value in values:
            if not LABEL_NAME_RE.match(value):
                raise ValueError(f"not a valid label name in equal: {value!r}")
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"equal lists {dupes} more than once")
        return values

    @field_validator("source_matchers", "target_matchers")
    @classmethod
    def _matchers(cls, values: list[str]) -> list[str]:
        for value in values:
            if not MATCHER_RE.match(value):
                raise ValueError(f'not a matcher: {value!r} (examples: severity="critical", node=~"bj-.*")')
        return values


class ReplicaSpec(StrictModel):
    """One Alertmanager of the HA set; peers gossip on cluster_port."""

    name: str
    host: str
    port: int = Field(default=9093, ge=1, le=65535)
    cluster_port: int = Field(default=9094, ge=1, le=65535)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def cluster_address(self) -> str:
        return f"{self.host}:{self.cluster_port}"


class WatchdogSpec(Timing):
    """The dead man's switch: an always-firing alert re-sent to a heartbeat receiver.

    Its route comes first, so the alert never reaches an on-call robot whatever labels it
    carries. Without ``receiver`` it goes to a receiver with no integrations: kept off the
    robots, but then nothing notices when it stops; point it at a dead man's switch.
    """

    alertname: str = "Watchdog"
    receiver: str | None = Field(default=None, description="heartbeat receiver (webhook/email, no robots)")
    group_wait: str = "10s"
    group_interval: str = "1m"
    repeat_interval: str = "1m"


class SeverityRoutesSpec(StrictModel):
    """Receivers every alert of a severity reaches, whatever its region, beside its robot.

    Rendered as routes with ``continue: true`` ahead of the region routes, one per receiver,
    so the alert goes on to its region's robot (and that route's receivers) as before.
    """

    critical: list[str] = Field(default_factory=list)
    warning: list[str] = Field(default_factory=list)
    info: list[str] = Field(default_factory=list)

    def of(self, severity: Severity) -> list[str]:
        return list(getattr(self, severity))

    @model_validator(mode="after")
    def _once(self) -> SeverityRoutesSpec:
        for sev in SEVERITIES:
            names = self.of(sev)
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{sev} lists receivers {dupes} more than once")
        return self


#: ``unrouted_critical`` value: page every region's critical receivers (and the default one).
ALL_REGIONS = "all-regions"
UNROUTED_CRITICAL_RECEIVER = "unrouted-critical"
WATCHDOG_NULL_RECEIVER = "watchdog-null"


def region_receiver(region: str) -> str:
    """The receiver every alert of a region reaches: its DingTalk robot."""
    return f"{region}-dingtalk"


def severity_receiver(region: str, severity: Severity) -> str:
    """The region's receiver for one severity, when that severity adds receivers."""
    return f"{region}-{severity}"


DEFAULT_INHIBIT_RULES = (
    # A node that is down takes its GPU alerts with it; page for the node, not 8 GPUs.
    InhibitRuleSpec(
        source_matchers=['alertname="NodeDown"'],
        target_matchers=['component="gpu"'],
        equal=["cluster", "region", "node"],
    ),
    InhibitRuleSpec(
        source_matchers=['severity="critical"'],
        target_matchers=['severity=~"warning|info"'],
        equal=["alertname", "cluster", "region", "node"],
    ),
)


class AlertingSpec(StrictModel):
    relay_url: str = Field(default="http://gpufed-dingtalk:8060", description="as Alertmanager reaches it")
    relay_listen: str = "0.0.0.0:8060"
    external_url: str | None = Field(
        default=None,
        description="--web.external-url of every replica: where users open Alertmanager (message links)",
    )
    timezone: str = "Asia/Shanghai"
    replicas: list[ReplicaSpec] = Field(min_length=1)
    group_by: list[str] = Field(default_factory=lambda: ["alertname", "region", "cluster"])
    guaranteed_labels: list[str] = Field(default_factory=list, description="set on every alert by you")
    timing: Timing = Field(default_factory=Timing, description="root route; alerts without severity")
    severities: SeverityTimings = Field(default_factory=SeverityTimings)
    time_intervals: list[TimeIntervalSpec] = Field(default_factory=list)
    robots: list[RobotSpec] = Field(default_factory=list)
    receivers: list[ReceiverSpec] = Field(min_length=1)
    default_receiver: str = Field(description="alerts of no routed region")
    routes: list[RegionRouteSpec] = Field(default_factory=list)
    unrouted_critical: str = Field(
        default=ALL_REGIONS,
        description="critical alerts whose region no route matches (missing, empty, unknown, mis-cased):"
                    f" '{ALL_REGIONS}' pages every region's critical receivers and the default receiver;"
                    " or the name of one receiver",
    )
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    severity_routes: SeverityRoutesSpec = Field(
        default_factory=SeverityRoutesSpec,
        description="receivers each severity reaches in every region, beside the region's robot",
    )
    info_digest: InfoDigestSpec | None = Field(
        default=None, description="the relay sends info alerts as one digest a period per robot")
    default_inhibit_rules: bool = True
    inhibit_rules: list[InhibitRuleSpec] = Field(default_factory=list)

    @field_validator("relay_url")
    @classmethod
    def _relay_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("relay_url must start with http:// or https://")
        return _no_env_ref(value, "relay_url").rstrip("/")

    @field_validator("external_url")
    @classmethod
    def _external_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"external_url must start with http:// or https://, got {value[:64]!r}")
        return None if value is None else _no_env_ref(value, "external_url").rstrip("/")

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        return _zone(value)

    @field_validator("group_by", "guaranteed_labels")
    @classmethod
    def _labels(cls, values: list[str]) -> list[str]:
        if values == ["..."]:
            return values  # explicit opt-in: one notification per alert
        for value in values:
            if not LABEL_NAME_RE.match(value):
                raise ValueError(f"not a valid label name: {value!r}")
        return values

    @field_validator("inhibit_rules")
    @classmethod
    def _equal_guaranteed(cls, rules: list[InhibitRuleSpec], info: ValidationInfo) -> list[InhibitRuleSpec]:
        guaranteed = GUARANTEED_LABELS | set(info.data.get("guaranteed_labels") or [])
        for i, rule in enumerate(rules):
            for label in rule.equal:
                if label not in guaranteed:
                    raise ValueError(
                        f"rule [{i}]: equal label {label!r} is not guaranteed on every alert; Alertmanager"
                        " counts two alerts that both lack it as equal (gpufed therefore only lets sources"
                        " that carry it inhibit, so for the others the rule would silently do nothing)."
                        f" Guaranteed: {', '.join(sorted(guaranteed))}; declare more in"
                        " alerting.guaranteed_labels"
                    )
        return rules

    @model_validator(mode="after")
    def _names_and_references(self) -> AlertingSpec:
        generated = [region_receiver(r.region) for r in self.routes] + [
            severity_receiver(r.region, s) for r in self.routes for s in SEVERITIES if r.extra(s)
        ] + [UNROUTED_CRITICAL_RECEIVER, WATCHDOG_NULL_RECEIVER]
        for what, names in (
            ("robot", [r.name for r in self.robots]),
            ("receiver", [r.name for r in self.receivers] + generated),
            ("route region", [r.region for r in self.routes]),
            ("time interval", [t.name for t in self.time_intervals]),
            ("replica", [r.name for r in self.replicas]),
            ("replica address", [r.cluster_address for r in self.replicas]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                clash = what == "receiver" and set(dupes) & set(generated)
                hint = (" (each route adds receivers <region>-dingtalk and <region>-<severity>; the"
                        f" tree adds {UNROUTED_CRITICAL_RECEIVER} and {WATCHDOG_NULL_RECEIVER})")
                hint = hint if clash else ""
                raise ValueError(f"duplicate {what} names: {dupes}{hint}")
        for where, name, known, kind in self._references():
            if name not in known:
                raise ValueError(f"{where} names unknown {kind} {name!r} (known: {sorted(known)})")
        self._check_severity_routes()
        if self.watchdog.receiver is not None and self.receiver(self.watchdog.receiver).robots:
            raise ValueError(
                f"watchdog.receiver {self.watchdog.receiver!r} posts to DingTalk robots"
                f" {self.receiver(self.watchdog.receiver).robots}: a heartbeat every"
                f" {self.watchdog.repeat_interval} would flood the group and spend its 20 messages a"
                " minute; use a receiver with only webhooks (a dead man's switch) or emails"
            )
        return self

    def _check_severity_routes(self) -> None:
        """A receiver a severity route reaches must not also be reached by the route that
        follows (``continue: true``): Alertmanager would notify it twice."""
        for sev in SEVERITIES:
            later = {self.default_receiver} | {n for r in self.routes for n in r.extra(sev)}
            if sev == "critical":
                later |= set() if self.unrouted_critical == ALL_REGIONS else {self.unrouted_critical}
                if self.unrouted_critical == ALL_REGIONS:
                    later |= {n for r in self.routes for n in r.critical}
            twice = sorted(set(self.severity_routes.of(sev)) & later)
            if twice:
                raise ValueError(
                    f"severity_routes.{sev} names {twice}, which the region routes, default_receiver or"
                    " unrouted_critical reach too: every such alert would be sent to it twice. List it"
                    " in one place"
                )
            # Every alert already reaches its region's robot (or the default receiver's).
            robots = {r.robot for r in self.routes} | set(self.receiver(self.default_receiver).robots)
            for name in self.severity_routes.of(sev):
                again = sorted(set(self.receiver(name).robots) & robots)
                if again:
                    raise ValueError(
                        f"severity_routes.{sev}: receiver {name!r} posts to robots {again}, which every"
                        " alert already reaches through its region route or default_receiver: DingTalk"
                        " would show it twice. Route robots with alerting.routes"
                    )
        if self.info_digest is not None and not self.robots:
            raise ValueError("info_digest is the DingTalk relay's: it needs alerting.robots")

    def wecom_receivers(self) -> list[str]:
        return [r.name for r in self.receivers if r.wecom]

    def _references(self) -> list[tuple[str, str, set[str], str]]:
        """(field, name, names it may take, kind) for every cross-reference in the section."""
        robots = {r.name for r in self.robots}
        receivers = {r.name for r in self.receivers}
        intervals = {t.name for t in self.time_intervals}
        refs = [("default_receiver", self.default_receiver, receivers, "receiver")]
        if self.unrouted_critical != ALL_REGIONS:
            refs.append(("unrouted_critical", self.unrouted_critical, receivers,
                         f"receiver (or {ALL_REGIONS})"))
        if self.watchdog.receiver is not None:
            refs.append(("watchdog.receiver", self.watchdog.receiver, receivers, "receiver"))
        for i, rec in enumerate(self.receivers):
            refs += [(f"receivers[{i}].robots", name, robots, "robot") for name in rec.robots]
        for i, route in enumerate(self.routes):
            refs.append((f"routes[{i}].robot", route.robot, robots, "robot"))
            for sev in SEVERITIES:
                refs += [(f"routes[{i}].{sev}", name, receivers, "receiver") for name in route.extra(sev)]
        for sev in SEVERITIES:
            refs += [(f"severity_routes.{sev}", name, receivers, "receiver")
                     for name in self.severity_routes.of(sev)]
        for sev in SEVERITIES:
            timing: SeverityTiming = getattr(self.severities, sev)
            names = timing.active_time_intervals + timing.mute_time_intervals
            refs += [(f"severities.{sev}", name, intervals, "time interval") for name in names]
        return refs

    def all_inhibit_rules(self) -> list[InhibitRuleSpec]:
        return [*(DEFAULT_INHIBIT_RULES if self.default_inhibit_rules else ()), *self.inhibit_rules]

    def robot(self, name: str) -> RobotSpec:
        return next(r for r in self.robots if r.name == name)

    def receiver(self, name: str) -> ReceiverSpec:
        return next(r for r in self.receivers if r.name == name)


def check_regions(alerting: AlertingSpec, regions: Sequence[str]) -> None:
    """Routes may only name the spec's regions; a typo would silently route nothing."""
    for i, route in enumerate(alerting.routes):
        if route.region not in regions:
            raise AlertingError(
                f"unknown region; the spec's regions are {sorted(regions)}",
                field=f"alerting.routes[{i}].region",
                value=route.region,
            )


def check_release(alerting: AlertingSpec, release: prometheus_versions.Release) -> None:
    """WeCom receivers need a release that reads the secret from a file (0.31 or later)."""
    wecom = alerting.wecom_receivers()
    if wecom and release < WECOM_SECRET_FILE_SINCE:
        since = WECOM_SECRET_FILE_SINCE
        raise AlertingError(
            f"WeCom receivers {wecom} read their secret from api_secret_file, which Alertmanager"
            f" reads from {since.major}.{since.minor} on; set alertmanager.version to"
            f" '{since.major}.{since.minor}' or later (gpufed never writes the secret into the config)",
            field="alertmanager.version",
            value=str(release),
        )


class AlertmanagerReleaseSpec(StrictModel):
    """The top-level ``alertmanager:`` section: the Alertmanager release the deployment runs."""

    version: str = Field(
        default=prometheus_versions.DEFAULT_ALERTMANAGER,
        description="0.MINOR[.PATCH], the oldest release in use: 0.27 (default), 0.28, 0.33.1",
    )

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: object) -> str:
        if not isinstance(value, str):
            # YAML reads 0.30 as the number 0.3: only a quoted version says what was meant.
            raise ValueError(f"alertmanager.version is quoted, such as '0.28', got {value!r}")
        prometheus_versions.parse_alertmanager(value)
        return value

    def release(self) -> prometheus_versions.Release:
        return prometheus_versions.parse_alertmanager(self.version)
