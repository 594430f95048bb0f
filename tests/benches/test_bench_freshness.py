"""``gpufed bench freshness``: every version's rules in one group, timed per part."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from federation.testing.benches.freshness import (
    ANCHOR,
    BASELINE,
    HEARTBEAT,
    RULES,
    SEQUENCE,
    renamed_baseline,
    sequenced,
    series_labels,
    split_parts,
    started_at,
    whole,
)


def _parts() -> list[str]:
    return [renamed_baseline(BASELINE.read_text(encoding="utf-8")), RULES.read_text(encoding="utf-8"), ANCHOR]


def _records(text: str) -> list[str]:
    return [rule["record"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def test_one_group_runs_each_part_in_its_own_order() -> None:
    baseline, shipped, anchor = _parts()
    text, part_of = sequenced([baseline, shipped, anchor])
    groups = yaml.safe_load(text)["groups"]
    assert [g["name"] for g in groups] == [SEQUENCE]
    # Baseline first, then the rules under test, then the anchor; each part's order kept, since
    # a rule reads the records above it in the same evaluation.
    assert _records(text) == _records(baseline) + _records(shipped) + _records(anchor)
    assert set(part_of.values()) == {"baseline-gpufed-freshness", "gpufed-freshness", "anchor-raw-up"}
    assert part_of["gpufed:target_up:fresh"] == "gpufed-freshness"
    assert part_of["baseline:target_up:fresh"] == "baseline-gpufed-freshness"
    assert part_of["bench:up:max"] == "anchor-raw-up"


def test_the_sequence_is_a_rule_file_prometheus_loads(tmp_path: Path) -> None:
    text, _ = sequenced(_parts())
    path = tmp_path / "sequence.yml"
    path.write_text(text, encoding="utf-8")
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_records(text))} rules found" in checked.stdout


def test_an_evaluation_splits_into_each_part_with_its_rules_times() -> None:
    text, part_of = sequenced(_parts())
    times = {name: 0.001 * (i + 1) for i, name in enumerate(_records(text))}
    rules = [{"name": name, "evaluationTime": t} for name, t in times.items()]
    evaluation = {"name": SEQUENCE, "rules": rules}
    parts = split_parts(evaluation, part_of)
    assert set(parts) == set(part_of.values())
    for name, part in parts.items():
        mine = [n for n in times if part_of[n] == name]
        assert [r["name"] for r in part["rules"]] == mine
        assert part["evaluationTime"] == sum(times[n] for n in mine)
    assert sum(p["evaluationTime"] for p in parts.values()) == pytest.approx(sum(times.values()))


def test_only_an_evaluation_that_ran_every_rule_counts() -> None:
    rules = [{"lastEvaluation": "2026-11-28T02:00:00.6Z"}, {"lastEvaluation": "2026-11-28T02:00:01.9Z"}]
    ran = {"lastEvaluation": "2026-11-28T02:00:00.5Z", "rules": rules}
    assert whole(ran, since=0)
    assert not whole(ran, since=started_at("2026-11-28T02:00:01Z"))
    # Just after a reload: the group keeps the old evaluation's time, its new rules never ran.
    reloaded = ran | {"rules": [{"lastEvaluation": "0001-01-01T00:00:00Z"}, *ran["rules"]]}
    assert not whole(reloaded, since=0)


@pytest.mark.parametrize(("per_region", "children"), [(200, 600), (1400, 4200)])
def test_one_heartbeat_a_child_and_a_tenth_of_the_children_silent(per_region: int, children: int) -> None:
    live, silent = series_labels(targets=30_000, replicas=1, shards_per_region=per_region)
    beats = [s for s in live + silent if HEARTBEAT.encode() in s]
    assert len(beats) == children and len(set(beats)) == children
    assert sum(HEARTBEAT.encode() in s for s in silent) == children // 10
    assert len(live) + len(silent) - children == 30_000
