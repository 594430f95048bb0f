"""A seeded GPU simulator behind the `GpuBackend` seam, for demos, benchmarks and tests.

Every value is a pure function of (seed, node, gpu, time): utilisation follows a slow
sine plus 5-second noise, memory, temperature, power and clocks follow utilisation,
counters (energy, ECC, PCIe) are closed-form integrals so they only ever go up, and
XIDs fire in rare seeded 15-minute windows. The clock is injected, so a snapshot at a
fixed time is byte-for-byte reproducible across processes (no salted `hash()`).

The early XID: the windows are on the wall clock, so a short demo could show none (11% of
60-second runs in issue 36). The simulated fleet therefore also raises exactly one XID soon
after it starts: `first_xid(seed, nodes, gpus)` picks, from the seed alone, one node, one
GPU, one code of `XID_CODES` and a time `FIRST_XID_AFTER_S` (5-20 s) after that node's
backend was built, which is just before the fleet's first collection and so before it is
ready. With the default 5 s collection interval the XID is exposed within 25 s of ready,
and a newcomer's demo sends its DingTalk message within a minute. The same seed and node
list give the same XID in every process; `gpufed-exporter fleet` turns it off with
`GPUFED_EXPORTER_FIRST_XID=false`.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from exporter.models import GpuDevice, NvLinkReading, ProcessUsage, Reading, XidEvent

XID_WINDOW_S = 900.0
# Application-level XIDs dominate real fleets; hardware ones are rare.
XID_CODES = (13, 13, 13, 31, 31, 43, 43, 45, 48, 63, 74, 79, 94)
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
#: When the fleet's one early XID happens, in seconds after its backends are built: not at
#: once (the first scrapes see a clean GPU, then the XID), and late enough in the window
#: only that one 5 s collection after it still falls inside the 30 s the demo promises.
FIRST_XID_AFTER_S = (5.0, 20.0)


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What a simulated GPU looks like: memory, power envelope, clocks, GPM support."""

    memory_mib: int
    idle_w: float
    max_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    gpm: bool
    nvlinks: int = 0


MODELS: dict[str, GpuModel] = {
    "NVIDIA H100 80GB HBM3": GpuModel(81559, 70.0, 700.0, 1980, 2619, True, 18),
    "NVIDIA H200": GpuModel(143771, 75.0, 700.0, 1980, 3201, True, 18),
    "NVIDIA A100-SXM4-80GB": GpuModel(81920, 55.0, 400.0, 1410, 1593, False, 12),
    "NVIDIA L40S": GpuModel(46068, 35.0, 350.0, 2520, 9001, False),
}


def _rng(*parts: object) -> random.Random:
    """A generator seeded from a string: sha512-based, so stable across processes."""
    return random.Random(":".join(str(p) for p in parts))


@dataclass(frozen=True, slots=True)
class ScheduledXid:
    """One XID at a fixed time after a node's backend was built."""

    node: str
    gpu: int
    code: int
    after_s: float


def first_xid(seed: int, nodes: Sequence[str], gpus: int) -> ScheduledXid | None:
    """The fleet's one early XID, drawn from the seed alone (None without nodes or GPUs).

    The node is drawn from the sorted names, so the order a caller lists them in does not
    matter; the time is in `FIRST_XID_AFTER_S`.
    """
    if not nodes or gpus < 1:
        return None
    rng = _rng(seed, "first-xid")
    node = sorted(nodes)[rng.randrange(len(nodes))]
    gpu, code = rng.randrange(gpus), rng.choice(XID_CODES)
    return ScheduledXid(node, gpu, code, round(rng.uniform(*FIRST_XID_AFTER_S), 3))


