"""The file source follows its file: edits apply, broken edits keep the last good set."""

from __future__ import annotations

import os
from pathlib import Path

from sharder.sources.file import FileSource
from tests.sharder.sources.helpers import RecordingSink

GOOD = """
defaults: {exporters: {gpu: 9400}}
nodes:
  - {name: n1, address: 10.0.0.1, region: r1, gpus: 8}
  - {name: n2, address: 10.0.0.2, region: r1, gpus: 8}
"""


def write(path: Path, text: str, *, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


def test_file_source_follows_edits_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    sink = RecordingSink()
    source = FileSource(path, sink=sink)
    assert source.poll_once() is False and sink.errors == [("file", "unreadable")]
    write(path, GOOD, bump=1)
    assert source.poll_once() is True
    assert [t.node for t in sink.changes[-1][1]] == ["n1", "n2"]
    assert source.poll_once() is False  # nothing moved
    write(path, GOOD, bump=2)  # touched, same bytes
    assert source.poll_once() is False and len(sink.changes) == 1
    bad = "targets:\n  - {address: 10.0.0.9, port: 70000, job: gpu, node: n9, region: r1}\n"
    write(path, GOOD + bad, bump=3)
    assert source.poll_once() is False
    assert sink.errors[-1] == ("file", "invalid") and "70000" in source.last_error
    write(path, GOOD + "  - {name: n3, address: 10.0.0.3, region: r1}\n", bump=4)
    assert source.poll_once() is True
    assert [t.node for t in sink.changes[-1][1]] == ["n1", "n2", "n3"] and source.last_error == ""


def test_file_source_has_answered_once_its_first_check_ended_even_a_failed_one(tmp_path: Path) -> None:
    """``answered`` (what a settling controller waits for) turns true after the sink took the
    first set, or the first error: a missing file must not hold readiness back for ever."""
    sink = RecordingSink()
    missing = FileSource(tmp_path / "missing.yaml", sink=sink)
    assert missing.answered is False
    missing.poll_once()
    assert missing.answered and sink.errors == [("file", "unreadable")]
    path = tmp_path / "inventory.yaml"
    write(path, GOOD, bump=1)
    source = FileSource(path, sink=sink)
    assert source.answered is False
    assert source.poll_once() is True and source.answered
