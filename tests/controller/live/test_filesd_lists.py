"""file_sd in proportion to the change: a registration rewrites its shard's target lists
only, byte for byte what the full render writes, and leaves every prometheus.yml alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from federation.controller.live import filesd
from federation.controller.live.sdcache import SdSnapshot, ShardAnswers
from federation.spec import load_gpufed_spec
from sharder.children.render import target_groups
from sharder.kernel import output
from sharder.model.inventory import Target
from tests.controller.harness import ControllerHarness, build, fleet, full_render, on_disk, spec_document


def file_sd_harness(tmp_path: Path, *, replication_factor: int = 1) -> ControllerHarness:
    document = spec_document(regions={"r1": 3, "r2": 2}, replication_factor=replication_factor)
    document["children"] = {"target_discovery": "file_sd"}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    return build(tmp_path, spec=load_gpufed_spec(tmp_path / "spec.yaml"))


def test_a_registration_rewrites_only_its_shards_lists_with_the_full_renders_bytes(tmp_path: Path) -> None:
    harness = file_sd_harness(tmp_path, replication_factor=2)
    controller, publisher = harness.controller, harness.controller.publisher
    assert publisher is not None
    base = [*fleet(30), *fleet(20, region="r2", start=100), *fleet(30, job="node")]
    harness.feed(base)
    assert controller.publish_configs()
    rendered = tmp_path / "data" / "rendered"
    before = on_disk(rendered)
    served = publisher.files

    newcomer = Target(address="10.7.0.1", port=9400, job="gpu", node="new-1", region="r1", gpus=8)
    harness.feed([*base, newcomer])
    assert not controller.publish_configs()  # the children set is the same: no bundle render
    after = on_disk(rendered)
    # the served map is replaced, never changed under a reader: the old one still says before
    assert dict(served) == before and dict(publisher.files) == after
    written = {path for path in after if after[path] != before.get(path)}
    assert controller.state.assignment is not None
    shard = controller.state.assignment.targets[newcomer.identity]
    assert written == {f"children/{shard}-r{k}/targets/gpu.json" for k in (0, 1)}
    assert b'"10.7.0.1:9400"' in after[f"children/{shard}-r0/targets/gpu.json"]
    full = full_render(harness)
    lists = {path: content for path, content in full.items() if "/targets/" in path}
    assert {path: after[path] for path in lists} == lists  # the bytes `gpufed render` writes
    assert publisher.status.version == controller.state.assignment_version
    assert not [p for p in after if p.startswith(".") or "/." in p]  # no staged file left behind


def test_a_removed_target_leaves_its_list_and_a_new_shard_renders_the_bundle(tmp_path: Path) -> None:
    harness = file_sd_harness(tmp_path)
    controller = harness.controller
    base = [*fleet(30), *fleet(20, region="r2", start=100)]
    harness.feed(base)
    assert controller.publish_configs()
    harness.feed(base[1:])
    controller.publish_configs()
    rendered = on_disk(tmp_path / "data" / "rendered")
    assert b'"10.0.0.2:9400"' not in b"".join(c for p, c in rendered.items() if "/targets/" in p)
    lists = {path: content for path, content in full_render(harness).items() if "/targets/" in path}
    assert {path: rendered[path] for path in lists} == lists


def test_changed_shards_compares_answers_by_object() -> None:
    same = ShardAnswers(members={}, by_job={}, whole=b"[]")
    before = SdSnapshot(version=1, shards={"a": same, "b": ShardAnswers(members={}, by_job={}, whole=b"[]")})
    after = SdSnapshot(version=2, shards={"a": same, "b": ShardAnswers(members={}, by_job={}, whole=b"[]"),
                                          "c": same})  # fmt: skip
    assert filesd.changed_shards(before, after) == {"b", "c"}


def odd_targets() -> list[Target]:
    """Labels the hand-written layout must escape as ``dump_json`` does: non-ASCII kept,
    quotes and backslashes escaped, no labels beyond the defaults, a rack and a team."""
    return [
        Target(address="10.0.0.1", port=9400, job="gpu", node="n-ü", region="r1", gpus=8),
        Target(address="10.0.0.2", port=9400, job="gpu", node="n2", region="r1", rack='r"1\\', team="a b"),
        Target(address="10.0.0.3", port=9400, job="gpu", node="n3", region="r1", labels={"zone": "東\n\\"}),
        Target(address="10.0.0.4", port=9100, job="node", node="n4", region="r1", gpus=0),
    ]


def test_a_list_is_dump_json_byte_for_byte_and_a_rewrite_encodes_only_what_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    targets = [*odd_targets(), *fleet(40)]
    members = {t.identity: t for t in targets}
    gpu = sorted(i for i, t in members.items() if t.job == "gpu")
    first = filesd.job_list(members, gpu, None)
    assert first.content == output.dump_json(target_groups([members[i] for i in gpu]))
    assert filesd.job_list({}, [], None).content == output.dump_json([])

    encoded: list[str] = []
    real = filesd.file_group
    monkeypatch.setattr(filesd, "file_group", lambda t: (encoded.append(t.identity), real(t))[1])
    changed = members[gpu[3]].model_copy(update={"team": "moved"})
    newcomer = Target(address="10.9.0.1", port=9400, job="gpu", node="new", region="r1")
    after = {**members, changed.identity: changed, newcomer.identity: newcomer}
    del after[gpu[0]]
    ids = sorted(i for i, t in after.items() if t.job == "gpu")
    second = filesd.job_list(after, ids, first)
    assert second.content == output.dump_json(target_groups([after[i] for i in ids]))
    assert sorted(encoded) == sorted([changed.identity, newcomer.identity])


def test_the_list_cache_writes_what_the_full_render_writes_across_changes(tmp_path: Path) -> None:
    harness = file_sd_harness(tmp_path)
    controller = harness.controller
    base = [*fleet(30), *fleet(20, region="r2", start=100)]
    harness.feed(base)
    assert controller.publish_configs()
    for n in range(3):  # the same shard written again and again: reused bytes, same files
        newcomer = Target(address=f"10.7.0.{n + 1}", port=9400, job="gpu", node=f"new-{n}", region="r1")
        base = [*base[1:], newcomer.model_copy(update={"rack": f"rack-{n}"})]
        harness.feed(base)
        controller.publish_configs()
    rendered = on_disk(tmp_path / "data" / "rendered")
    lists = {path: content for path, content in full_render(harness).items() if "/targets/" in path}
    assert {path: rendered[path] for path in lists} == lists


def test_a_refresh_waits_twenty_renders_so_a_slow_render_is_not_redone_often(tmp_path: Path) -> None:
    """With nothing the configs depend on changed, the bundle is rendered again only after
    ``config_refresh_s`` and at least REFRESH_SHARE times the last render's seconds."""
    from federation.controller.base.options import ControllerOptions
    from federation.controller.live import publish

    harness = build(tmp_path, options=ControllerOptions(debounce_s=0.0, grace_s=0.0, config_refresh_s=0.0))
    publication = harness.controller.publication
    harness.feed(fleet(4))
    assert publication._config_due is not None  # the first bundle
    assert harness.controller.publish_configs()
    publication._render_s = 1000.0  # as if that render had taken 1,000 s
    harness.feed(fleet(5))  # one more target: the same children, so only a refresh could render
    assert publication._config_due is None
    publication._config_at -= publish.REFRESH_SHARE * 1000.0 + 1
    harness.feed(fleet(6))
    assert publication._config_due is not None  # due again once 20 renders' time has passed