class SimulatedBackend:
    """N simulated GPUs of one model on one node."""

    def __init__(
        self,
        gpus: int = 8,
        model: str = "NVIDIA H100 80GB HBM3",
        *,
        seed: int = 0,
        node: str = "",
        xid_probability: float = 0.02,
        clock: Callable[[], float] = time.time,
        scheduled_xid: ScheduledXid | None = None,
    ) -> None:
        self._spec = MODELS.get(model, MODELS["NVIDIA H100 80GB HBM3"])
        self._seed, self._node, self._clock = seed, node, clock
        self._xid_p = xid_probability
        self._boot = clock()
        # Another node's schedule is not ours; a GPU this node lacks gets none.
        self._scheduled = (
            XidEvent(scheduled_xid.gpu, scheduled_xid.code, self._boot + scheduled_xid.after_s)
            if scheduled_xid is not None and scheduled_xid.node == node and scheduled_xid.gpu < gpus
            else None
        )
        self._xid_cursor = self._boot
        self._lock = threading.Lock()
        self._devices = tuple(self._device(i, model) for i in range(gpus))
        self._params = [self._gpu_params(i) for i in range(gpus)]
        self._link_seeds: dict[int, tuple[int, tuple[float, ...]]] = {}

    def _device(self, index: int, model: str) -> GpuDevice:
        digest = hashlib.sha1(f"{self._seed}:{self._node}:{index}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        bus = HGX_BUSES[index] if index < len(HGX_BUSES) else 0x10 + index
        return GpuDevice(index, uuid, model, f"00000000:{bus:02X}:00.0", float(self._spec.memory_mib))

    def _gpu_params(self, index: int) -> dict[str, float]:
        rng = _rng(self._seed, self._node, index)
        return {
            "base": rng.uniform(25.0, 75.0),
            "omega": 2 * math.pi / rng.uniform(300.0, 1200.0),
            "phase": rng.uniform(0.0, 2 * math.pi),
            "sbe_rate": rng.choice((0.0, 0.0, 0.0, 1 / 1800)),
            "replay_rate": rng.choice((0.0, 0.0, 1 / 600)),
            "agg_sbe": float(rng.randrange(0, 4)),
        }

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def driver_version(self) -> str:
        return "550.54.15"

    def read(self, families: Iterable[str]) -> dict[int, Reading]:
        now, wanted = self._clock(), set(families)
        return {dev.index: self._reading(dev, now, wanted) for dev in self._devices}

    def _reading(self, dev: GpuDevice, now: float, wanted: set[str]) -> Reading:
        p, spec = self._params[dev.index], self._spec
        noise = _rng(self._seed, self._node, dev.index, int(now // 5)).random()
        wave = math.sin(p["omega"] * now + p["phase"])
        util = min(100.0, max(0.0, round(p["base"] + 25.0 * wave + 10.0 * (noise - 0.5))))
        up = max(0.0, now - self._boot)
        used = round(spec.memory_mib * min(0.95, 0.15 + util / 120.0))
        k = (spec.max_w - spec.idle_w) * 0.9 / 100.0
        values: dict[str, float] = {}
        if "core" in wanted or "hami" in wanted or "health" in wanted:
            # Closed-form integral of the power curve, so energy never goes backwards.
            energy_j = (spec.idle_w + k * p["base"]) * up - k * 25.0 / p["omega"] * (
                math.cos(p["omega"] * now + p["phase"]) - math.cos(p["omega"] * self._boot + p["phase"])
            )
            values.update(
                {
                    "DCGM_FI_DEV_SM_CLOCK": float(spec.sm_clock_mhz if util > 5 else 345),
                    "DCGM_FI_DEV_MEM_CLOCK": float(spec.mem_clock_mhz),
                    "DCGM_FI_DEV_MEMORY_TEMP": float(round(34 + util * 0.45 + noise * 2)),
                    "DCGM_FI_DEV_GPU_TEMP": float(round(30 + util * 0.4 + noise * 2)),
                    "DCGM_FI_DEV_POWER_USAGE": round(spec.idle_w + k * util + noise * 5.0, 3),
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": float(int(max(0.0, energy_j) * 1000)),
                    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": float(int(up * p["replay_rate"])),
                    "DCGM_FI_DEV_GPU_UTIL": util,
                    "DCGM_FI_DEV_MEM_COPY_UTIL": float(round(util * 0.6)),
                    "DCGM_FI_DEV_ENC_UTIL": 0.0,
                    "DCGM_FI_DEV_DEC_UTIL": float(round(noise * 3)),
                    "DCGM_FI_DEV_FB_FREE": float(spec.memory_mib - used),
                    "DCGM_FI_DEV_FB_USED": float(used),
                    "DCGM_FI_DEV_FB_RESERVED": 0.0,
                    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0.0,  # bare metal: licensing not supported
                }
            )
        if "ecc" in wanted:
            sbe = float(int(up * p["sbe_rate"]))
            values.update(
                {
                    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": sbe,
                    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
                    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": sbe + p["agg_sbe"],
                    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0.0,
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": p["agg_sbe"],
                    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
                    "DCGM_FI_DEV_ROW_REMAP_PENDING": 0.0,
                    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
                }
            )
        if "pcie" in wanted or ("gpm" in wanted and spec.gpm):
            # GPM fills them on a GPM GPU (whole bytes per second, as DCGM stores them);
            # elsewhere only the opt-in pcie family's blocking NVML call does
            values["DCGM_FI_PROF_PCIE_TX_BYTES"] = float(int(2_000_000 * 1024 * util / 100))
            values["DCGM_FI_PROF_PCIE_RX_BYTES"] = float(int(3_000_000 * 1024 * util / 100))
        if "gpm" in wanted and spec.gpm:
            values.update(
                {
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100, 4),
                    "DCGM_FI_PROF_SM_ACTIVE": round(util * 0.85 / 100, 4),
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(util * 0.55 / 100, 4),
                    "DCGM_FI_PROF_DRAM_ACTIVE": round(util * 0.6 / 100, 4),
                }
            )
        processes: tuple[ProcessUsage, ...] = ()
        if "process" in wanted and util > 10:
            pid = 10_000 + 100 * dev.index
            processes = (ProcessUsage(pid, float(used - 512)), ProcessUsage(pid + 1, 512.0))
        if "nvlink_gpu" in wanted and self._spec.nvlinks:
            values.update(self._link_totals(dev.index, up, p))
        links = self._links(dev, up, p) if "nvlink" in wanted else ()
        return Reading(dev.index, values, processes, links=links)

    def _link_params(self, index: int) -> tuple[int, tuple[float, ...]]:
        """(the node's one seeded down link, each link's error rate) of GPU ``index``: seeded
        once, since the default `nvlink_gpu` family reads them every collection."""
        found = self._link_seeds.get(index)
        if found is None:
            down = _rng(self._seed, self._node, "nvlink-down").randrange(0, 64)
            errs = tuple(_rng(self._seed, self._node, index, "nvlink", link).choice((0.0, 0.0, 0.0, 1 / 3600))
                         for link in range(self._spec.nvlinks))
            found = self._link_seeds[index] = (down, errs)
        return found

    def _links(self, dev: GpuDevice, up: float, p: dict[str, float]) -> tuple[NvLinkReading, ...]:
        """Counters linear in uptime (so they only go up); one seeded link per node may be down."""
        down, rates = self._link_params(dev.index)
        out = []
        for link in range(self._spec.nvlinks):
            rate = 1e9 * p["base"] / 100 * (1.0 + 0.01 * link)  # ~0.25-0.75 GB/s per link
            is_up = down != dev.index * self._spec.nvlinks + link
            errs = rates[link]
            out.append(NvLinkReading(
                link, is_up, tx_bytes=float(int(up * rate)), rx_bytes=float(int(up * rate * 0.9)),
                crc_flit_errors=float(int(up * errs)), crc_data_errors=0.0,
                replay_errors=float(int(up * errs / 2)), recovery_errors=0.0,
            ))
        return tuple(out)

    def _link_totals(self, index: int, up: float, p: dict[str, float]) -> dict[str, float]:
        """Per-GPU NVLink totals (family `nvlink_gpu`) in closed form, without building every
        link: the sums of `_links`' linear counters (to within a byte per link), and bytes per
        second as their mean rate since boot."""
        _, errs = self._link_params(index)
        n = self._spec.nvlinks
        tx_rate = 1e9 * p["base"] / 100 * (n + 0.01 * n * (n - 1) / 2)
        erring = sum(1 for rate in errs if rate)
        flits = erring * float(int(up / 3600))
        return {
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": float(int(up * tx_rate * 1.9 / 1024)),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": tx_rate if up > 0 else 0.0,
            "DCGM_FI_PROF_NVLINK_RX_BYTES": tx_rate * 0.9 if up > 0 else 0.0,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": flits,
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0.0,
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": erring * float(int(up / 7200)),
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0.0,
        }

    def drain_xid_events(self) -> list[XidEvent]:
        """XIDs whose seeded time (or the scheduled XID's) falls between the previous drain and now."""
        with self._lock:
            start, end = self._xid_cursor, self._clock()
            self._xid_cursor = max(start, end)
        events = []
        if self._scheduled is not None and start < self._scheduled.timestamp <= end:
            events.append(self._scheduled)
        for dev in self._devices:
            for window in range(int(start // XID_WINDOW_S), int(end // XID_WINDOW_S) + 1):
                rng = _rng(self._seed, self._node, dev.index, "xid", window)
                if rng.random() >= self._xid_p:
                    continue
                code, at = rng.choice(XID_CODES), (window + rng.random()) * XID_WINDOW_S
                if start < at <= end:
                    events.append(XidEvent(dev.index, code, at))
        return sorted(events, key=lambda e: (e.timestamp, e.gpu))

    def close(self) -> None:
        """Nothing to release."""
