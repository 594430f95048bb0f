"""``base.heap.trim`` gives freed pages back where the C library can (glibc here)."""

from __future__ import annotations

import platform

import pytest

from federation.controller.base import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_gives_back_what_a_large_build_freed() -> None:
    held = [bytes(4096) for _ in range(20_000)]  # about 80 MiB through malloc, then freed
    del held
    assert heap.trim() is True  # malloc_trim returns 1 when it released memory
