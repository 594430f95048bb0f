"""The pure parts of the issue-13 proof: gap arithmetic over raw samples, the children's file SD."""

from __future__ import annotations

from typing import Any

import pytest

from federation.demo import gaps


def row(shard: str, replica: str, times: list[float], *, node: str = "n1", value: str = "1"
        ) -> dict[str, Any]:
    return {
        "metric": {"__name__": "up", "job": "gpu", "node": node, "shard": shard, "replica": replica},
        "values": [[t, value] for t in times],
    }


def test_copies_of_one_target_are_one_series_and_the_gap_is_their_union() -> None:
    # Old shard until 20, new shard from 17: a make-before-break overlap, no gap.
    matrix = [row("a-0", "0", [0, 5, 10, 15, 20]), row("a-1", "0", [17, 22, 27])]
    out = gaps.dedup_gaps(matrix, start=0, end=28)
    (gap,) = out.values()
    assert gap.series == 'up{job="gpu", node="n1"}'
    assert gap.labels == {"job": "gpu", "node": "n1"}
    assert (gap.samples, gap.copies, gap.last) == (8, 2, 27)
    assert gap.max_gap_s == 5


def test_an_immediate_move_shows_the_hole_and_where_it_began() -> None:
    matrix = [row("a-0", "0", [0, 5, 10]), row("a-1", "0", [23, 28])]
    (gap,) = gaps.dedup_gaps(matrix, start=0, end=30).values()
    assert (gap.max_gap_s, gap.gap_from) == (13, 10)
    spans = gaps.shard_spans(matrix, start=0, end=30, by="node")
    assert spans == {"n1": {"a-0": (0, 10), "a-1": (23, 28)}}
    # overlap = old last - new first: negative is the hole
    assert spans["n1"]["a-0"][1] - spans["n1"]["a-1"][0] == -13


def test_window_edges_count_and_samples_outside_or_stale_do_not() -> None:
    matrix = [row("a-0", "0", [-3, 12, 14]), row("a-0", "1", [13, 40]), row("a-0", "0", [16], value="NaN")]
    (gap,) = gaps.dedup_gaps(matrix, start=0, end=20).values()
    assert gap.samples == 3  # -3 and 40 fall outside; the NaN is a staleness marker
    assert (gap.max_gap_s, gap.gap_from) == (12, 0)  # from the window's start to the first sample
    (late,) = gaps.dedup_gaps([row("a-0", "0", [1, 2])], start=0, end=30).values()
    assert late.max_gap_s == 28  # from the last sample to the window's end


def test_targets_are_kept_apart_and_a_bad_window_is_refused() -> None:
    out = gaps.dedup_gaps([row("s", "0", [1], node="a"), row("s", "0", [2], node="b")], start=0, end=3)
    assert sorted(g.labels["node"] for g in out.values()) == ["a", "b"]
    with pytest.raises(ValueError, match="start=5, end=5"):
        gaps.dedup_gaps([], start=5, end=5)


def test_node_selector_escapes_regex_characters() -> None:
    assert gaps.node_selector("up", ["b.x", "a"], job="gpu") == 'up{node=~"a|b\\\\.x", job="gpu"}'
