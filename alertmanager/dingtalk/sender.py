"""Per-robot queue between webhook handlers and DingTalk: rate limit, merge, hand back.

A webhook handler submits its parts and waits (at most ``max_wait``) for them. One worker
task per robot sends whenever the limiter has a slot; it takes the head of the queue
plus as many following parts as fit under the byte limit and sends them as ONE message,
so a burst of notifications costs fewer of the robot's 20 messages a minute. Each part's
outcome goes back to its handler, which answers Alertmanager:

    all parts delivered                  -> 200
    a part failed transiently            -> 503 (Alertmanager retries; delivered parts are
                                            remembered by ``dedup`` and not re-sent)
    no slot within max_wait              -> 503 + Retry-After; the parts leave the queue
    a part failed permanently            -> 200 + failure metric
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from alertmanager.dingtalk.client import Sender, redact
from alertmanager.dingtalk.config import RobotConfig
from alertmanager.dingtalk.errors import DeliveryError, ThrottledError, TransientDeliveryError
from alertmanager.dingtalk.metrics import RelayMetrics
from alertmanager.dingtalk.ratelimit import RateLimiter
from alertmanager.dingtalk.render import Part, merge

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Item:
    part: Part
    future: asyncio.Future[None]
    on_delivered: Callable[[Part], None]
    submission: int
    taken: bool = field(default=False)


class RobotSender:
    """Queue and worker for one robot; ``robot`` and ``limit`` may change on reload."""

    def __init__(self, name: str, robot: RobotConfig, *, client: Sender, limiter: RateLimiter,
                 metrics: RelayMetrics, limit: int, poll: float = 0.25) -> None:
        self.name = name
        self.robot = robot
        self.limit = limit
        self.limiter = limiter
        self._client = client
        self._metrics = metrics
        self._poll = poll
        self._queue: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._submissions = itertools.count()

    def retry_after(self) -> int:
        """Seconds Alertmanager should wait: until a slot frees, at least 1."""
        return max(1, math.ceil(self.limiter.wait_time()))

    async def submit(self, parts: Sequence[Part], *, max_wait: float,
                     on_delivered: Callable[[Part], None]) -> None:
        """Deliver every part or raise the ``DeliveryError`` the webhook should answer with."""
        loop = asyncio.get_running_loop()
        submission = next(self._submissions)
        items = [_Item(part, loop.create_future(), on_delivered, submission) for part in parts]
        self._queue.extend(items)
        self._changed()
        self._ensure_worker()
        try:
            done, pending = await asyncio.wait([i.future for i in items], timeout=max_wait,
                                               return_when=asyncio.FIRST_EXCEPTION)
            if pending or any(_error(f) for f in done):
                self._withdraw(items)
                in_flight = [i.future for i in items if i.taken and not i.future.done()]
                if in_flight:
                    await asyncio.wait(in_flight)
            errors = [e for e in (_error(i.future) for i in items) if e is not None]
            transient = [e for e in errors if isinstance(e, TransientDeliveryError)]
            if transient or errors:
                raise (transient or errors)[0]
            if any(i.future.cancelled() for i in items):
                self._metrics.throttled.labels(self.name).inc()
                raise ThrottledError(f"robot {self.name} is rate limited ({self.limiter.per_minute}/min); "
                                     f"no slot within {max_wait:g}s", retry_after=self.retry_after())
        finally:
            self._withdraw(items)

    def _withdraw(self, items: Sequence[_Item]) -> None:
        """Take parts no worker has picked up out of the queue (their handler gave up)."""
        gone = {id(i) for i in items if not i.taken}
        if gone:
            self._queue = deque(i for i in self._queue if id(i) not in gone)
            for item in items:
                if not item.taken and not item.future.done():
                    item.future.cancel()
            self._changed()

    def _changed(self) -> None:
        self._metrics.queued.labels(self.name).set(len(self._queue))
        self._wake.set()

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"dingtalk-{self.name}")

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            wait = self.limiter.wait_time()
            if wait > 0:
                # Poll rather than sleep the whole wait (up to 10 minutes after a 130101):
                # the queue may empty, or the clock may be a test's fake clock. A plain
                # sleep, because wait_for on Python 3.11 can swallow the task's cancel.
                await asyncio.sleep(min(wait, self._poll))
                continue
            if self.limiter.try_acquire():
                await self._deliver(self._take_batch())

    def _take_batch(self) -> list[_Item]:
        batch = [self._queue.popleft()]
        while self._queue and merge([i.part for i in batch] + [self._queue[0].part]).size() <= self.limit:
            batch.append(self._queue.popleft())
        for item in batch:
            item.taken = True
        self._changed()
        return batch

    async def _deliver(self, batch: list[_Item]) -> None:
        message = merge([i.part for i in batch])
        try:
            await self._client.send(self.robot, message)
        except DeliveryError as exc:
            if isinstance(exc, ThrottledError):
                # DingTalk muted the robot: sending again now would only extend the mute.
                penalty = self.limiter.back_off()
                log.warning("robot %s: DingTalk says too fast; no sends for %gs", self.name, penalty)
                exc = ThrottledError(exc.detail, retry_after=self.retry_after(), reason=exc.reason)
            kind = "transient" if isinstance(exc, TransientDeliveryError) else "permanent"
            self._metrics.failed.labels(self.name, kind, exc.reason).inc()
            log.log(logging.WARNING if kind == "transient" else logging.ERROR,
                    "robot %s: %s delivery failure: %s", self.name, kind, redact(exc.detail, self.robot))
            outcome: BaseException | None = exc
        except Exception as exc:  # a bug must not kill the worker or hang the handlers
            log.exception("robot %s: unexpected error while sending", self.name)
            outcome = TransientDeliveryError(f"internal error: {type(exc).__name__}", reason="internal")
            self._metrics.failed.labels(self.name, "transient", "internal").inc()
        else:
            outcome = None
            self.limiter.succeeded()
            self._metrics.sent.labels(self.name).inc()
            self._metrics.alerts_sent.labels(self.name).inc(message.alerts)
            self._metrics.merged.labels(self.name).inc(len(batch) - 1)
        if outcome is not None:
            # The rest of a failed notification stays unsent: its retry re-sends it in order.
            failed = {item.submission for item in batch}
            batch += [item for item in self._queue if item.submission in failed]
            self._queue = deque(item for item in self._queue if item.submission not in failed)
            self._changed()
        for item in batch:
            if outcome is None:
                item.on_delivered(item.part)
            if not item.future.done():
                if outcome is None:
                    item.future.set_result(None)
                else:
                    item.future.set_exception(outcome)


def _error(future: asyncio.Future[None]) -> BaseException | None:
    """The future's exception; None while pending, on success, or when withdrawn."""
    if not future.done() or future.cancelled():
        return None
    return future.exception()