def test_a_change_after_a_render_cuts_the_renders_bytes_and_encodes_only_the_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lists a bundle render wrote are taken as written (``ListCache.seed``), and each
    change splices its shard's lists: a target is encoded when it is new or changed, never
    because its shard's list is written again. The bytes stay the full render's."""
    harness = file_sd_harness(tmp_path)
    controller = harness.controller
    base = [*fleet(120), *fleet(40, region="r2", start=300), *fleet(60, job="node")]
    harness.feed(base)
    assert controller.publish_configs()
    encoded: list[str] = []
    real = filesd.file_group
    monkeypatch.setattr(filesd, "file_group", lambda t: encoded.append(t.identity) or real(t))
    rendered = tmp_path / "data" / "rendered"
    current = list(base)
    for k in range(4):
        newcomer = Target(
            address=f"10.7.0.{k + 1}", port=9400, job="gpu", node=f"new-{k}", region="r1", gpus=8
        )
        current = [*current[1:], newcomer] if k % 2 else [*current, newcomer]  # a removal every other change
        encoded.clear()
        harness.feed(current)
        controller.publish_configs()
        assert controller.state.assignment is not None
        touched = controller.reconciler.placer.engine.touched  # type: ignore[union-attr]
        assert touched is not None and newcomer.identity in encoded
        assert set(encoded) <= touched, encoded  # not the 40 or so other members of the shard
        after = on_disk(rendered)
        lists = {path: content for path, content in full_render(harness).items() if "/targets/" in path}
        assert {path: after[path] for path in lists} == lists


def test_a_list_read_back_from_its_bytes_knows_where_each_group_starts() -> None:
    targets = {t.identity: t for t in [*odd_targets(), *fleet(5)]}
    ids = sorted(targets)
    content = output.dump_json(target_groups(targets.values()))
    written = filesd.read_list(targets, content, ids)
    assert written is not None and written.content == content
    assert [written.group(i, targets[i]) for i in ids] == [filesd.file_group(targets[i]) for i in ids]
    assert filesd.read_list(targets, content, ids[1:]) is None  # a count that differs: not taken
    assert filesd.read_list(targets, content, [*ids[1:], ids[0]]) is None  # another order: not taken
    assert filesd.read_list({}, b"[]\n", []) is not None and filesd.read_list({}, content, []) is None
