"""The sets' buckets: a change dirties the buckets holding what it names, nothing else."""

from __future__ import annotations

import json

from federation.controller.stores import setbuckets
from sharder.sources.lastknown import target_document
from tests.controller.harness import fleet


def test_a_change_dirties_only_its_buckets_and_a_new_source_too() -> None:
    targets = fleet(9000)
    buckets = setbuckets.SetBuckets.from_sets({"file": targets}, current=None)
    assert buckets.count == 5  # 2,000 a bucket
    before = buckets.payloads()
    newcomer = fleet(1, start=20_000)[0]
    dirty = buckets.apply({"registry": {newcomer.identity: newcomer}, "file": {targets[0].identity: None}})
    expected = {setbuckets.bucket_of(t.identity, 5) for t in (newcomer, targets[0])}
    assert dirty == expected
    after = buckets.payloads()
    assert {i for i in range(5) if after[i] != before[i]} == expected
    held = json.loads(after[setbuckets.bucket_of(newcomer.identity, 5)])
    assert len(held["registry"]) == 1
    assert held["registry"][0]["address"] == newcomer.address
    untouched = next(i for i in range(5) if i not in expected)
    assert "registry" not in json.loads(after[untouched])  # a bucket names the sources it holds


def test_growth_past_four_times_the_buckets_is_not_a_delta() -> None:
    buckets = setbuckets.SetBuckets.from_sets({"file": fleet(10)}, current=None)
    assert buckets.count == 1
    many = {"registry": {t.identity: t for t in fleet(9000, start=100)}}
    assert not buckets.fits(many)
    assert buckets.fits({"registry": {t.identity: t for t in fleet(10, start=100)}})


def test_a_payload_is_the_json_of_its_documents_byte_for_byte() -> None:
    """Joined from the entries' encoded bytes, a bucket is exactly what dumping its documents
    in identity order gives (sources sorted, a source without entries left out)."""
    targets = fleet(300) + fleet(5, region="r2", start=900)
    buckets = setbuckets.SetBuckets.from_sets({"file": targets, "registry": targets[:7]}, current=None)
    gone = {t.identity: None for t in targets[:7]}
    buckets.apply({"registry": gone, "consul": {targets[3].identity: targets[3]}})
    expected = setbuckets.dumps(
        {
            "consul": [target_document(targets[3])],
            "file": [target_document(t) for t in sorted(targets, key=lambda t: t.identity)],
        }
    )
    assert buckets.count == 1 and buckets.payload(0) == expected
    assert setbuckets.SetBuckets(count=1, sources=["file"]).payload(0) == b"{}"


def test_the_mirror_packs_a_buckets_entries_and_a_change_repacks_only_its_buckets() -> None:
    targets = fleet(5000)
    buckets = setbuckets.SetBuckets.from_sets({"file": targets}, current=None)
    packed = [group["file"] for group in buckets.groups]
    assert sum(len(p.ids) for p in packed) == 5000 and all(p.ids == sorted(p.ids) for p in packed)
    # held compressed: no string per identity, no document bytes as they are sent (issue #44)
    assert sum(len(p.blob) for p in packed) * 3 < sum(len(p.content) for p in packed)
    assert all(isinstance(p.blob, bytes) and p.count == len(p.ids) for p in packed)
    first = packed[0]
    assert first.entries() == {t.identity: setbuckets._entry(t) for t in targets
                               if setbuckets.bucket_of(t.identity, buckets.count) == 0}  # fmt: skip
    moved = targets[1].model_copy(update={"node": "elsewhere"})
    dirty = buckets.apply({"file": {moved.identity: moved, targets[2].identity: None}})
    assert all(buckets.groups[i]["file"] is packed[i] for i in range(buckets.count) if i not in dirty)
    rest = [moved, *targets[3:], targets[0]]
    again = setbuckets.SetBuckets.from_sets({"file": rest}, current=buckets.count)
    assert buckets.payloads() == again.payloads()


def test_a_rebuilt_mirror_is_the_stored_sets_with_the_changes_cut_afresh() -> None:
    stored = {"file": fleet(30), "registry": fleet(3, start=500)}
    newcomer, gone = fleet(1, start=900)[0], stored["file"][0]
    changes = {"file": {gone.identity: None}, "consul": {newcomer.identity: newcomer}}
    mirror = setbuckets.rebuilt(stored, changes, current=None)
    expected = setbuckets.SetBuckets.from_sets(
        {"file": stored["file"][1:], "registry": stored["registry"], "consul": [newcomer]}, current=None
    )
    assert mirror.count == expected.count and mirror.payloads() == expected.payloads()
