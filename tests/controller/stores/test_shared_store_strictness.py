"""The Kubernetes and Consul stores are as strict as SQLite (issue 29, item 5): a missing
head with leftovers, a missing piece and a generation older than one this replica saw are
clear refusals naming ``--init``; ``--init`` clears what a lost head left; orphaned pieces
are collected. Kubernetes against its stand-in (federation/testing/standins/kube.py), Consul against
its stand-in (federation.testing.standins.consul.agent); kmock runs the Kubernetes head case too."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from federation.controller.base.state import AuditEntry
from federation.controller.stores.store import StoreError
from federation.testing.standins.consul.agent import FakeConsulAgent
from federation.testing.standins.kube import FakeKubeAPI
from tests.controller.ha_helpers import client, state, store
from tests.controller.harness import fleet
from tests.controller.store_backends import kube_store

NS = "monitoring"


@pytest.fixture
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as running:
        yield running


@pytest.fixture
def agent() -> Iterator[FakeConsulAgent]:
    with FakeConsulAgent() as running:
        yield running


def audit(n: int) -> AuditEntry:
    return AuditEntry(at=float(n), actor="ops", action=f"save-{n}")


def committed(opened: Any, revisions: int = 3) -> Any:
    saved = None
    for n in range(revisions):
        saved = opened.save(
            state(40, assignment_version=n + 1),
            expected_revision=None if saved is None else saved.revision,
            audit=audit(n),
        )
    return saved


def configmaps(fake: FakeKubeAPI) -> list[str]:
    return sorted(name for (plural, _, name) in fake.objects if plural == "configmaps")


# ---- Kubernetes ------------------------------------------------------------------------------
def test_kube_a_deleted_head_is_refused_and_init_clears_the_leftovers(fake: FakeKubeAPI) -> None:
    committed(kube_store(fake))
    fake.delete("configmaps", "gpufed-state", NS)
    with pytest.raises(
        StoreError, match=r"head gpufed-state is missing, but \d+ of the store's objects"
    ) as refused:
        kube_store(fake).load()
    assert "--init" in str(refused.value)
    fresh = kube_store(fake, init=True)
    assert fresh.load() is None
    assert [n for n in configmaps(fake) if n.startswith("gpufed-state")] == []  # leftovers gone
    fresh.save(state(5), expected_revision=None)
    assert kube_store(fake).load() is not None


def test_kube_a_first_start_is_not_a_lost_head(fake: FakeKubeAPI) -> None:
    opened = kube_store(fake)
    assert opened.load() is None
    opened.save_sets({"file": []})  # sets may be saved before the first state
    assert kube_store(fake).load() is None


def test_kube_a_missing_piece_names_init(fake: FakeKubeAPI) -> None:
    committed(kube_store(fake))
    piece = next(n for n in configmaps(fake) if n.startswith("gpufed-state-") and n[13:14].isdigit())
    fake.delete("configmaps", piece, NS)
    with pytest.raises(StoreError, match=f"configmap {piece} is gone.*--init"):
        kube_store(fake).load()


def test_kube_an_older_generation_than_seen_is_refused(fake: FakeKubeAPI) -> None:
    opened = kube_store(fake)
    committed(opened, revisions=2)
    backup = {k: copy.deepcopy(v) for k, v in fake.objects.items()}
    committed_more = opened.save(state(40, assignment_version=9), expected_revision=2)
    assert committed_more.revision == 3 and opened.load() is not None
    head = backup[("configmaps", NS, "gpufed-state")]
    fake.apply(
        "configmaps",
        {**head, "metadata": {k: v for k, v in head["metadata"].items() if k != "resourceVersion"}},
    )
    with pytest.raises(
        StoreError, match=r"revision 2, older than revision 3 this replica already saw.*--init"
    ):
        opened.load()


def test_kube_orphaned_pieces_are_collected(fake: FakeKubeAPI) -> None:
    committed(kube_store(fake))
    orphan = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpufed-state-2-deadbeef0000-0",
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/managed-by": "gpufed",
                "gpufed.io/store": "gpufed-state",
                "gpufed.io/role": "piece",
            },
        },
        "binaryData": {"data": ""},
    }
    in_flight = copy.deepcopy(orphan)
    in_flight["metadata"]["name"] = "gpufed-state-4-feedface0000-0"  # the next save's: kept
    fake.apply("configmaps", orphan)
    fake.apply("configmaps", in_flight)
    kube_store(fake).save_sets({"file": fleet(2)})
    kube_store(fake).save_sets({"file": fleet(3)})  # the sets' head passes generation 2 too
    assert kube_store(fake).load() is not None
    names = configmaps(fake)
    assert "gpufed-state-2-deadbeef0000-0" not in names and "gpufed-state-4-feedface0000-0" in names


# ---- Consul ----------------------------------------------------------------------------------
def test_consul_a_deleted_head_is_refused_and_init_clears_the_leftovers(agent: FakeConsulAgent) -> None:
    committed(store(agent))
    client(agent).kv.delete("gpufed/state")
    with pytest.raises(StoreError, match=r"head gpufed/state is missing.*--init"):
        store(agent).load()
    fresh = store(agent, init=True)
    assert fresh.load() is None
    _, left = client(agent).kv.get("gpufed/audit/", keys=True)
    assert not left
    fresh.save(state(5), expected_revision=None)
    assert store(agent).load() is not None


def test_consul_a_first_start_is_not_a_lost_head(agent: FakeConsulAgent) -> None:
    opened = store(agent)
    assert opened.load() is None
    opened.save_sets({"file": []})
    assert store(agent).load() is None


def test_consul_an_older_generation_than_seen_is_refused(agent: FakeConsulAgent) -> None:
    opened = store(agent)
    committed(opened, revisions=2)
    _, head = client(agent).kv.get("gpufed/state")
    old = head["Value"]
    opened.save(state(40, assignment_version=9), expected_revision=2)
    assert opened.load() is not None
    client(agent).kv.put("gpufed/state", old)
    with pytest.raises(StoreError, match=r"revision 2, older than revision 3 this replica already saw"):
        opened.load()


def test_consul_an_audit_page_reads_what_it_holds(agent: FakeConsulAgent) -> None:
    """Issue 29 item 3: a page of one reads one entry, not the whole log."""
    opened = store(agent)
    committed(opened, revisions=40)
    agent.requests.clear()
    (newest,) = opened.audit_log(limit=1)
    assert newest.action == "save-39"
    reads = [path for method, path in agent.requests if method == "GET" and "/audit/" in path]
    assert not any("recurse" in path for path in reads), reads
    assert len([p for p in reads if "keys" not in p]) <= 1, reads
    assert [e.action for e in opened.audit_log(limit=3, before_id=newest.id)] == [
        "save-38",
        "save-37",
        "save-36",
    ]


# ---- a first commit racing a reader's "no head" --------------------------------------------------
def test_kube_a_first_commit_landing_between_the_head_read_and_the_listing_is_read(fake: FakeKubeAPI) -> None:
    """A follower starting beside a new leader: it reads no head, the leader commits its first
    state (head, then its audit page), the follower lists the store's objects and finds the
    page. That is a state being born, not a deleted one: it is read, not refused."""
    reader, writer = kube_store(fake), kube_store(fake)
    listed = reader.maps.list_names

    def list_after_a_commit(role: str) -> list[str]:
        if role == "audit" and reader.maps.head("gpufed-state") is None:
            writer.save(state(20), expected_revision=None, audit=audit(0))
        return listed(role)

    reader.maps.list_names = list_after_a_commit  # type: ignore[method-assign]
    loaded = reader.load()
    assert loaded is not None and loaded.revision == 1 and loaded.assignment is not None


def test_consul_a_first_commit_landing_between_the_head_read_and_the_listing_is_read(
    agent: FakeConsulAgent,
) -> None:
    reader, writer = store(agent), store(agent)
    real = reader._call

    def call_after_a_commit(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if what == "list audit" and writer._head(writer.state_key) is None:
            writer.save(state(20), expected_revision=None, audit=audit(0))
        return real(what, fn, *args, **kwargs)

    reader._call = call_after_a_commit  # type: ignore[method-assign]
    loaded = reader.load()
    assert loaded is not None and loaded.revision == 1 and loaded.assignment is not None


# ---- after a restart: an older head than the marker, a lone sets head (issue 38 item 5) --------------
def restored_older_head_kube(fake: FakeKubeAPI) -> None:
    """Three commits; the head of revision 2 put back (its pieces are still there)."""
    opened = kube_store(fake)
    committed(opened, revisions=2)
    backup = copy.deepcopy(fake.objects[("configmaps", NS, "gpufed-state")])
    assert opened.save(state(40, assignment_version=9), expected_revision=2).revision == 3
    fake.apply(
        "configmaps",
        {**backup, "metadata": {k: v for k, v in backup["metadata"].items() if k != "resourceVersion"}},
    )


def test_kube_an_older_head_put_back_before_a_restart_is_refused(fake: FakeKubeAPI) -> None:
    restored_older_head_kube(fake)
    with pytest.raises(StoreError) as refused:
        kube_store(fake).load()  # a new process: it saw nothing yet
    message = str(refused.value)
    assert "gpufed-state is at revision 2" in message and "records revision 3" in message, message
    assert "expected revision 3 or newer" in message and "--init" in message
    with pytest.raises(StoreError, match="records revision 3"):  # a save is refused too
        kube_store(fake).save(state(40), expected_revision=2)
    accepted = kube_store(fake, init=True).load()
    assert accepted is not None and accepted.revision == 2
    again = kube_store(fake).load()  # --init reset the marker: the next start is plain
    assert again is not None and again.revision == 2


def test_kube_a_lone_sets_head_is_a_deleted_state(fake: FakeKubeAPI) -> None:
    opened = kube_store(fake)
    committed(opened)
    opened.save_sets({"file": fleet(3)})
    sets = opened.maps.head("gpufed-state-sets")
    assert sets is not None
    keep = {"gpufed-state-sets"} | sets.objects()
    for name in configmaps(fake):
        if name.startswith("gpufed-state") and name not in keep:
            fake.delete("configmaps", name, NS)
    assert set(configmaps(fake)) == keep
    lone = r"head gpufed-state is missing, but 1 of .*-sets \(written at state revision 3\).*--init"
    with pytest.raises(StoreError, match=lone):
        kube_store(fake).load()
    fresh = kube_store(fake, init=True)
    assert fresh.load() is None and fresh.load_sets() == {}
    assert [n for n in configmaps(fake) if n.startswith("gpufed-state")] == []
    assert fresh.save(state(5), expected_revision=None).revision == 1


def test_kube_each_commit_writes_its_revision_to_the_marker(fake: FakeKubeAPI) -> None:
    opened = kube_store(fake)
    committed(opened, revisions=3)
    marker = fake.objects[("configmaps", NS, "gpufed-state-revision")]
    assert marker["data"] == {"marker": '{"revision": 3}'}


# ---- Consul ---------------------------------------------------------------------------------------
def test_consul_an_older_head_put_back_before_a_restart_is_refused(agent: FakeConsulAgent) -> None:
    opened = store(agent)
    committed(opened, revisions=2)
    _, head = client(agent).kv.get("gpufed/state")
    opened.save(state(40, assignment_version=9), expected_revision=2)
    client(agent).kv.put("gpufed/state", head["Value"])
    with pytest.raises(StoreError) as refused:
        store(agent).load()
    message = str(refused.value)
    assert "gpufed/state is at revision 2" in message and "records revision 3" in message, message
    assert "expected revision 3 or newer" in message and "--init" in message
    with pytest.raises(StoreError, match="records revision 3"):
        store(agent).save(state(40), expected_revision=2)
    accepted = store(agent, init=True).load()
    assert accepted is not None and accepted.revision == 2
    again = store(agent).load()
    assert again is not None and again.revision == 2


def test_consul_a_lone_sets_head_is_a_deleted_state(agent: FakeConsulAgent) -> None:
    opened = store(agent)
    committed(opened)
    opened.save_sets({"file": fleet(3)})
    kv = client(agent).kv
    for area in ("state-chunks/", "state-blocks/", "audit/"):
        kv.delete(f"gpufed/{area}", recurse=True)
    kv.delete("gpufed/state")
    kv.delete("gpufed/revision")
    _, left = kv.get("gpufed/", keys=True)
    assert "gpufed/sets" in left and all(k == "gpufed/sets" or k.startswith("gpufed/sets-") for k in left)
    lone = r"head gpufed/state is missing, but 1 of .*gpufed/sets \(written at state revision 3\).*--init"
    with pytest.raises(StoreError, match=lone):
        store(agent).load()
    fresh = store(agent, init=True)
    assert fresh.load() is None and fresh.load_sets() == {}
    _, left = kv.get("gpufed/", keys=True)
    assert not left
    assert fresh.save(state(5), expected_revision=None).revision == 1
