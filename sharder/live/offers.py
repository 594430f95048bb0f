"""What the loop answers a push source that must be answered: a change offered, taken or refused.

The built-in registry (``sharder.sources.registry``) cannot accept an entry on its own: an
endpoint another source serves (409) and a sized region at its shard cap (429) are facts of
the loop's merged view. :meth:`sharder.live.reconcile.Reconciler.offer` checks both and
applies the change under the loop's one lock, so no change slips between the check and the
apply. It answers ``None`` (applied) or a :class:`Refusal` (nothing applied), a value the
registry turns into its own error; the loop raises nothing and calls nothing back.

The region cap counts the nodes placed *and* those offered since: placed nodes lag the
sources by a debounce, so a cap read from them alone let back-to-back single registrations
overshoot it. :class:`PendingNodes` keeps the offered ones until a step places them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from sharder.model.inventory import Target


@dataclass(frozen=True)
class Refusal:
    """Why the loop turned an offered change away; nothing of the change was applied."""

    reason: str


@dataclass(frozen=True)
class EndpointOwned(Refusal):
    """``target``'s endpoint is served by ``identity`` in another source ``source`` (409)."""

    target: Target
    source: str
    identity: str


@dataclass(frozen=True)
class RegionCapped(Refusal):
    """New nodes would grow a sized ``region`` past its shard cap (429)."""

    region: str


class PendingNodes:
    """Nodes offered to each region and not placed yet, each stamped with the loop's
    generation when it was offered; a step that placed everything up to a generation
    forgets those (:meth:`placed`). Not thread-safe: the loop calls it under its lock."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, int]] = {}
        """region -> node -> generation it was offered at."""

    def known(self, region: str, placed: Collection[str]) -> Collection[str]:
        """The nodes of ``region`` placed or offered (what the region cap counts)."""
        pending = self._nodes.get(region)
        return placed if not pending else _Union(placed, pending)

    def note(self, region: str, nodes: Collection[str], *, placed: Collection[str], generation: int) -> None:
        """``nodes`` were offered to ``region`` (those placed already are not kept)."""
        fresh = [n for n in nodes if n not in placed]
        if fresh:
            pending = self._nodes.setdefault(region, {})
            for node in fresh:
                pending[node] = generation

    def placed(self, upto: int) -> None:
        """A step placed every change up to generation ``upto``: its nodes are counted as
        placed now (or they left before it, and are no longer in any source)."""
        for region in list(self._nodes):
            kept = {n: g for n, g in self._nodes[region].items() if g > upto}
            if kept:
                self._nodes[region] = kept
            else:
                del self._nodes[region]


class _Union(Collection[str]):
    """``placed`` and ``pending`` as one collection without copying either (``pending``
    holds only nodes that were not placed when offered; one placed since counts twice until
    the next step forgets it, so the cap errs on the side of refusing)."""

    def __init__(self, placed: Collection[str], pending: Mapping[str, int]) -> None:
        self._placed, self._pending = placed, pending

    def __contains__(self, node: object) -> bool:
        return node in self._pending or node in self._placed

    def __len__(self) -> int:
        return len(self._placed) + len(self._pending)

    def __iter__(self) -> Iterator[str]:
        yield from self._placed
        yield from (n for n in self._pending if n not in self._placed)
