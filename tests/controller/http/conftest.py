"""What the HTTP tests share: a controller fed four nodes of region r1 (a module that needs
another shape defines its own ``harness``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.controller.harness import ControllerHarness, build, fleet


@pytest.fixture
def harness(tmp_path: Path) -> ControllerHarness:
    h = build(tmp_path)
    h.feed(fleet(4, region="r1"))
    return h
