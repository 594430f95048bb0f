"""Alert-storm benchmark: real Alertmanager HA pair + relay + DingTalk capture server.

    python -m federation.testing.benches.dingtalk --alerts 5000 --regions 10 --json

Posts the storm to both replicas (as Prometheus does), waits until every alert shows up
in a captured DingTalk message (or the timeout), then reports delivery, duplicates, the
busiest robot-minute and relay latency. The configs are gpufed's own: an ``AlertingSpec``
(one region route and robot per region, ``${ENV}`` secrets) rendered by
``render_alerting_bundle``, replicas started with ``ha.all_replica_flags``. The capture
server is the local DingTalk, ``federation.localrun.dingtalk``. Times are wall-clock;
nothing is faked.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import yaml

from alertmanager.dingtalk.app import create_app
from alertmanager.dingtalk.config import parse_config
from alertmanager.models import (
    AlertingSpec,
    ReceiverSpec,
    RegionRouteSpec,
    RobotSpec,
    SeverityTiming,
    SeverityTimings,
    Timing,
)
from alertmanager.render import ALERTMANAGER_FILE, RELAY_FILE, render_alerting_bundle
from federation.localrun.dingtalk import LocalDingTalk
from federation.localrun.loopback import listening_socket
from federation.localrun.waiting import wait_until
from federation.testing.harnesses.alertmanager import (
    AlertmanagerHA,
    RelayThread,
    gpu_alert,
    loopback_replicas,
)

_ID = re.compile(r"alert_id=(a\d+)")
Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]




class Timed:
    """ASGI wrapper recording how long each webhook call takes inside the relay."""

    def __init__(self, app: ASGI) -> None:
        self.app = app
        self.seconds: list[float] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["path"].startswith("/dingtalk/"):
            self.seconds.append(time.perf_counter() - start)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _max_per_minute(times: list[float]) -> int:
    ordered = sorted(times)
    return max((bisect.bisect_left(ordered, t + 60) - i for i, t in enumerate(ordered)), default=0)


def _env(region: str, what: str) -> str:
    return f"BENCH_{region.upper().replace('-', '_')}_{what}"


def bench_spec(capture_url: str, region_names: list[str], *, relay_port: int) -> AlertingSpec:
    """One route and robot per region; group_wait 5s, one notification per group in the run."""
    wait, interval, repeat = "5s", "10m", "1h"
    each = SeverityTiming(group_wait=wait, group_interval=interval, repeat_interval=repeat)
    return AlertingSpec(
        relay_url=f"http://127.0.0.1:{relay_port}", relay_listen=f"127.0.0.1:{relay_port}",
        replicas=loopback_replicas(2),
        timing=Timing(group_wait=wait, group_interval=interval, repeat_interval=repeat),
        severities=SeverityTimings(critical=each, warning=each, info=each),
        robots=[RobotSpec(name=r, url=f"{capture_url}/robot/send?access_token=${{{_env(r, 'TOKEN')}}}",
                          secret=f"${{{_env(r, 'SECRET')}}}", keywords=["告警"]) for r in region_names],
        receivers=[ReceiverSpec(name="blackhole", robots=[region_names[0]])], default_receiver="blackhole",
        routes=[RegionRouteSpec(region=r, robot=r) for r in region_names])


def run(*, alerts: int, regions: int, alertnames: int, timeout: float) -> dict[str, Any]:
    names = [f"GPUBench{k}" for k in range(alertnames)]
    region_names = [f"region-{r:02d}" for r in range(regions)]
    storm = [gpu_alert(region=region_names[i % regions], cluster="bench", node=f"node-{i // 8:05d}",
                       gpu=i % 8, alertname=names[(i // regions) % alertnames], alert_id=f"a{i}")
             for i in range(alerts)]
    with LocalDingTalk() as api:
        env: dict[str, str] = {}
        for r in region_names:
            env |= {_env(r, "TOKEN"): f"tok-{r}", _env(r, "SECRET"): f"SEC{r}-bench"}
            api.add_robot(f"tok-{r}", secret=f"SEC{r}-bench", keywords=["告警"])
        relay_socket = listening_socket()
        alerting = bench_spec(api.base_url, region_names, relay_port=relay_socket.getsockname()[1])
        bundle = render_alerting_bundle(alerting, cluster="bench", regions=region_names)
        config = parse_config(yaml.safe_load(bundle[RELAY_FILE]), env=env)
        relay_app = create_app(config)
        timed = Timed(relay_app)
        with RelayThread(timed, sock=relay_socket) as relay, AlertmanagerHA(  # type: ignore[arg-type]
                alerting, config=bundle[ALERTMANAGER_FILE], peer_timeout="2s") as am:
            start = time.monotonic()
            for batch in range(0, len(storm), 500):
                am.post_alerts(storm[batch:batch + 500])
            posted = time.monotonic() - start

            def delivered() -> Counter[str]:
                return Counter(i for r in region_names for m in api.messages(f"tok-{r}")
                               for i in _ID.findall(m.text))

            all_in_at: float | None = None
            with contextlib.suppress(TimeoutError):  # what did not arrive is counted below
                all_in_at = wait_until(
                    lambda: time.monotonic() - start if len(delivered()) >= alerts else None,
                    timeout=max(0.0, start + timeout - time.monotonic()), what="every alert", interval=0.5)
            time.sleep(4)  # past both replicas' peer timeouts: late duplicates would land now
            seen = delivered()
            total = time.monotonic() - start
            metrics = httpx.get(f"{relay.url}/metrics").text
        accepted = [api.messages(f"tok-{r}") for r in region_names]
        refused = sum(len(api.rejected(f"tok-{r}")) for r in region_names)
    return {
        "alerts_sent": alerts, "regions": regions, "robots": regions, "alertnames": alertnames,
        "alerts_delivered": len(seen), "delivered_ratio": round(len(seen) / alerts, 4),
        "duplicates": sum(count - 1 for count in seen.values()),
        "messages_delivered": sum(len(messages) for messages in accepted),
        "rejected_by_dingtalk": refused,
        "max_messages_per_robot_per_minute": max(_max_per_minute([m.at for m in messages])
                                                 for messages in accepted),
        "relay_dedup_dropped": _metric_sum(metrics, "gpufed_dingtalk_dedup_dropped_total"),
        "relay_throttled": _metric_sum(metrics, "gpufed_dingtalk_throttled_total"),
        "relay_webhook_calls": len(timed.seconds),
        "relay_p50_latency_ms": round(_percentile(timed.seconds, 0.50) * 1000, 2),
        "relay_p99_latency_ms": round(_percentile(timed.seconds, 0.99) * 1000, 2),
        "post_seconds": round(posted, 2),
        "seconds_to_all_delivered": None if all_in_at is None else round(all_in_at, 2),
        "duration_seconds": round(total, 2),
        "note": "wall clock, no fakes; rendered configs, group_wait 5s; includes 4s quiet period to catch"
                " late duplicates",
    }


def _metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--alerts", type=int, default=5000)
    parser.add_argument("--regions", type=int, default=10)
    parser.add_argument("--alertnames", type=int, default=5, help="alert names per region (one group each)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(alerts=args.alerts, regions=args.regions, alertnames=args.alertnames, timeout=args.timeout)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))


if __name__ == "__main__":
    main()
