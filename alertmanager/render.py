"""Pure renderer: ``AlertingSpec`` in, ``alertmanager.yml`` and the relay's robot file out.

Pipeline position: the CLI loads ``GpufedSpec`` and passes its ``alerting`` section with the
cluster and region names (this package never imports ``federation``, which imports it);
``render_alerting_bundle`` returns files that ``sharder.kernel.output.write_tree`` puts under the
output dir. Functions here return plain dicts; dumping happens in ``sharder.kernel.output``.

Routing tree (first match wins; ``continue`` only on the severity channels)::

    root (default_receiver, root timing)
    ├── alertname="Watchdog" -> heartbeat receiver   (first, no continue)
    ├── severity="critical" -> wecom-oncall  continue  severity_routes: one route per receiver,
    ├── severity="critical" -> sms           continue  every region; the alert goes on below
    ├── severity="warning"  -> ops-mail      continue
    ├── region="cn-beijing" -> cn-beijing-dingtalk
    │   ├── severity="critical" -> cn-beijing-critical (robot + extra receivers) | -dingtalk
    │   ├── severity="warning"  -> ...            each child carries its severity's timing
    │   └── severity="info"     -> ...            (and active/mute time intervals)
    ├── region="cn-shanghai" -> ...
    ├── severity="critical" -> unrouted-critical  region missing, empty, unknown or mis-cased:
    │                                             every region's pager (or unrouted_critical)
    └── severity=... -> default_receiver          unknown-region alerts keep severity timing

The Watchdog route sits before all of them (alertname="Watchdog" -> heartbeat receiver,
short repeat), so the dead man's switch never reaches an on-call robot. The severity
channels come next with ``continue: true``: the alert reaches each of them and then its
region's robot, as if they were not there. Every inhibition
rule, built-in or user, requires its source to carry each ``equal`` label (``!=""``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from alertmanager import ha
from alertmanager.channels import WeComSpec
from alertmanager.models import (
    ALL_REGIONS,
    SEVERITIES,
    UNROUTED_CRITICAL_RECEIVER,
    WATCHDOG_NULL_RECEIVER,
    AlertingSpec,
    InhibitRuleSpec,
    RegionRouteSpec,
    Severity,
    SeverityTiming,
    Timing,
    check_regions,
    region_receiver,
    severity_receiver,
)
from sharder.kernel.output import Bundle, dump_json, dump_yaml
from sharder.kernel.tls import TlsSpec

ALERTMANAGER_FILE = "alertmanager/alertmanager.yml"
HA_FILE = "alertmanager/ha.json"
RELAY_FILE = "alertmanager/dingtalk.yml"
PROMETHEUS_ALERTING_FILE = "alertmanager/prometheus-alerting.yml"


def robot_url(relay_url: str, robot: str) -> str:
    """The relay endpoint for one robot: ``POST <relay>/dingtalk/<robot>/send``."""
    return f"{relay_url}/dingtalk/{robot}/send"


def _timing(timing: Timing) -> dict[str, Any]:
    out: dict[str, Any] = {
        "group_wait": timing.group_wait,
        "group_interval": timing.group_interval,
        "repeat_interval": timing.repeat_interval,
    }
    if isinstance(timing, SeverityTiming):
        if timing.active_time_intervals:
            out["active_time_intervals"] = list(timing.active_time_intervals)
        if timing.mute_time_intervals:
            out["mute_time_intervals"] = list(timing.mute_time_intervals)
    return out


def wechat_config(wecom: WeComSpec) -> dict[str, Any]:
    """One ``wechat_configs`` entry; the secret is a file Alertmanager reads (0.31+)."""
    out: dict[str, Any] = {
        "send_resolved": wecom.send_resolved,
        "api_url": wecom.api_url,
        "api_secret_file": wecom.api_secret_file,
        "corp_id": wecom.corp_id,
        "agent_id": wecom.agent_id,
        "message_type": wecom.message_type,
    }
    for key in ("to_user", "to_party", "to_tag"):
        value = getattr(wecom, key)
        if value:
            out[key] = value
    return out


def _receiver(
    alerting: AlertingSpec, name: str, *, robots: list[str], passthrough: list[str], relay_tls: TlsSpec | None
) -> dict[str, Any]:
    """One Alertmanager receiver merging robots and pass-through receivers, each URL once.

    ``relay_tls``: the client settings for the relay's URLs (the spec's ``tls`` when its
    ``relay`` hop is on); pass-through webhooks are someone else's servers and keep theirs.
    """
    hooks: dict[str, dict[str, Any]] = {}
    emails: list[dict[str, Any]] = []
    wechats: list[dict[str, Any]] = []
    robot_names = list(robots)
    for extra in passthrough:
        robot_names += alerting.receiver(extra).robots
    for robot in robot_names:
        url = robot_url(alerting.relay_url, robot)
        relay_hook: dict[str, Any] = {"url": url, "send_resolved": True, "max_alerts": 0}
        if relay_tls is not None:
            relay_hook["http_config"] = {"tls_config": relay_tls.client_config()}
        hooks.setdefault(url, relay_hook)
    for extra in passthrough:
        spec = alerting.receiver(extra)
        for hook in spec.webhooks:
            entry: dict[str, Any] = {
                "url": hook.url,
                "send_resolved": hook.send_resolved,
                "max_alerts": hook.max_alerts,
            }
            if hook.credentials_file:
                entry["http_config"] = {"authorization": {"credentials_file": hook.credentials_file}}
            hooks.setdefault(hook.url, entry)
        for mail in spec.emails:
            email = {k: v for k, v in mail.model_dump(by_alias=True).items() if v is not None}
            if email not in emails:
                emails.append(email)
        for wecom in spec.wecom:
            entry = wechat_config(wecom)
            if entry not in wechats:
                wechats.append(entry)
    out: dict[str, Any] = {"name": name}
    if hooks:
        out["webhook_configs"] = list(hooks.values())
    if emails:
        out["email_configs"] = emails
    if wechats:
        out["wechat_configs"] = wechats
    return out


def _severity_routes(alerting: AlertingSpec, receiver_for: dict[Severity, str]) -> list[dict[str, Any]]:
    return [
        {
            "matchers": [f'severity="{sev}"'],
            "receiver": receiver_for[sev],
            **_timing(getattr(alerting.severities, sev)),
        }
        for sev in SEVERITIES
    ]


def _channel_routes(alerting: AlertingSpec) -> list[dict[str, Any]]:
    """``severity_routes``: one route per (severity, receiver), each with ``continue: true``
    so the alert also reaches the routes after it (its region's robot)."""
    return [
        {
            "matchers": [f'severity="{sev}"'],
            "receiver": name,
            "continue": True,
            **_timing(getattr(alerting.severities, sev)),
        }
        for sev in SEVERITIES
        for name in alerting.severity_routes.of(sev)
    ]


def _region_route(alerting: AlertingSpec, route: RegionRouteSpec) -> dict[str, Any]:
    base = region_receiver(route.region)
    by_severity = {
        sev: severity_receiver(route.region, sev) if route.extra(sev) else base for sev in SEVERITIES
    }
    out: dict[str, Any] = {
        "matchers": [f'region="{route.region}"'],
        "receiver": base,
        "routes": _severity_routes(alerting, by_severity),
    }
    if route.group_by is not None:
        out["group_by"] = list(route.group_by)
    return out


def unrouted_critical_receiver(alerting: AlertingSpec) -> str:
    """Where a critical alert goes when no region route matched it."""
    if alerting.unrouted_critical != ALL_REGIONS:
        return alerting.unrouted_critical
    return UNROUTED_CRITICAL_RECEIVER if alerting.routes else alerting.default_receiver


def watchdog_receiver(alerting: AlertingSpec) -> str:
    return alerting.watchdog.receiver or WATCHDOG_NULL_RECEIVER


def _watchdog_route(alerting: AlertingSpec) -> dict[str, Any]:
    return {
        "matchers": [f'alertname="{alerting.watchdog.alertname}"'],
        "receiver": watchdog_receiver(alerting),
        **_timing(alerting.watchdog),
    }


def inhibit_rule(rule: InhibitRuleSpec) -> dict[str, Any]:
    """One inhibit rule; the source must carry every ``equal`` label (non-empty).

    Alertmanager treats a label both alerts lack as equal, so without the guard a NodeDown
    without ``node`` would mute every GPU alert without ``node``, and a critical alert
    without cluster/region/node every such warning.
    """
    guards = [f'{label}!=""' for label in rule.equal if f'{label}!=""' not in rule.source_matchers]
    return {"source_matchers": [*rule.source_matchers, *guards],
            "target_matchers": list(rule.target_matchers), "equal": list(rule.equal)}


def _receivers(alerting: AlertingSpec, relay_tls: TlsSpec | None) -> list[dict[str, Any]]:
    out = [_receiver(alerting, r.name, robots=[], passthrough=[r.name], relay_tls=relay_tls)
           for r in alerting.receivers]
    if alerting.watchdog.receiver is None:
        out.append({"name": WATCHDOG_NULL_RECEIVER})
    if unrouted_critical_receiver(alerting) == UNROUTED_CRITICAL_RECEIVER:
        pagers = [name for route in alerting.routes for name in route.critical]
        out.append(_receiver(alerting, UNROUTED_CRITICAL_RECEIVER, robots=[r.robot for r in alerting.routes],
                             passthrough=list(dict.fromkeys([alerting.default_receiver, *pagers])),
                             relay_tls=relay_tls))
    for route in alerting.routes:
        out.append(_receiver(alerting, region_receiver(route.region), robots=[route.robot], passthrough=[],
                            relay_tls=relay_tls))
        for sev in SEVERITIES:
            if route.extra(sev):
                name = severity_receiver(route.region, sev)
                out.append(_receiver(alerting, name, robots=[route.robot], passthrough=route.extra(sev),
                                    relay_tls=relay_tls))
    return sorted(out, key=lambda r: str(r["name"]))


def _time_intervals(alerting: AlertingSpec) -> list[dict[str, Any]]:
    out = []
    for interval in alerting.time_intervals:
        entry: dict[str, Any] = {}
        if interval.weekdays:
            entry["weekdays"] = list(interval.weekdays)
        if interval.times:
            entry["times"] = [t.model_dump() for t in interval.times]
        if interval.location:
            entry["location"] = interval.location
        out.append({"name": interval.name, "time_intervals": [entry]})
    return out


def render_alertmanager_config(alerting: AlertingSpec, *, tls: TlsSpec | None = None) -> dict[str, Any]:
    """The whole ``alertmanager.yml`` as a dict (``matchers`` only, never ``match``/``match_re``).

    With ``tls`` and its ``relay`` hop on, the relay's webhooks carry ``http_config.tls_config``.
    """
    relay_tls = tls if tls is not None and tls.hops.relay else None
    default = alerting.default_receiver
    route: dict[str, Any] = {
        "receiver": default,
        "group_by": list(alerting.group_by),
        **_timing(alerting.timing),
        "routes": [
            _watchdog_route(alerting),
            *_channel_routes(alerting),
            *(_region_route(alerting, r) for r in alerting.routes),
            *_severity_routes(alerting, {**dict.fromkeys(SEVERITIES, default),
                                         "critical": unrouted_critical_receiver(alerting)}),
        ],
    }
    config: dict[str, Any] = {
        "global": {"resolve_timeout": "5m"},
        "route": route,
        "receivers": _receivers(alerting, relay_tls),
        "inhibit_rules": [inhibit_rule(r) for r in alerting.all_inhibit_rules()],
    }
    if alerting.time_intervals:
        config["time_intervals"] = _time_intervals(alerting)
    return config


def render_relay_config(alerting: AlertingSpec) -> dict[str, Any]:
    """The relay's robots file (``alertmanager.dingtalk.config.RelayConfig``); ``${ENV}`` kept as is."""
    robots: dict[str, Any] = {}
    for robot in alerting.robots:
        entry: dict[str, Any] = {
            "url": robot.url,
            "keywords": list(robot.keywords),
            "mentions": robot.mentions.model_dump(),
        }
        if robot.secret is not None:
            entry["secret"] = robot.secret
        robots[robot.name] = entry
    out: dict[str, Any] = {"listen": alerting.relay_listen, "timezone": alerting.timezone, "robots": robots}
    if alerting.info_digest is not None:
        out["digest"] = {"period": f"{alerting.info_digest.period_seconds():g}s",
                         "anchor": alerting.info_digest.anchor}
        if alerting.info_digest.email is not None:  # ${ENV} kept: the relay expands the password
            out["digest"]["email"] = alerting.info_digest.email.model_dump(by_alias=True, exclude_none=True)
    return out


def render_alerting_bundle(
    alerting: AlertingSpec, *, cluster: str, regions: Sequence[str], tls: TlsSpec | None = None
) -> Bundle:
    """Every alerting file, keyed by path relative to the output dir.

    ``dingtalk.yml`` is left out when the spec has no robots: the relay refuses an empty
    robot list, and a deployment without DingTalk runs no relay.
    """
    check_regions(alerting, regions)
    bundle: Bundle = {
        ALERTMANAGER_FILE: dump_yaml(render_alertmanager_config(alerting, tls=tls)),
        HA_FILE: dump_json(ha.ha_document(alerting, cluster=cluster, tls=tls)),
        PROMETHEUS_ALERTING_FILE: dump_yaml(
            {"alerting": ha.prometheus_alerting(alerting, cluster=cluster, tls=tls)}
        ),
    }
    if alerting.robots:
        bundle[RELAY_FILE] = dump_yaml(render_relay_config(alerting))
    return bundle
