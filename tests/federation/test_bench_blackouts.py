"""``gpufed bench blackouts``' judgement: what counts as a flap and as a missing or doubled message.

The live run is the bench itself (minutes); these check its arithmetic on issue 36's
two defects as they looked: the alert that alternated in the Alertmanagers, and the
second episode that never reached DingTalk.
"""

from __future__ import annotations

import pytest

from alertmanager.dingtalk.config import parse_config
from alertmanager.dingtalk.payload import WebhookMessage
from alertmanager.dingtalk.render import Part, PartInfo, Renderer, merge
from federation.localrun.dingtalk import Message
from federation.testing.benches.blackouts import (
    Timeline,
    delivered,
    edges,
    frozen_kinds,
    messages_by_group,
    metric_by_robot,
)

STARTS = [100.0, 300.0]  # two freezes
RENDERER = Renderer(parse_config({"robots": {"sre": {"url": "https://dingtalk.example/robot/send?access_token=t"}}},
                                 env={}))


def part(status: str, region: str, alertname: str = "FederationScrapeBlackout") -> Part:
    """One notification for the (alertname, cluster, region) group, as the relay renders it."""
    labels = {"alertname": alertname, "cluster": "gpufed-demo", "region": region}
    alert = {"status": status.lower(), "labels": {**labels, "severity": "critical"},
             "startsAt": "2026-11-27T10:00:00Z", "fingerprint": "0" * 16,
             "endsAt": "2026-11-27T10:02:00Z" if status == "RESOLVED" else "0001-01-01T00:00:00Z"}
    message = WebhookMessage.model_validate({
        "version": "4", "groupKey": f"{{}}:{labels}", "status": status.lower(), "receiver": "sre",
        "groupLabels": labels, "commonLabels": labels, "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093", "alerts": [alert]})
    return RENDERER.render("sre", message, message.alerts, PartInfo(1, 1, 0))


def message(at: float, status: str, region: str = "region-0", robot: str = "sre") -> Message:
    rendered = part(status, region)
    return Message(robot=robot, at=at, title=rendered.title, text=rendered.text)


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
    right = [(150.0, "FIRING"), (230.0, "RESOLVED"), (350.0, "FIRING"), (430.0, "RESOLVED")]
    assert delivered(right, STARTS) == {"episodes": [["FIRING", "RESOLVED"]] * 2, "ok": True,
                                        "after_freeze_s": [[50.0, 130.0]] * 2}
    lost = right[:2]  # the relay answered "duplicate" to the second episode
    assert delivered(lost, STARTS)["episodes"] == [["FIRING", "RESOLVED"], []]
    assert not delivered(lost, STARTS)["ok"]
    assert not delivered([*right, (440.0, "RESOLVED")], STARTS)["ok"]


def test_notifications_are_read_per_robot_and_region_from_each_part_of_a_merged_message() -> None:
    # The relay merges parts queued for one robot: the title names only the first region.
    merged = merge([part("FIRING", "region-0"), part("FIRING", "region-1"),
                    part("FIRING", "region-2", "GPUXidError")])
    assert "region-1" not in merged.title
    messages = [Message(robot="sre", at=150.0, title=merged.title, text=merged.text),
                message(149.0, "FIRING", "region-1", "region-1-oncall"),
                message(230.0, "RESOLVED", "region-1")]
    groups = messages_by_group(messages, ["region-0", "region-1", "region-2"])
    assert groups == {("sre", "region-0"): [(150.0, "FIRING")],
                      ("sre", "region-1"): [(150.0, "FIRING"), (230.0, "RESOLVED")],
                      ("region-1-oncall", "region-1"): [(149.0, "FIRING")]}


def test_relay_counters_are_read_per_robot() -> None:
    text = ('# HELP x\ngpufed_dingtalk_dedup_dropped_total{robot="sre"} 4.0\n'
            'gpufed_dingtalk_dedup_dropped_created{robot="sre"} 1.7e9\n')
    assert metric_by_robot(text, "gpufed_dingtalk_dedup_dropped_total") == {"sre": 4.0}


def test_what_freezes_takes_turns_and_a_wrong_kind_is_named() -> None:
    assert frozen_kinds("children, fleet") == ["children", "fleet"]
    with pytest.raises(ValueError, match="got 'nodes'"):
        frozen_kinds("fleet,nodes")
