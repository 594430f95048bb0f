"""The state store interface; SQLite (``sqlite_store``) is the embedded default.

A store keeps one :class:`~federation.controller.base.state.ControllerState`, the audit log
and the discovery sources' last known target sets. Every write is check-and-set on the
state's ``revision``: a writer that read an older revision gets :class:`StoreConflict`
and must re-read, never overwrite. ``fence`` is the leadership token of the writer
(a lock index or Lease resourceVersion; None where there is one controller): a store
that knows a newer token refuses the write with :class:`FencedOut`.

    StoreError
    ├── StoreConflict   the state changed since it was read (CAS lost)
    └── FencedOut       the writer is no longer the leader
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from federation.controller.base.state import AuditEntry, ControllerState
from sharder.engine.assignment import Assignment
from sharder.engine.step import SetChanges
from sharder.model.inventory import Target

log = logging.getLogger(__name__)

Changed = tuple[Assignment, Collection[str]]
"""(the assignment a new one was made from, the identities that may differ from it)."""


class StoreError(Exception):
    """The store could not read or write (its message says why)."""


class StoreConflict(StoreError):
    def __init__(self, *, expected: int | None, found: int) -> None:
        self.expected, self.found = expected, found
        super().__init__(f"state changed meanwhile: expected revision {expected}, found {found}")


class FencedOut(StoreError):
    """A write from a deposed leader."""


def check_fence(fence: int | None, recorded: object) -> None:
    """``FencedOut`` when the writer's token is older than the newest one a head recorded."""
    if fence is not None and isinstance(recorded, int) and fence < recorded:
        raise FencedOut(f"write fenced out: token {fence} is older than {recorded} (a newer leader wrote)")


def check_head(fence: int | None, recorded: object, *, expected: int | None, found: int | None) -> None:
    """What a shared store checks against the head it read before writing: the fence first
    (a deposed leader learns it is deposed, not that it lost a race), then the revision."""
    check_fence(fence, recorded)
    if found != expected:
        raise StoreConflict(expected=expected, found=-1 if found is None else found)


@dataclass(frozen=True)
class Commit:
    """Everything one change writes, in one fenced call (:meth:`StateStore.apply`): the
    state (check-and-set on ``expected_revision``), its audit entry, the set changes the
    step carries, and ``changed`` (what placement may differ from the stored assignment,
    so a store writes only those rows, blocks or buckets).

    A commit without a state (:meth:`journal`) carries set changes alone: a registry
    deletion, durable before it is answered, fenced like any other write."""

    state: ControllerState | None
    expected_revision: int | None
    audit: AuditEntry | None = None
    changed: Changed | None = None
    sets: SetChanges = field(default_factory=dict)

    @classmethod
    def journal(cls, sets: SetChanges) -> Commit:
        """Set changes with no state: what a registry deletion writes before its 204."""
        return cls(state=None, expected_revision=None, sets=sets)


class StateStore(Protocol):
    """The controller's store: one door in (:meth:`apply`, a fenced :class:`Commit`), reads
    out. Backends keep their own writers (a state's rows, a source's sets) as helpers behind
    ``apply``; nothing in the controller writes past it."""

    def apply(self, commit: Commit, *, fence: int | None) -> ControllerState | None:
        """Write ``commit`` (a writer with a ``fence`` older than the newest recorded writes
        none of it: ``FencedOut``); returns the state with its new ``revision`` (None for a
        commit that carries no state: a journal entry)."""
        ...

    def load(self) -> ControllerState | None:
        """The stored state, or None before the first write."""
        ...

    def audit_log(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        """Newest first; ``before_id`` pages back."""
        ...

    def load_sets(self) -> dict[str, list[Target]]: ...

    def close(self) -> None: ...


def newest_audit(found: Mapping[int, Mapping[str, Any]], *, limit: int, top: int | None) -> list[AuditEntry]:
    """Audit entries read from a key-value store, newest first, ids up to ``top``: an entry
    that does not validate is logged and skipped (a page of the log must still answer)."""
    out: list[AuditEntry] = []
    for audit_id in sorted(found, reverse=True):
        if top is not None and audit_id > top:
            continue
        try:
            out.append(AuditEntry.model_validate({**found[audit_id], "id": audit_id}))
        except ValueError as exc:
            log.warning("skipping invalid audit entry %d: %s", audit_id, exc)
        if len(out) >= limit:
            break
    return out


def apply_in_order(store: Any, commit: Commit, *, fence: int | None) -> ControllerState | None:
    """A key-value store's :meth:`StateStore.apply`: the set buckets first, then the state
    head, the commit point (a reader never meets a state naming sets not written yet), both
    checked against ``fence``. A journal commit (no state) writes its buckets only, and
    returns once they are stored."""
    if commit.sets:
        store.save_set_changes(commit.sets, fence=fence)
    if commit.state is None:
        return None
    saved: ControllerState = store.save(
        commit.state, expected_revision=commit.expected_revision, audit=commit.audit, fence=fence,
        changed=commit.changed,
    )  # fmt: skip
    return saved


MAX_AUDIT_BYTES = 32 * 1024
"""An audit entry's largest document in a key-value store; a bigger detail is summarised."""


def without_placements(state: ControllerState) -> ControllerState:
    """The state document's part: every store keeps the placements in rows or blocks of their own."""
    if state.assignment is None:
        return state
    return state.model_copy(
        update={"assignment": state.assignment.model_copy(update={"targets": {}, "weights": {}})}
    )


class StateDocuments:
    """``without_placements(state).model_dump_json()``, byte for byte, with the assignment's
    part encoded once per ``shards`` dict: a change that keeps the shard set shares that
    dict (the incremental engine's), and thousands of shards are nearly all of the document
    (12,501 at 300,000 targets of the shipped spec). One per store, used under its lock."""

    _SLOT = '"assignment":null'

    def __init__(self) -> None:
        self._held: tuple[object, tuple[object, ...], str] | None = None
        """(the shards dict, the assignment's other fields, its JSON without placements)."""

    def json(self, state: ControllerState) -> str:
        assignment = state.assignment
        if assignment is None:
            return state.model_dump_json()
        out = state.model_copy(update={"assignment": None}).model_dump_json()
        if out.count(self._SLOT) != 1:  # cannot happen (no other field holds a null under that key)
            return without_placements(state).model_dump_json()
        return out.replace(self._SLOT, f'"assignment":{self.assignment_json(assignment)}')

    def assignment_json(self, assignment: Assignment) -> str:
        """The assignment without placements, as JSON: the same string object while the
        shard set (and the fields beside it) stay the same, so a store can tell by identity
        that this part is unchanged and need not write it again."""
        rest = (assignment.algorithm, assignment.algorithm_version, assignment.replication_factor,
                tuple(assignment.drained))  # fmt: skip
        held = self._held
        if held is None or held[0] is not assignment.shards or held[1] != rest:
            part = assignment.model_copy(update={"targets": {}, "weights": {}}).model_dump_json()
            held = self._held = (assignment.shards, rest, part)
        return held[2]


def audit_document(audit: AuditEntry) -> dict[str, Any]:
    """An audit entry as a key-value store keeps it (a detail over ``MAX_AUDIT_BYTES``: its keys)."""
    doc = audit.model_dump(mode="json", exclude={"id"})
    size = len(json.dumps(doc))
    if size > MAX_AUDIT_BYTES:
        doc["detail"] = {"truncated": True, "bytes": size, "keys": sorted(audit.detail)[:50]}
    return doc
