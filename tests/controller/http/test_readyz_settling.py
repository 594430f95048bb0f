"""``/readyz`` means settled: a started controller answers 503 ``settling`` while its
start-up work (the first config bundle's render and check, the engine's index) goes on,
after SD is already served, and 200 only once it has ended (issue #44)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from federation.localrun.waiting import wait_until
from tests.controller.harness import ControllerHarness, build, fleet


class HeldChecker:
    """Passes every config, but only once the test lets it: the first bundle is in flight
    until then."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        self.asked.set()
        if not self.release.wait(60):
            raise TimeoutError("the test never released the checker")


def _get(harness: ControllerHarness, path: str) -> tuple[int, dict[str, object] | list[object]]:
    async def get() -> tuple[int, dict[str, object] | list[object]]:
        async with harness.client() as client:
            answer = await client.get(path)
            return answer.status_code, answer.json()

    return asyncio.run(get())


def _readyz(harness: ControllerHarness) -> tuple[int, dict[str, object]]:
    status, body = _get(harness, "/readyz")
    assert isinstance(body, dict)
    return status, body


def test_readyz_is_settling_until_the_first_bundle_is_checked_then_ready(tmp_path: Path) -> None:
    harness = build(tmp_path)
    controller = harness.controller
    assert controller.publisher is not None
    checker = HeldChecker()
    controller.publisher.checker = checker
    controller.start()
    try:
        status, body = _readyz(harness)
        assert status == 503 and body["state"] == "starting" and "settling" not in body
        controller.reconciler.on_change("file", fleet(6))
        wait_until(checker.asked.is_set, timeout=60, what="the first bundle's check")
        # SD is served already, but the start-up work has not ended: 503, and said so
        assert _get(harness, "/v1/sd/r1-0")[0] == 200
        status, body = _readyz(harness)
        assert status == 503 and body["state"] == "settling" and body["settling"] is True
        assert body["ready"] is False
        checker.release.set()
        wait_until(lambda: _readyz(harness)[0] == 200, timeout=60, what="/readyz 200 once settled")
        status, body = _readyz(harness)
        assert body["state"] == "ready" and body["ready"] is True and "settling" not in body
        assert isinstance(body["settled_after_s"], float) and body["settled_after_s"] >= 0
        assert controller.publisher.status.version > 0  # the bundle is out when it says ready
        assert controller.reconciler.prepared
    finally:
        checker.release.set()
        controller.stop()


def test_a_controller_driven_by_hand_is_ready_once_sd_is_published(tmp_path: Path) -> None:
    """No loops started, no start-up work: ready as soon as SD answers exist (as before)."""
    harness = build(tmp_path)
    assert harness.controller.readiness() == "starting"
    harness.feed(fleet(3))
    assert harness.controller.readiness() == "ready"
