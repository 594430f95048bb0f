"""ConsulStore over the Consul stand-in through py-consul: CAS, conflicts, fencing, chunking."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores import consul_kv, kvblob
from federation.controller.stores.consul_store import ConsulStore
from federation.controller.stores.store import FencedOut, StoreConflict, StoreError
from federation.testing.standins.consul.agent import FakeConsulAgent
from tests.controller.ha_helpers import client, state, store
from tests.controller.harness import fleet
from tests.controller.store_backends import race_writers


@pytest.fixture
def agent() -> Iterator[FakeConsulAgent]:
    with FakeConsulAgent() as running:
        yield running


def keys(agent: FakeConsulAgent, prefix: str) -> list[str]:
    _, found = client(agent).kv.get(prefix, keys=True)
    return found or []


def audit(action: str, **detail: Any) -> AuditEntry:
    return AuditEntry(at=1.0, actor="ops", action=action, detail=detail)


def test_an_empty_store_holds_nothing(agent: FakeConsulAgent) -> None:
    s = store(agent)
    assert s.load() is None
    assert s.audit_log() == []
    assert s.load_sets() == {}


def test_save_is_check_and_set_on_the_revision(agent: FakeConsulAgent) -> None:
    s = store(agent)
    first = s.save(state(), expected_revision=None)
    assert first.revision == 1
    second = s.save(first.model_copy(update={"assignment_version": 2}), expected_revision=1)
    assert second.revision == 2
    with pytest.raises(StoreConflict) as lost:
        s.save(first.model_copy(update={"assignment_version": 9}), expected_revision=1)
    assert (lost.value.expected, lost.value.found) == (1, 2)
    with pytest.raises(StoreConflict):
        s.save(state(), expected_revision=None)  # "nothing stored yet" is stale too
    loaded = store(agent).load()  # a second replica sees the committed state, not the losers
    assert loaded == second


class Paused(ConsulStore):
    """A store whose save stops after reading the head (between its read and its CAS)."""

    def __init__(self, *args: Any, gate: threading.Event, reached: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.reached = gate, reached

    def _write_blob(self, area: str, blob: kvblob.Blob, *, generation: int) -> dict[str, object]:
        if area == "state-chunks":
            self.reached.set()
            assert self.gate.wait(10)
        return super()._write_blob(area, blob, generation=generation)


def paused_store(agent: FakeConsulAgent) -> tuple[Paused, threading.Event, threading.Event]:
    gate, reached = threading.Event(), threading.Event()
    return Paused(client(agent), gate=gate, reached=reached), gate, reached


def test_two_writers_racing_on_one_revision_one_wins_the_other_conflicts(agent: FakeConsulAgent) -> None:
    base = store(agent).save(state(), expected_revision=None)
    slow, gate, reached = paused_store(agent)
    outcome: dict[str, Any] = {}

    def late() -> None:
        try:
            outcome["late"] = slow.save(base.model_copy(update={"last_plan": "late"}), expected_revision=1)
        except StoreConflict as exc:
            outcome["late"] = exc

    thread = threading.Thread(target=late)
    thread.start()
    assert reached.wait(10)  # the slow writer has read revision 1 and is about to write
    winner = store(agent).save(base.model_copy(update={"last_plan": "early"}), expected_revision=1)
    gate.set()
    thread.join(10)
    assert isinstance(outcome["late"], StoreConflict)
    assert outcome["late"].found == 2
    assert store(agent).load() == winner
    assert winner.last_plan == "early"


def test_concurrent_writers_that_retry_lose_no_update(agent: FakeConsulAgent) -> None:
    store(agent).save(ControllerState(), expected_revision=None)
    per_writer, writers = 8, 3
    race_writers(lambda: store(agent), writers=writers, per_writer=per_writer)
    final = store(agent).load()
    assert final is not None
    assert sorted(final.desired.weights) == sorted(
        f"w{i}-{n}" for i in range(writers) for n in range(per_writer)
    )
    assert final.revision == 1 + writers * per_writer


def test_a_write_with_an_older_fence_is_refused(agent: FakeConsulAgent) -> None:
    s = store(agent)
    saved = s.save(state(), expected_revision=None, fence=10)
    saved = s.save(saved, expected_revision=saved.revision, fence=12)
    with pytest.raises(FencedOut, match="token 10 is older than 12"):
        s.save(saved, expected_revision=saved.revision, fence=10)
    head = json.loads(client(agent).kv.get("gpufed/state")[1]["Value"])
    assert head["fence"] == 12 and head["revision"] == saved.revision == 2


def test_a_deposed_leaders_write_in_flight_fails_once_the_new_leader_wrote(agent: FakeConsulAgent) -> None:
    base = store(agent).save(state(), expected_revision=None, fence=5)
    old, gate, reached = paused_store(agent)
    outcome: dict[str, Any] = {}

    def deposed() -> None:
        try:
            outcome["old"] = old.save(
                base.model_copy(update={"last_plan": "stale"}), expected_revision=1, fence=5
            )
        except StoreError as exc:
            outcome["old"] = exc

    thread = threading.Thread(target=deposed)
    thread.start()
    assert reached.wait(10)  # it checked the fence (5 >= 5) and paused, as under SIGSTOP
    store(agent).save(base, expected_revision=1, fence=9)  # the new leader records its token
    gate.set()
    thread.join(10)
    assert isinstance(outcome["old"], FencedOut)
    loaded = store(agent).load()
    assert loaded is not None and loaded.last_plan is None and loaded.revision == 2


def test_a_state_over_512_kib_is_split_per_shard_compressed_and_chunked(agent: FakeConsulAgent) -> None:
    big = state(40_000)
    raw = big.model_copy(update={"revision": 1}).model_dump_json().encode()
    assert len(raw) > 512 * 1024
    s = store(agent, chunk_bytes=16 * 1024)
    s.save(big, expected_revision=None)
    head = json.loads(client(agent).kv.get("gpufed/state")[1]["Value"])
    assert head["format"] == 2 and len(keys(agent, "gpufed/state-chunks/")) == head["chunks"]
    block_keys = keys(agent, "gpufed/state-blocks/")
    folders = {k.rsplit("/", 1)[0] for k in block_keys}
    assert len(folders) == 4 and len(block_keys) > 4  # one block per shard, each over one chunk
    values = [client(agent).kv.get(k)[1]["Value"] for k in block_keys + keys(agent, "gpufed/state-chunks/")]
    assert all(len(v) <= 16 * 1024 for v in values) and sum(map(len, values)) < len(raw) / 3
    fresh = store(agent)  # no cache: reads every chunk
    assert fresh.load() == big.model_copy(update={"revision": 1})


class Counting(ConsulStore):
    """Counts the placement blocks a save writes."""

    blocks_written = 0

    def _write_blob(self, area: str, blob: kvblob.Blob, *, generation: int) -> dict[str, object]:
        if area == "state-blocks":
            self.blocks_written += 1
        return super()._write_blob(area, blob, generation=generation)


def moved(saved: ControllerState, identity: str, to: str) -> ControllerState:
    assert saved.assignment is not None
    targets = {**saved.assignment.targets, identity: to}
    return saved.model_copy(update={"assignment": saved.assignment.model_copy(update={"targets": targets})})


@pytest.mark.parametrize("hinted", [True, False])
def test_a_change_writes_the_blocks_of_the_shards_it_touched_only(
    agent: FakeConsulAgent, hinted: bool
) -> None:
    s = Counting(client(agent))
    saved = s.save(state(2_000), expected_revision=None)
    assert s.blocks_written == 4 and saved.assignment is not None
    identity = next(i for i, shard in saved.assignment.targets.items() if shard == "r1-0")
    change = moved(saved, identity, "r1-1")
    hint = (saved.assignment, {identity}) if hinted else None
    again = s.save(change, expected_revision=saved.revision, changed=hint)
    assert s.blocks_written == 4 + 2  # r1-0 lost the target, r1-1 gained it; r1-2 and r1-3 kept
    assert store(agent).load() == again and again.assignment is not None
    assert again.assignment.targets[identity] == "r1-1"
    untouched = s.save(again, expected_revision=again.revision, changed=(again.assignment, set()))
    assert s.blocks_written == 6 and store(agent).load() == untouched


def test_blocks_no_longer_named_are_collected_keeping_the_previous_ones(agent: FakeConsulAgent) -> None:
    s = store(agent)
    saved = s.save(state(200), expected_revision=None)
    assert saved.assignment is not None
    identities = sorted(saved.assignment.targets)
    for n in range(6):
        base = saved.assignment
        assert base is not None
        saved = s.save(
            moved(saved, identities[n], f"r1-{(n % 4)}"), expected_revision=saved.revision,
            changed=(base, {identities[n]}),
        )
    folders = client(agent).kv.get("gpufed/state-blocks/", keys=True, separator="/")[1]
    assert folders and all(
        kvblob.generation_of(f) is not None for f in folders
    ) and len(folders) <= 4 + 2 * 2  # what the newest head names, plus what the previous one did
    assert store(agent).load() == saved


def test_a_change_lists_no_folder_and_writes_only_what_it_touched(agent: FakeConsulAgent) -> None:
    s = store(agent)
    saved = s.save(state(2_000), expected_revision=None)
    assert saved.assignment is not None
    identity = next(i for i, shard in saved.assignment.targets.items() if shard == "r1-0")
    agent.requests.clear()
    again = s.save(moved(saved, identity, "r1-1"), expected_revision=saved.revision,
                   changed=(saved.assignment, {identity}))  # fmt: skip
    listed = [path for method, path in agent.requests if method == "GET" and "keys" in path]
    assert listed == []  # the folders come from what the previous commit named
    written = sorted(path.split("?")[0] for method, path in agent.requests if method == "PUT")
    blocks = {p.rsplit("/", 1)[0] for p in written if "/state-blocks/" in p}
    rest = {p for p in written if "/state-blocks/" not in p}
    chunks = {p for p in written if "/state-chunks/" in p}
    # the head, then the revision marker after it (store_guard)
    assert len(blocks) == 2 and rest == chunks | {"/v1/kv/gpufed/state", "/v1/kv/gpufed/revision"}
    assert store(agent).load() == again


def test_folders_a_lost_writer_left_are_collected_by_the_next_listing(
    agent: FakeConsulAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consul_kv, "RESCAN_EVERY", 3)
    s = store(agent)
    saved = s.save(state(200), expected_revision=None)
    orphan = kvblob.chunk_keys("gpufed/state-blocks", generation=2, digest="f" * 64, count=1)[0]
    client(agent).kv.put(orphan, b"a writer that lost its check-and-set")
    for n in range(2, 8):
        saved = s.save(saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision)
    assert orphan not in keys(agent, "gpufed/state-blocks/")
    assert store(agent).load() == saved


def test_a_state_an_older_gpufed_stored_in_one_blob_is_read_and_the_next_save_splits_it(
    agent: FakeConsulAgent,
) -> None:
    old = state(300).model_copy(update={"revision": 1})
    blob = kvblob.encode(old.model_dump_json().encode())
    chunk_keys = kvblob.chunk_keys(
        "gpufed/state-chunks", generation=1, digest=blob.digest, count=len(blob.parts)
    )
    for key, part in zip(chunk_keys, blob.parts, strict=True):
        client(agent).kv.put(key, part)
    head = {"format": 1, "revision": 1, "fence": 3, "audit": None, **blob.describe(generation=1)}
    client(agent).kv.put("gpufed/state", json.dumps(head))
    s = store(agent)
    assert s.load() == old
    saved = s.save(old.model_copy(update={"assignment_version": 2}), expected_revision=1, fence=3)
    assert json.loads(client(agent).kv.get("gpufed/state")[1]["Value"])["format"] == 2
    assert len({k.rsplit("/", 1)[0] for k in keys(agent, "gpufed/state-blocks/")}) == 4
    assert store(agent).load() == saved and saved.revision == 2


def test_a_state_whose_chunks_exceed_consuls_limit_is_refused_by_consul_not_truncated(
    agent: FakeConsulAgent,
) -> None:
    s = store(agent, chunk_bytes=600 * 1024)
    noisy = state(2).model_copy(update={"last_plan": os.urandom(700 * 1024).hex()})  # incompressible
    with pytest.raises(StoreError, match=r"413|too large"):
        s.save(noisy, expected_revision=None)
    assert store(agent).load() is None


def test_old_chunk_sets_are_collected_keeping_the_previous_one(agent: FakeConsulAgent) -> None:
    s = store(agent)
    saved = s.save(state(), expected_revision=None)
    for n in range(2, 7):
        saved = s.save(saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision)
    folders = client(agent).kv.get("gpufed/state-chunks/", keys=True, separator="/")[1]
    assert [kvblob.generation_of(f) for f in folders] == [5, 6]


def test_a_reader_that_meets_collected_chunks_reads_the_head_again(agent: FakeConsulAgent) -> None:
    writer = store(agent)
    saved = writer.save(state(), expected_revision=None)
    reached, gate = threading.Event(), threading.Event()

    class SlowReader(ConsulStore):
        first = True

        def _read_blob(self, area: str, head: Any) -> bytes:
            if self.first:
                self.first = False
                reached.set()
                assert gate.wait(10)
            return super()._read_blob(area, head)

    reader = SlowReader(client(agent))
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("state", reader.load()))
    thread.start()
    assert reached.wait(10)  # it holds head revision 1
    for n in range(2, 5):  # revision 1's chunks are collected meanwhile
        saved = writer.save(
            saved.model_copy(update={"assignment_version": n}), expected_revision=saved.revision
        )
    gate.set()
    thread.join(10)
    assert result["state"] == saved


def test_a_corrupt_chunk_is_an_error_never_a_wrong_state(agent: FakeConsulAgent) -> None:
    store(agent).save(state(), expected_revision=None)
    (chunk,) = keys(agent, "gpufed/state-chunks/")
    client(agent).kv.put(chunk, b"\x78\x9c garbage")
    with pytest.raises(StoreError, match="kept changing"):
        store(agent).load()


def test_audit_entries_commit_with_their_state_and_page_newest_first(agent: FakeConsulAgent) -> None:
    s = store(agent)
    saved = s.save(state(), expected_revision=None, audit=audit("first"))
    saved = s.save(saved, expected_revision=1)  # a discovery write: no entry
    saved = s.save(saved, expected_revision=2, audit=audit("third", moved=3))
    with pytest.raises(StoreConflict):
        s.save(saved, expected_revision=1, audit=audit("lost"))
    entries = store(agent).audit_log()
    assert [(e.id, e.action) for e in entries] == [(3, "third"), (1, "first")]
    assert entries[0].detail == {"moved": 3}
    assert [e.id for e in s.audit_log(before_id=3)] == [1]
    assert [e.id for e in s.audit_log(limit=1)] == [3]
    assert sorted(keys(agent, "gpufed/audit/")) == ["gpufed/audit/000000000001", "gpufed/audit/000000000003"]


def test_the_audit_log_is_bounded(agent: FakeConsulAgent) -> None:
    s = store(agent, audit_keep=5)
    saved = s.save(state(), expected_revision=None, audit=audit("n0"))
    for n in range(1, 60):
        saved = s.save(saved, expected_revision=saved.revision, audit=audit(f"n{n}"))
    assert len(keys(agent, "gpufed/audit/")) <= 5 + 50
    assert [e.action for e in s.audit_log(limit=5)] == [f"n{n}" for n in range(59, 54, -1)]


def test_a_huge_audit_detail_keeps_its_summary_only(agent: FakeConsulAgent) -> None:
    s = store(agent)
    pins = {f"node-{i}:9400": "r1-0" for i in range(5000)}
    assert audit("rebalance", pins=pins).detail["pins_count"] == 5000  # the model cuts id lists
    # A detail still too big for one key (many top-level keys) keeps its summary only.
    wide = {f"k{i:05d}-" + "v" * 40: i for i in range(5000)}
    s.save(state(), expected_revision=None, audit=audit("rebalance", **wide))
    (entry,) = s.audit_log()
    assert entry.detail["truncated"] is True and entry.detail["keys"][:2] == sorted(wide)[:2]


def test_last_known_sets_round_trip_and_an_unchanged_set_is_not_rewritten(agent: FakeConsulAgent) -> None:
    s = store(agent)
    sets = {"file": fleet(30), "registry": fleet(5, region="r2", start=100)}
    s.save_sets(sets)
    by_identity = {name: sorted(targets, key=lambda t: t.identity) for name, targets in sets.items()}
    assert store(agent).load_sets() == by_identity  # stored in identity order: the same bytes each time
    index = client(agent).kv.get("gpufed/sets")[1]["ModifyIndex"]
    s.save_sets({name: list(reversed(targets)) for name, targets in sets.items()})
    assert client(agent).kv.get("gpufed/sets")[1]["ModifyIndex"] == index
    s.save_sets({"file": fleet(3)})
    assert store(agent).load_sets() == {"file": fleet(3)}


class SetsWrittenMeanwhile(ConsulStore):
    """A store that finds no sets head, and another store writes the sets right after that read
    (a replica starting beside a leader that writes its first sets)."""

    def __init__(self, *args: Any, other: ConsulStore, sets: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.other, self.to_write, self.met = other, sets, False

    def _head(self, key: str) -> consul_kv.Head | None:
        head = super()._head(key)
        if key == "gpufed/sets" and head is None and not self.met:
            self.met = True
            self.other.save_sets(self.to_write)
        return head


def test_sets_first_written_while_a_reader_reads_them_are_no_torn_read(agent: FakeConsulAgent) -> None:
    """The reader saw no sets head, then read the head again as the old one-blob layout and
    met the new bucket head 5 times: "test/sets kept changing under 5 reads" (a replica's start
    in test_replicas_consul under load). No head is no sets; the next read finds them."""
    reader = SetsWrittenMeanwhile(
        client(agent), where=f"consul://{agent.address}", other=store(agent), sets={"file": fleet(3)}
    )
    assert reader.load_sets() == {}
    assert reader.met
    assert reader.load_sets() == {"file": fleet(3)}


def test_prefixes_keep_two_controllers_apart(agent: FakeConsulAgent) -> None:
    store(agent, prefix="prod/gpufed").save(state(), expected_revision=None)
    assert store(agent, prefix="staging/gpufed").load() is None
    assert store(agent, prefix="prod/gpufed").load() is not None


def test_consul_unreachable_is_a_store_error_naming_the_store(agent: FakeConsulAgent) -> None:
    s = store(agent)
    s.client.http.connections_timeout = 2
    agent.kill()
    try:
        with pytest.raises(StoreError, match=f"consul://{agent.address}"):
            s.load()
    finally:
        agent.revive()
