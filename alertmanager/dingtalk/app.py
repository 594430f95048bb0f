"""FastAPI app of the relay: thin routes over ``handle_webhook`` and ``reload_config``.

``create_app`` builds everything (nothing is built at import): the HTTP client is
injected so tests run against ``httpx.MockTransport`` or the capture server, and one
``clock`` (seconds since the epoch) drives signing timestamps, rate limits and dedup
windows so tests control all three. With a ``data_dir`` the ordering and dedup memory is
loaded from it at start and saved after each finished notification (``memory``). With a
``digest`` in the config, ``info`` alerts join their robot's batch instead of being sent,
and ``flush_digests`` (on a timer in the app, called directly by tests on a fake clock)
sends each batch whose period ended as one message (``digest``). Domain errors become
``application/problem+json`` in one exception handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from alertmanager.dingtalk import digest, mail, memory
from alertmanager.dingtalk.client import DingTalkClient, Sender, redact
from alertmanager.dingtalk.config import DigestConfig, DigestEmailConfig, RelayConfig, load_config
from alertmanager.dingtalk.dedup import Deduplicator
from alertmanager.dingtalk.errors import (
    ConfigError,
    DeliveryError,
    PayloadError,
    PermanentDeliveryError,
    RelayError,
    ThrottledError,
    UnknownRobotError,
)
from alertmanager.dingtalk.metrics import RelayMetrics
from alertmanager.dingtalk.ordering import GroupStates
from alertmanager.dingtalk.payload import dedup_key, parse_webhook
from alertmanager.dingtalk.ratelimit import RateLimiter
from alertmanager.dingtalk.render import Renderer
from alertmanager.dingtalk.sender import RobotSender
from alertmanager.dingtalk.split import split

log = logging.getLogger(__name__)
Clock = Callable[[], float]

_TITLES = {400: "Bad request", 404: "Unknown robot", 413: "Request body too large",
           422: "Invalid webhook payload", 503: "DingTalk delivery deferred", 500: "Relay error"}


@dataclass
class Relay:
    """Everything a request needs; ``apply_config`` swaps the config-derived parts."""

    config: RelayConfig
    renderer: Renderer
    dedup: Deduplicator
    order: GroupStates
    senders: dict[str, RobotSender]
    metrics: RelayMetrics
    registry: CollectorRegistry
    client: Sender
    clock: Clock
    digests: digest.Digests
    data_dir: Path | None = None
    saving: asyncio.Lock = field(default_factory=asyncio.Lock)


def build_relay(config: RelayConfig, *, client: Sender, clock: Clock = time.time,
                registry: CollectorRegistry | None = None, data_dir: Path | None = None,
                renderer: Renderer | None = None) -> Relay:
    """The relay's parts; ``renderer``, when given, is ``config``'s already compiled."""
    registry = registry if registry is not None else CollectorRegistry()
    relay = Relay(config=config, renderer=renderer or Renderer(config),
                  dedup=Deduplicator(config.dedup_window, clock=clock),
                  order=GroupStates(clock=clock), senders={},
                  metrics=RelayMetrics(registry), registry=registry, client=client, clock=clock,
                  digests=digest.Digests(config.digest or DigestConfig(), zone=config.timezone, clock=clock),
                  data_dir=data_dir)
    apply_config(relay, config, renderer=relay.renderer)
    if data_dir is not None:
        restore_memory(relay, data_dir)
    return relay


def restore_memory(relay: Relay, data_dir: Path) -> None:
    """Load the saved memory; a bad file is logged and counted, and the relay starts empty."""
    try:
        snapshot = memory.load(data_dir)
        relay.order.restore(snapshot.order)
        relay.dedup.restore(snapshot.dedup)
        relay.digests.restore(snapshot.digest)
    except (memory.MemoryFileError, ValueError, TypeError) as exc:
        relay.order.restore([])
        relay.dedup.restore([])
        relay.digests.restore({})
        relay.metrics.memory_errors.labels("load").inc()
        log.error("relay memory in %s not loaded, starting empty: %s", data_dir, exc)
        return
    log.info("relay memory loaded from %s: %d alert state(s), %d recent notification(s),"
             " %d digest batch(es)", data_dir, len(snapshot.order), len(snapshot.dedup), len(snapshot.digest))


async def save_memory(relay: Relay) -> None:
    """Write the memory file off the event loop; a failure is logged and counted, the answer
    stands. Saves run one at a time, each with the memory as it is when it starts, so the
    last one written holds everything recorded before it."""
    if relay.data_dir is None:
        return
    try:
        async with relay.saving:
            snapshot = memory.Snapshot(order=relay.order.snapshot(), dedup=relay.dedup.snapshot(),
                                       digest=relay.digests.snapshot())
            await asyncio.to_thread(memory.save, relay.data_dir, snapshot)
    except OSError as exc:
        relay.metrics.memory_errors.labels("save").inc()
        log.error("relay memory not saved to %s: %s", relay.data_dir, exc)


def apply_config(relay: Relay, config: RelayConfig, *, renderer: Renderer | None = None) -> None:
    """Swap in a validated config; limiter history survives so a reload cannot burst."""
    relay.renderer = renderer or Renderer(config)
    relay.config = config
    relay.dedup.window = config.dedup_window
    relay.digests.config, relay.digests.zone = config.digest or DigestConfig(), config.timezone
    for name, robot in config.robots.items():
        sender = relay.senders.get(name)
        if sender is None:
            relay.senders[name] = RobotSender(
                name, robot, client=relay.client, metrics=relay.metrics, limit=config.max_message_bytes,
                limiter=RateLimiter(robot.rate_per_minute, clock=relay.clock, backoff=config.throttle_backoff,
                                    backoff_max=config.throttle_backoff_max))
            relay.metrics.init_robot(name)
        else:
            sender.robot, sender.limit = robot, config.max_message_bytes
            sender.limiter.resize(robot.rate_per_minute)
            sender.limiter.backoff = config.throttle_backoff
            sender.limiter.backoff_max = max(config.throttle_backoff, config.throttle_backoff_max)


def reload_config(relay: Relay, path: Path) -> bool:
    """Re-read ``path``; on any error log it and keep serving the old config."""
    try:
        config = load_config(path)
        renderer = Renderer(config)  # compile templates before committing to the new config
    except ConfigError as exc:
        relay.metrics.reloads.labels("failure").inc()
        log.error("config reload from %s failed, keeping the old config: %s", path, redact(exc.detail))
        return False
    apply_config(relay, config, renderer=renderer)
    relay.metrics.reloads.labels("success").inc()
    log.info("config reloaded from %s: robots %s", path, ", ".join(sorted(config.robots)))
    return True


def check_robot(relay: Relay, robot: str) -> None:
    """404 for a robot the config does not have; the answer never lists the ones it has."""
    if robot not in relay.config.robots:
        raise UnknownRobotError(f"unknown robot {robot[:64]!r}", field="robot")


async def read_body(request: Request, *, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadError(f"request body of {declared} bytes is over the {limit}-byte limit", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadError(f"request body is over the {limit}-byte limit", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


async def handle_webhook(relay: Relay, robot: str, body: bytes) -> dict[str, Any]:
    """One Alertmanager notification -> DingTalk; returns the 200 body or raises ``RelayError``."""
    config = relay.config
    check_robot(relay, robot)
    message = parse_webhook(body)
    if config.digest is not None and any(digest.is_digested(a) for a in message.alerts):
        batched = [a for a in message.alerts if digest.is_digested(a)]
        rest = [a for a in message.alerts if not digest.is_digested(a)]
        relay.digests.add(robot, batched)
        if config.digest.email is not None:  # the e-mail digest lists each alert once, whichever robot
            relay.digests.add(digest.EMAIL, batched)
        relay.metrics.digest_alerts.labels(robot).inc(len(batched))
        if not rest:
            await save_memory(relay)
            return {"status": "digested", "robot": robot, "alerts": len(batched)}
        firing = any(alert.status == "firing" for alert in rest)
        message = message.model_copy(update={"alerts": rest, "status": "firing" if firing else "resolved"})
    key = dedup_key(robot, message)
    if not relay.dedup.reserve(key):
        relay.metrics.dedup_dropped.labels(robot).inc()
        return {"status": "duplicate", "robot": robot}
    finished = False
    try:
        verdict = relay.order.check(robot, message.groupKey, message.alerts)
        if verdict.stale:
            relay.metrics.stale_alerts.labels(robot).inc(len(verdict.stale))
            log.warning("robot %s: group %s: %d alert(s) older than the state already sent, left out",
                        robot, message.groupKey, len(verdict.stale))
            if not verdict.fresh:
                relay.metrics.stale_dropped.labels(robot).inc()
                finished = True
                return {"status": "stale", "robot": robot, "alerts": len(verdict.stale)}
        if not verdict.news:
            # Only RESOLVEDs DingTalk already showed, one a replica timed out itself (its own
            # endsAt, so its own key): a copy in all but bytes.
            relay.metrics.dedup_dropped.labels(robot).inc()
            finished = True
            return {"status": "duplicate", "robot": robot}
        if verdict.stale:
            firing = any(alert.status == "firing" for alert in verdict.fresh)
            message = message.model_copy(update={"alerts": list(verdict.fresh),
                                                 "status": "firing" if firing else "resolved"})
        relay.order.record(robot, message.groupKey, message.alerts)
        parts = split(relay.renderer, robot, message, limit=config.max_message_bytes)
        delivered = relay.dedup.delivered_parts(key)
        todo = [part for part in parts if part.digest() not in delivered]
        await relay.senders[robot].submit(
            todo, max_wait=config.max_wait,
            on_delivered=lambda part: relay.dedup.part_delivered(key, part.digest()))
        relay.order.announce(robot, message.groupKey, message.alerts)
        finished = True
        return {"status": "sent", "robot": robot, "parts": len(parts), "alerts": len(message.alerts)}
    except PermanentDeliveryError as exc:
        # Retrying now cannot fix a bad signature or keyword: answer 200 so Alertmanager does
        # not hammer DingTalk; the failure metric and this log line are the signal. The
        # notification is NOT remembered as done: when Alertmanager sends it again (next
        # group interval, or after the robot was fixed and the config reloaded) it is tried
        # again instead of being answered "duplicate" while nobody ever saw it.
        log.error("robot %s: notification %s dropped: %s", robot, message.groupKey, exc.detail)
        return {"status": "dropped", "robot": robot, "reason": exc.reason, "detail": exc.detail}
    finally:
        if finished:
            relay.dedup.complete(key)
            await save_memory(relay)
        else:
            relay.dedup.release(key)


async def flush_digests(relay: Relay) -> int:
    """Send every digest batch whose period ended, one message per robot (and one e-mail with
    ``digest.email``); returns how many were taken. A batch that fails stays (with anything
    newer) for the next call."""
    changed = False
    email = relay.config.digest.email if relay.config.digest is not None else None
    keep = [*relay.config.robots, *([digest.EMAIL] if email is not None else [])]
    for robot in relay.digests.forget(keep):
        changed = True
        log.warning("%s is no longer configured: its digest batch is dropped",
                    "digest.email" if digest.is_email(robot) else f"robot {robot}")
    sent = 0
    for robot in relay.digests.due():
        batch = relay.digests.take(robot)
        if batch is None:
            continue
        changed = True
        if digest.is_email(robot) and email is not None:
            sent += await _mail_digest(relay, email, robot, batch)
            continue
        part = digest.render_digest(relay.config.robots[robot], batch, period=relay.digests.config.period,
                                    zone=relay.config.timezone, limit=relay.config.max_message_bytes)
        try:
            await relay.senders[robot].submit([part], max_wait=relay.config.max_wait,
                                              on_delivered=lambda _: None)
        except DeliveryError as exc:
            relay.digests.give_back(robot, batch)
            log.warning("robot %s: digest of %d alert(s) not sent, kept for the next try: %s",
                        robot, part.alerts, exc.detail)
            continue
        sent += 1
        relay.metrics.digests_sent.labels(robot).inc()
        log.info("robot %s: digest of %d info alert(s) sent", robot, part.alerts)
    if changed:
        await save_memory(relay)
    return sent


async def _mail_digest(relay: Relay, email: DigestEmailConfig, key: str, batch: digest.Batch) -> int:
    """The e-mail digest over SMTP (in a thread: smtplib blocks); 1 when the smarthost took it
    for at least one recipient.

    ``key`` is ``digest.EMAIL`` (every ``email.to``) or a retry of it for the recipients the
    smarthost deferred last time (4xx), still configured. Deferred recipients get the same
    batch again on the next flush, alone; a final refusal (5xx) is counted and logged, not
    tried again; a smarthost that takes it for nobody keeps the batch under its key.
    """
    wanted = email.to if key == digest.EMAIL else digest.retry_recipients(key)
    to = [a for a in wanted if a in email.to]
    alerts = len(batch.entries) + batch.dropped
    if not to:
        log.warning("e-mail digest of %d alert(s) for %s dropped: no longer in digest.email.to",
                    alerts, wanted)
        return 0
    subject, body = digest.render_email(batch, period=relay.digests.config.period, zone=relay.config.timezone)
    try:
        message = mail.message(email, subject=subject, body=body)
        refused = await asyncio.to_thread(mail.send, email, message, to=to)
    except mail.MailError as exc:
        relay.digests.give_back(key, batch)
        relay.metrics.digest_email_failures.inc()
        log.warning("e-mail digest of %d alert(s) not sent, kept for the next try: %s", alerts, exc.detail)
        return 0
    deferred = [a for a, code in refused.items() if mail.temporary(code)]  # sorted, as refused is
    final = [a for a, code in refused.items() if not mail.temporary(code)]
    taken = [a for a in to if a not in refused]
    if deferred:
        relay.metrics.digest_email_refused.labels("deferred").inc(len(deferred))
        relay.digests.give_back(key if not taken and not final else digest.email_retry(deferred), batch)
        log.warning("e-mail digest: %s deferred %s (%s): kept for them for the next try", email.smarthost,
                    deferred, ", ".join(str(refused[a]) for a in deferred))
    if final:
        relay.metrics.digest_email_refused.labels("final").inc(len(final))
        log.error("e-mail digest of %d alert(s): %s refused %s for good (%s): not tried again", alerts,
                  email.smarthost, final, ", ".join(str(refused[a]) for a in final))
    if not taken:
        if deferred:  # kept for the next try, as when the smarthost is down
            relay.metrics.digest_email_failures.inc()
        return 0
    relay.metrics.digests_sent.labels(digest.EMAIL).inc()
    log.info("e-mail digest of %d info alert(s) sent to %s", alerts, taken)
    return 1


async def _digest_timer(relay: Relay) -> None:
    """``flush_digests`` every ``digest.check_every`` seconds (wall time) while the app runs."""
    while True:
        await asyncio.sleep(relay.digests.config.check_every)
        try:
            await flush_digests(relay)
        except Exception:  # the timer must outlive one bad batch
            log.exception("digest flush failed")


def problem(exc: RelayError) -> JSONResponse:
    """The one mapping from domain errors to HTTP problem bodies."""
    body: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(exc.status, "Relay error"),
                            "status": exc.status, "detail": exc.detail}
    if exc.field:
        body["field"] = exc.field
    headers = {"Retry-After": str(round(exc.retry_after))} if isinstance(exc, ThrottledError) else None
    return JSONResponse(body, status_code=exc.status, media_type="application/problem+json", headers=headers)


def create_app(config: RelayConfig, *, http_client: httpx.AsyncClient | None = None, clock: Clock = time.time,
               registry: CollectorRegistry | None = None, data_dir: Path | None = None) -> FastAPI:
    """The relay app; an ``http_client`` passed in is the caller's to close."""
    own_client = http_client is None
    http = http_client if http_client is not None else httpx.AsyncClient()
    client = DingTalkClient(http, timeout=config.request_timeout, clock=clock)
    relay = build_relay(config, client=client, clock=clock, registry=registry, data_dir=data_dir)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        timer = asyncio.get_running_loop().create_task(_digest_timer(relay), name="dingtalk-digest")
        yield
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        for sender in relay.senders.values():
            await sender.aclose()
        if own_client:
            await http.aclose()

    app = FastAPI(title="gpufed DingTalk relay", lifespan=lifespan)
    app.state.relay = relay

    @app.exception_handler(RelayError)
    async def _relay_error(_: Request, exc: RelayError) -> JSONResponse:
        return problem(exc)

    @app.post("/dingtalk/{robot}/send")
    async def send(robot: str, request: Request) -> dict[str, Any]:
        with relay.metrics.webhook_seconds.labels(robot if robot in relay.senders else "_unknown").time():
            check_robot(relay, robot)
            body = await read_body(request, limit=relay.config.max_request_bytes)
            return await handle_webhook(relay, robot, body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(relay.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        return {"status": "ready", "robots": sorted(relay.config.robots)}

    return app
