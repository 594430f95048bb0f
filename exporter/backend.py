"""The one seam between the exporter and a source of GPU readings.

`NvmlBackend` (real GPUs through nvidia-ml-py) and `SimulatedBackend` (seeded, for demos,
benchmarks and tests) implement it; the collection loop only ever sees this Protocol.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from exporter.models import GpuDevice, Reading, XidEvent


@runtime_checkable
class GpuBackend(Protocol):
    """Reads GPUs. `read` runs on the collection thread, never on the scrape path."""

    def devices(self) -> tuple[GpuDevice, ...]:
        """GPUs found at start; their identity labels never change while running."""
        ...

    def driver_version(self) -> str:
        """Driver version string, registered as Consul Meta `driver`."""
        ...

    def read(self, families: Iterable[str]) -> dict[int, Reading]:
        """One reading per GPU for the chosen families; unsupported values left out."""
        ...

    def drain_xid_events(self) -> list[XidEvent]:
        """XIDs seen since the last call, oldest first."""
        ...

    def close(self) -> None:
        """Release the library and stop helper threads."""
        ...
