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
* **a missing piece**: reported by the store's own read, with ``--init`` named.

Orphaned pieces (a writer that died between its pieces and its head) are collected by
the Kubernetes store (``kube_store``); the Consul store collects its chunks on every save.
"""

from __future__ import annotations

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
