"""The per-shard gauges (targets and load of every shard), exposed at the cost of a change.

With 12 nodes a child the shard count follows the fleet (8,338 shards at 300,000 targets
of the shipped spec), and client_python formats each sample of each scrape anew: two
gauges a shard made ``/metrics`` cost about 0.4 s of CPU at 100,000 targets and 1.2 s at
300,000. :class:`ShardGauges` keeps each shard's two lines as text, rewritten when a
change touches the shard, and ``/metrics`` (:func:`exposition`) joins them into what
``generate_latest`` writes for the rest of the registry: the same bytes as two
``Gauge(["region", "shard"])`` would give, in the same order (a shard keeps its place;
a new one comes last; ``publish`` replaces them all).

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


def _label(value: str) -> str:
    """A label value as the text format escapes it (backslash, newline, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class ShardGauges(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], tuple[int, int]] = {}
        self._lines: dict[tuple[str, str], tuple[str, str]] = {}
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
            self._text = None

    def publish(self, rows: Iterable[Row]) -> None:
        """Every shard of the assignment now served: the rows replace all the others."""
        with self._lock:
            self._rows.clear()
            self._lines.clear()
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
                lines = list(self._lines.values())
                self._text = ("".join(t for t, _ in lines).encode(), "".join(w for _, w in lines).encode())
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
        for (name, _help), lines in ((TARGETS, targets), (LOAD, load)):
            header = f"# TYPE {name} gauge\n".encode()
            at = text.find(header)
            if at < 0:  # not registered in ``registry``: nothing of ours to put in
                continue
            at += len(header)
            text = text[:at] + lines + text[at:]
        return text
