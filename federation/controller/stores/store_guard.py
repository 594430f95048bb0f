"""What makes the shared stores (Kubernetes ConfigMaps, Consul KV) as strict as SQLite on read.

SQLite keeps a marker beside its file (``integrity.Marker``), so a deleted, emptied or
rolled-back state is refused unless the operator says ``--init``. The shared stores have
no local disk worth trusting (a pod's is gone with it), so they check what they can see:

* **a missing head with leftovers**: pieces, audit entries or the sets' head of this
  store exist but the state's head does not, so the state was deleted, not never
  written. Refused; with ``--init`` the leftovers are removed and the controller starts
  empty (a store with nothing in it is a first start, as before);
* **an older generation**: a head whose revision is below the highest this replica has
  read or written (the store was restored from a backup, or another cluster's state was
  copied in). Refused; a restart with ``--init`` starts from what is there;
* **a rolled-back head after a restart**: each commit is followed by one small write of
  its revision to a marker beside the head (``<prefix>-revision`` ConfigMap, ``P/revision``
  key), as SQLite's ``.initialised``. A restore of the head alone leaves the marker ahead of
  it: the first load of a new process reads the marker *before* the head (so a commit
  landing between the two reads never looks like a rollback) and refuses a head below it.
  The marker only ever trails the head (written after the commit; a failed write is
  logged), so it can never refuse a good state. ``--init`` accepts the head and resets it;
* **a lone sets head**: the sets' head records the newest state revision its writer had
  seen (``state``); one that had seen a state, with the state's head and its marker gone,
  is a leftover like an audit entry (sets saved before any state are a first start);
* **a missing piece**: reported by the store's own read, with ``--init`` named.

Orphaned pieces (a writer that died between its pieces and its head) are collected by
the Kubernetes store (``kube_store``); the Consul store collects its chunks on every save.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from federation.controller.stores.store import StoreError

INIT_HINT = "start afresh with --init"


class RevisionWatch:
    """The highest state revision this replica has read or written."""

    def __init__(self) -> None:
        self.highest = 0
        self._lock = threading.Lock()

    def saw(self, revision: int, *, where: str) -> None:
        """Note ``revision``; ``StoreError`` when it is older than one seen before."""
        with self._lock:
            if revision < self.highest:
                raise StoreError(
                    f"state store {where}: the state is at revision {revision}, older than revision "
                    f"{self.highest} this replica already saw (restored from a backup, or replaced); "
                    f"{INIT_HINT}"
                )
            self.highest = revision


def missing_head(where: str, head: str, leftovers: Sequence[str]) -> StoreError:
    shown = ", ".join(sorted(leftovers)[:3]) + (", ..." if len(leftovers) > 3 else "")
    return StoreError(
        f"state store {where}: the state's head {head} is missing, but {len(leftovers)} of the "
        f"store's objects remain ({shown}): the state was deleted, not never written; {INIT_HINT} "
        "(the leftovers are then removed)"
    )


def marker_revision(text: str | bytes | None, *, where: str, name: str) -> int | None:
    """The revision a marker holds; None: no marker. ``StoreError`` when it does not parse."""
    if text is None:
        return None
    try:
        revision = json.loads(text)["revision"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"state store {where}: the revision marker {name} is damaged ({str(text)[:60]!r}); {INIT_HINT}"
        ) from exc
    if type(revision) is not int or revision < 0:
        raise StoreError(f"state store {where}: the revision marker {name} holds {revision!r}, not one")
    return revision


def marker_text(revision: int) -> str:
    return json.dumps({"revision": revision})


def rolled_back(where: str, head: str, found: int, marker: str, recorded: int) -> StoreError:
    return StoreError(
        f"state store {where}: the state's head {head} is at revision {found}, but the revision "
        f"marker {marker} records revision {recorded} as committed: the head was rolled back "
        f"(an older copy put back); expected revision {recorded} or newer; {INIT_HINT}"
    )


def lone_sets(head: str, revision: int) -> str:
    """A sets head as a leftover: it was written after the state reached ``revision``."""
    return f"{head} (written at state revision {revision})"
