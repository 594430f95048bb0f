"""A config refresh (the children set unchanged) re-renders no child: it rewrites what
follows the targets (the manifest, assignment.json, Grafana's team folders) and keeps every
child's config and target list as served, and the tree it leaves is the full render's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from federation.controller.base.options import ControllerOptions
from federation.spec import load_gpufed_spec
from sharder.children import tree
from sharder.children.render import ChildConfig
from sharder.kernel.output import Bundle
from sharder.model.inventory import Target
from tests.controller.harness import ControllerHarness, build, fleet, full_render, on_disk, spec_document


def harness_for(tmp_path: Path, discovery: str) -> ControllerHarness:
    document = spec_document(regions={"r1": 3, "r2": 2}, replication_factor=2)
    if discovery == "file_sd":
        document["children"] = {"target_discovery": "file_sd"}
    document["grafana"] = {"url": "http://grafana:3000", "teams": {"llm": {"namespaces": ["llm"]}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    # every change is a refresh once the first bundle is out
    options = ControllerOptions(debounce_s=0.0, grace_s=0.0, config_refresh_s=0.0)
    return build(tmp_path, spec=load_gpufed_spec(tmp_path / "spec.yaml"), options=options)


def counting(names: list[str]) -> Callable[[ChildConfig], Bundle]:
    """``tree.child_files`` that also notes each child it renders."""
    real = tree.child_files
    return lambda child: names.append(child.child) or real(child)


@pytest.mark.parametrize("discovery", ["http_sd", "file_sd"])
def test_a_refresh_renders_no_child_and_leaves_the_full_renders_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, discovery: str
) -> None:
    harness = harness_for(tmp_path, discovery)
    controller = harness.controller
    base = [*fleet(30), *fleet(20, region="r2", start=100), *fleet(20, job="node")]
    harness.feed(base)
    assert controller.publish_configs()
    shards = set(controller.state.assignment.shards) if controller.state.assignment else set()
    rendered = tmp_path / "data" / "rendered"

    rendered_children: list[str] = []
    real = tree.child_files
    monkeypatch.setattr(tree, "child_files", counting(rendered_children))
    current = list(base)
    for k in range(4):
        newcomer = Target(address=f"10.7.0.{k + 1}", port=9400, job="gpu", node=f"new-{k}", region="r1",
                          team="llm" if k < 2 else "vision", gpus=8)
        current = [*current[1:], newcomer] if k % 2 else [*current, newcomer]
        controller.publication._config_at = float("-inf")  # the refresh is due (its pace aside)
        harness.feed(current)
        controller.publish_configs()
        assert controller.state.assignment is not None
        assert set(controller.state.assignment.shards) == shards  # the children set stays
        assert rendered_children == []  # a refresh: no child's config rendered
        assert controller.publisher is not None
        assert controller.publisher.status.version == controller.state.assignment_version
        monkeypatch.setattr(tree, "child_files", real)
        full = full_render(harness)  # what `gpufed render` writes for this assignment, whole
        monkeypatch.setattr(tree, "child_files", counting(rendered_children))
        after = on_disk(rendered)
        assert after == full
    # the team folders followed the targets: "vision" came with the last two newcomers
    assert any(path.startswith("grafana/dashboards/teams/vision/") for path in after)


def test_a_grown_children_set_after_refreshes_renders_every_child_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The served bundle's children set, not the last one asked for, decides: a region
    sized by targets_per_shard that grows a shard gets every child rendered again."""
    document = spec_document(regions={"r1": 2})
    document["regions"].append({"name": "r2"})  # sized: one shard per 4 targets
    document["sharding"]["targets_per_shard"] = 4
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    options = ControllerOptions(debounce_s=0.0, grace_s=0.0, config_refresh_s=0.0)
    harness = build(tmp_path, spec=load_gpufed_spec(tmp_path / "spec.yaml"), options=options)
    controller = harness.controller
    base = [*fleet(10), *fleet(4, region="r2", start=100)]
    harness.feed(base)
    assert controller.publish_configs()
    assert controller.state.assignment is not None
    before = set(controller.state.assignment.shards)
    controller.publication._config_at = float("-inf")
    harness.feed([*base, *fleet(1, start=50)])  # r1 only: a refresh
    controller.publish_configs()
    rendered_children: list[str] = []
    real = tree.child_files
    monkeypatch.setattr(tree, "child_files", counting(rendered_children))
    harness.feed([*base, *fleet(1, start=50), *fleet(12, region="r2", start=200)])
    controller.publish_configs()
    assert controller.state.assignment is not None
    grown = set(controller.state.assignment.shards) - before
    assert grown, "r2 should have grown a shard"
    # every child rendered again (one a shard here: replication 1), the new ones among them
    assert grown <= set(rendered_children)
    assert sorted(rendered_children) == sorted(controller.state.assignment.shards)
    monkeypatch.setattr(tree, "child_files", real)
    assert on_disk(tmp_path / "data" / "rendered") == full_render(harness)
