"""The per-shard gauges (targets and load of every shard), exposed at the cost of a change.

With 12 nodes a child the shard count follows the fleet (8,338 shards at 300,000 targets
of the shipped spec), and client_python formats each sample of each scrape anew: two
gauges a shard made ``/metrics`` cost about 0.4 s of CPU at 100,000 targets and 1.2 s at
300,000. :class:`ShardGauges` keeps each shard's two lines as text, rewritten when a
change touches the shard, and ``/metrics`` (:func:`exposition`) joins them into what
``generate_latest`` writes for the rest of the registry: the same bytes as two
``Gauge(["region", "shard"])`` would give, in the same order (a shard keeps its place;
a new one comes last; ``publish`` replaces them all).

The lines are kept in blocks of ``BLOCK`` shards, each block's text joined once and again
only when a change touched one of its shards: a scrape after one registration joins one
block's lines and copies the other blocks' bytes (about 1 ms at a million targets, 27,782
shards, where joining every shard's lines took 9 ms).

It is still an ordinary collector: ``registry.get_sample_value`` and any other exposition
read its samples through :meth:`ShardGauges.collect`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

TARGETS = ("gpufed_controller_targets", "Targets assigned to each shard.")
LOAD = ("gpufed_controller_shard_load", "Weight (GPUs) assigned to each shard.")
Row = tuple[str, str, int, int]
"""(region, shard, targets, load)."""
Key = tuple[str, str]
BLOCK = 256
"""Shards whose lines are joined together (a block is joined again when one of them changes)."""


def _label(value: str) -> str:
    """A label value as the text format escapes it (backslash, newline, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class ShardGauges(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[Key, tuple[int, int]] = {}
        self._lines: dict[Key, tuple[str, str]] = {}
        self._block_of: dict[Key, int] = {}
        self._blocks: list[list[Key]] = []
        """The shards in order (first set first), ``BLOCK`` a block."""
        self._joined: list[tuple[bytes, bytes] | None] = []
        """Each block's lines of both families joined (None: rejoined at the next scrape)."""
        self._text: tuple[bytes, bytes] | None = None
        """Both families' sample lines joined (None: rejoined at the next scrape)."""
        self._headers_only = threading.local()

    def update(self, rows: Iterable[Row]) -> None:
        """Set the shards in ``rows``; the others keep theirs (and their places)."""
        with self._lock:
            for region, shard, targets, load in rows:
                key = (region, shard)
                self._rows[key] = (targets, load)
                self._lines[key] = self._render(region, shard, targets, load)
                block = self._block_of.get(key)
                if block is None:  # a new shard comes last
                    if not self._blocks or len(self._blocks[-1]) >= BLOCK:
                        self._blocks.append([])
                        self._joined.append(None)
                    block = self._block_of[key] = len(self._blocks) - 1
                    self._blocks[block].append(key)
                self._joined[block] = None
            self._text = None

    def publish(self, rows: Iterable[Row]) -> None:
        """Every shard of the assignment now served: the rows replace all the others."""
        with self._lock:
            self._rows.clear()
            self._lines.clear()
            self._block_of.clear()
            self._blocks.clear()
            self._joined.clear()
        self.update(rows)

    @staticmethod
    def _render(region: str, shard: str, targets: int, load: int) -> tuple[str, str]:
        labels = f'{{region="{_label(region)}",shard="{_label(shard)}"}}'
        return (f"{TARGETS[0]}{labels} {floatToGoString(targets)}\n",
                f"{LOAD[0]}{labels} {floatToGoString(load)}\n")  # fmt: skip

    def collect(self) -> Iterator[GaugeMetricFamily]:
        targets = GaugeMetricFamily(*TARGETS, labels=["region", "shard"])
        load = GaugeMetricFamily(*LOAD, labels=["region", "shard"])
        if not getattr(self._headers_only, "on", False):
            with self._lock:
                rows = list(self._rows.items())
            for (region, shard), (size, weight) in rows:
                targets.add_metric([region, shard], size)
                load.add_metric([region, shard], weight)
        yield targets
        yield load

    def sample_text(self) -> tuple[bytes, bytes]:
        """Each family's sample lines, as the text format writes them."""
        with self._lock:
            if self._text is None:
                for k, joined in enumerate(self._joined):
                    if joined is None:
                        lines = [self._lines[key] for key in self._blocks[k]]
                        self._joined[k] = ("".join(t for t, _ in lines).encode(),
                                           "".join(w for _, w in lines).encode())  # fmt: skip
                blocks = [joined for joined in self._joined if joined is not None]
                self._text = (b"".join(t for t, _ in blocks), b"".join(w for _, w in blocks))
            return self._text

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """``generate_latest(registry)``, byte for byte, with this collector's samples cut
        from the kept lines instead of formatted one by one."""
        self._headers_only.on = True
        try:
            text = generate_latest(registry)
        finally:
            self._headers_only.on = False
        targets, load = self.sample_text()
        cuts: list[tuple[int, bytes]] = []
        for (name, _help), lines in ((TARGETS, targets), (LOAD, load)):
            header = f"# TYPE {name} gauge\n".encode()
            at = text.find(header)
            if at >= 0:  # else not registered in ``registry``: nothing of ours to put in
                cuts.append((at + len(header), lines))
        view, last = memoryview(text), 0
        pieces: list[bytes | memoryview] = []
        for at, lines in sorted(cuts, key=lambda cut: cut[0]):
            pieces += (view[last:at], lines)
            last = at
        pieces.append(view[last:])
        return b"".join(pieces)  # one copy of the whole, not one per family
