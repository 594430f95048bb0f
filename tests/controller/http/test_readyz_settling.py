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


class HeldSource:
    """A followed source whose first answer waits for the test (a big inventory being read):
    it pushes ``targets`` once released, then says it has answered."""

    def __init__(self, sink: object, *, name: str, targets: list[object], held: bool) -> None:
        self.name, self.sink, self.targets = name, sink, targets
        self.release = threading.Event()
        if not held:
            self.release.set()
        self.answered = False

    def poll_once(self) -> bool:
        self.sink.on_change(self.name, self.targets)  # type: ignore[attr-defined]
        self.answered = True
        return True

    def run(self, stop: threading.Event) -> None:
        while not self.release.wait(0.05):
            if stop.is_set():
                return
        self.poll_once()
        stop.wait()


def test_readyz_is_settling_until_every_followed_source_has_answered_and_is_placed(tmp_path: Path) -> None:
    """One source answers at once (an empty Kubernetes listing), another is still reading its
    inventory: SD serves the first one's set and its bundle is out, yet the start-up work
    has not ended. Before, /readyz said 200 here (a 1M bench: ready at 6 s, settled at 3 min)."""
    harness = build(tmp_path)
    controller = harness.controller
    assert controller.publisher is not None
    early = HeldSource(controller.reconciler, name="kubernetes", targets=fleet(2, region="r2"), held=False)
    late_targets = fleet(40, start=100)
    late = HeldSource(controller.reconciler, name="file", targets=late_targets, held=True)
    controller.start([early, late])
    try:
        wait_until(lambda: controller.ready and controller.publication.first_bundle_done(), timeout=60,
                   what="the early source's set published and its bundle out")  # fmt: skip
        assert controller.state.assignment is not None
        assert set(controller.state.assignment.targets) == {t.identity for t in fleet(2, region="r2")}
        status, body = _readyz(harness)
        assert status == 503 and body["state"] == "settling" and body["settling"] is True
        late.release.set()
        wait_until(lambda: _readyz(harness)[0] == 200, timeout=60, what="/readyz 200 once settled")
        # when it says ready, the late source's set is placed and served
        assert late.answered
        placed = controller.state.assignment
        assert placed is not None and {t.identity for t in late_targets} <= set(placed.targets)
        served: set[str] = set()
        _, shards = _get(harness, "/v1/shards")
        assert isinstance(shards, dict)
        for row in shards["shards"]:
            for child in row["children"]:
                status, groups = _get(harness, f"/v1/sd/{child['child']}")
                assert status == 200 and isinstance(groups, list)
                served.update(t for group in groups for t in group["targets"])
        assert {t.identity for t in late_targets} <= served
        assert controller.publication.first_bundle_done()  # and the bundle of that shard set is out
    finally:
        late.release.set()
        controller.stop()


def test_changes_after_the_sources_answered_do_not_hold_readiness_back(tmp_path: Path) -> None:
    """Settled means the sources' first answers are placed, not that nothing is pending: a
    change that is always due next (a registration every moment) must not keep it at 503."""
    again = build(tmp_path)
    ctl = again.controller
    source = HeldSource(ctl.reconciler, name="file", targets=fleet(6), held=False)
    ctl.start([source])
    try:

        def placed() -> bool:
            assignment = ctl.state.assignment
            return assignment is not None and len(assignment.targets) == 6 and ctl.ready

        wait_until(
            lambda: placed() and ctl.publication.first_bundle_done(), timeout=60, what="the set placed"
        )
        with ctl.reconciler._wake:  # a change is dirty and never due (as if debounced forever)
            ctl.reconciler._first_dirty = float("inf")
        assert ctl.reconciler.pending
        wait_until(lambda: _readyz(again)[0] == 200, timeout=60, what="/readyz 200 with a change pending")
    finally:
        ctl.stop()
