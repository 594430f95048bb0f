"""The atomic tree write, the sticky assignment file and the promtool client."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharder.children.tree import read_assignment
from sharder.engine.assignment import Assignment, ShardInfo
from sharder.kernel import output, promtool
from sharder.kernel.errors import AssignmentError, ConfigCheckError, OutputError


@pytest.fixture
def promtool_bin(promtool: str) -> str:
    """The conftest fixture, renamed so the ``promtool`` module stays importable here."""
    return promtool


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def siblings(root: Path) -> list[str]:
    return sorted(p.name for p in root.parent.iterdir())


GOOD_CONFIG = b"global:\n  scrape_interval: 30s\nscrape_configs: []\n"
BAD_CONFIG = b"global:\n  scrape_interval: soon\n"


def bundle(config: bytes, *, extra: str = "v1") -> output.Bundle:
    return {
        "manifest.json": output.dump_json({"extra": extra}),
        "children/a/prometheus.yml": config,
        "children/b/prometheus.yml": GOOD_CONFIG,
    }


def test_write_tree_replaces_the_whole_tree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    output.write_tree(out, {**bundle(GOOD_CONFIG), "children/gone/prometheus.yml": GOOD_CONFIG})
    output.write_tree(out, bundle(GOOD_CONFIG, extra="v2"))
    assert tree(out) == bundle(GOOD_CONFIG, extra="v2")
    assert siblings(out) == ["out"], "no staging or old dirs left behind"


def test_failed_validation_leaves_the_previous_tree_byte_identical(tmp_path: Path, promtool_bin: str) -> None:
    out = tmp_path / "out"
    output.write_tree(out, bundle(GOOD_CONFIG))
    before = tree(out)
    checker = promtool.Promtool(promtool_bin)
    configs = ["children/a/prometheus.yml", "children/b/prometheus.yml"]

    def validate(root: Path) -> None:
        promtool.check_all(checker, root, configs)

    with pytest.raises(ConfigCheckError) as caught:
        output.write_tree(out, bundle(BAD_CONFIG, extra="v2"), validate=validate)
    assert caught.value.path == "children/a/prometheus.yml"
    assert "not a valid duration string" in caught.value.reason
    assert tree(out) == before
    assert siblings(out) == ["out"]


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    with pytest.raises(OutputError, match="refusing to replace a non-empty directory"):
        output.write_tree(home, bundle(GOOD_CONFIG))
    assert (home / "notes.txt").read_text() == "precious"


def test_refuses_paths_that_escape_the_tree(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="not a plain relative path"):
        output.write_tree(tmp_path / "out", {"../evil": b"x"})
    assert not (tmp_path / "evil").exists()


def test_assignment_round_trips_through_the_tree(tmp_path: Path) -> None:
    assignment = Assignment(
        algorithm="bounded-rendezvous",
        algorithm_version=1,
        shards={"r-0": ShardInfo(region="r", index=0)},
        targets={"10.0.0.1:9400": "r-0"},
        weights={"10.0.0.1:9400": 8},
    )
    assert read_assignment(tmp_path / "missing") is None
    output.write_tree(
        tmp_path / "out", {output.ASSIGNMENT_FILE: output.dump_json(assignment.model_dump(mode="json"))}
    )
    assert read_assignment(tmp_path / "out") == assignment


def test_a_corrupt_assignment_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "assignment.json").write_text('{"algorithm": 3}')
    with pytest.raises(AssignmentError, match=r"assignment\.json: not a valid assignment \(algorithm: "):
        read_assignment(tmp_path)


class RecordingChecker:
    """A checker that fails one named config, to test the pool without processes."""

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad
        self.seen: list[tuple[str, bool]] = []

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        self.seen.append((config, agent))
        if config in self.bad:
            raise ConfigCheckError("broken", path=config)


def test_check_all_reports_the_first_failure_in_path_order(tmp_path: Path) -> None:
    checker = RecordingChecker({"c/9.yml", "c/3.yml"})
    configs = [f"c/{i}.yml" for i in range(10)]
    with pytest.raises(ConfigCheckError) as caught:
        promtool.check_all(checker, tmp_path, configs, agent=True, workers=4)
    assert str(caught.value) == "c/3.yml: broken (and 1 more configs failed)"
    assert sorted(checker.seen) == sorted((c, True) for c in configs)


def test_missing_promtool_binary_is_a_check_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigCheckError, match="promtool not found"):
        promtool.Promtool(str(tmp_path / "no-promtool")).check(tmp_path, "x.yml")
