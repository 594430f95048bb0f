"""A restart serves the stored assignment at once and, finding the same targets, writes nothing new."""

from __future__ import annotations

from pathlib import Path

from tests.controller.harness import build, fleet


def test_a_restart_with_the_same_targets_keeps_the_version_and_moves_nothing(tmp_path: Path) -> None:
    targets = fleet(10, region="r1") + fleet(4, region="r2", start=100)
    first = build(tmp_path)
    first.feed(targets)
    before = first.controller.state
    first.service.stop()

    again = build(tmp_path)
    assert again.controller.state.assignment == before.assignment
    answer = first.controller.publication.sd.answer("r1-0", "gpu")
    assert again.controller.publication.sd.answer("r1-0", "gpu") == answer
    again.feed(targets)  # the file source re-lists the same fleet
    after = again.controller.state
    assert after.assignment == before.assignment
    assert after.assignment_version == before.assignment_version
    assert after.revision == before.revision  # nothing was written
    again.feed(targets[:-1])  # a real change still gets a new version
    assert again.controller.state.assignment_version == before.assignment_version + 1
