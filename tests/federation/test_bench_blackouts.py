"""``gpufed bench blackouts``' judgement: what counts as a flap and as a missing or doubled message.

The live run is the bench itself (minutes); these check its arithmetic on issue 36's
two defects as they looked: the alert that alternated in the Alertmanagers, and the
second episode that never reached DingTalk.
"""

from __future__ import annotations

from federation.demo.sink import Message
from federation.testing.benches.blackouts import (
    Timeline,
    delivered,
    edges,
    messages_by_group,
    metric_by_robot,
)

STARTS = [100.0, 300.0]  # two freezes


def message(at: float, status: str, region: str = "region-0", robot: str = "sre") -> Message:
    return Message(robot=robot, at=at, title=f"[{status}:1] FederationScrapeBlackout gpufed-demo {region}",
                   text="")


def test_one_rise_and_one_fall_per_episode_is_clean() -> None:
    seen = edges([(145.0, True), (200.0, False), (345.0, True), (400.0, False)], STARTS)
    assert (seen["flips"], seen["flaps"], seen["missing_edges"]) == (4, 0, 0)
    assert seen["fired"] == [145.0, 345.0] and seen["resolved"] == [200.0, 400.0]


def test_the_issue_36_flapping_second_episode_counts_every_change_beyond_its_edges() -> None:
    flapping = [(145.0, True), (200.0, False), (345.0, True), *[(350.0 + i, i % 2 == 1) for i in range(12)],
                (400.0, False)]
    seen = edges(flapping, STARTS)
    assert seen["flaps"] == 12 and seen["missing_edges"] == 0, seen
    assert edges([(145.0, True), (200.0, False)], STARTS)["missing_edges"] == 2


def test_the_timeline_records_changes_only_and_the_most_series_seen() -> None:
    timeline = Timeline()
    for at, counts in [(1.0, {}), (2.0, {"region-0": 2}), (3.0, {"region-0": 1}), (4.0, {})]:
        timeline.observe("alertmanager-0", at, counts, ["region-0", "region-1"])
    assert timeline.changes[("alertmanager-0", "region-0")] == [(2.0, True), (4.0, False)]
    assert timeline.changes[("alertmanager-0", "region-1")] == []
    assert timeline.most[("alertmanager-0", "region-0")] == 2


def test_a_second_episode_lost_at_dingtalk_or_sent_twice_is_not_ok() -> None:
    right = [message(150, "FIRING"), message(230, "RESOLVED"),
             message(350, "FIRING"), message(430, "RESOLVED")]
    assert delivered(right, STARTS) == {"episodes": [["FIRING", "RESOLVED"]] * 2, "ok": True}
    lost = right[:2]  # the relay answered "duplicate" to the second episode
    assert delivered(lost, STARTS)["episodes"] == [["FIRING", "RESOLVED"], []]
    assert not delivered(lost, STARTS)["ok"]
    assert not delivered([*right, message(440, "RESOLVED")], STARTS)["ok"]


def test_messages_are_grouped_by_robot_and_region_and_other_alerts_left_out() -> None:
    messages = [message(150, "FIRING", "region-1", "region-1-oncall"), message(149, "FIRING", "region-1"),
                Message(robot="sre", at=151, title="[FIRING:1] GPUXidError gpufed-demo region-1", text="")]
    groups = messages_by_group(messages, ["region-0", "region-1"])
    assert sorted(groups) == [("region-1-oncall", "region-1"), ("sre", "region-1")]


def test_relay_counters_are_read_per_robot() -> None:
    text = ('# HELP x\ngpufed_dingtalk_dedup_dropped_total{robot="sre"} 4.0\n'
            'gpufed_dingtalk_dedup_dropped_created{robot="sre"} 1.7e9\n')
    assert metric_by_robot(text, "gpufed_dingtalk_dedup_dropped_total") == {"sre": 4.0}
