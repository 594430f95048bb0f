"""NVLink reads for the NVML backend: per-GPU totals (family `nvlink_gpu`) and per-link
counters (family `nvlink`).

Split out of `exporter.nvml_backend` (one concept per module); the backend owns one
`NvLinkReader` and hands it the NVML module it was given, so tests keep using the fake
NVML. An NVML error here leaves that value or that link's series out and is logged once
per GPU, call and error; only a lost GPU fails the GPU's whole reading.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from exporter.models import NvLinkReading

log = logging.getLogger(__name__)
# nvmlValue_t union member per nvmlValueType_t
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
# Per-link NVLink fields, read for every link in ONE nvmlDeviceGetFieldValues call with
# (field id, scopeId = link): NvLinkReading attribute -> (pynvml constant, factor).
# Throughput fields are cumulative KiB of data (no protocol overhead); the DL error fields
# are per-link counters (nvml.h: NVML_FI_DEV_NVLINK_ERROR_DL_*).
NVLINK_FIELDS: dict[str, tuple[str, float]] = {
    "tx_bytes": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 1024.0),
    "rx_bytes": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 1024.0),
    "replay_errors": ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", 1.0),
    "recovery_errors": ("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", 1.0),
}
# Per-GPU NVLink totals (family `nvlink_gpu`), one field-values call per GPU. The data
# throughput fields with scopeId UINT_MAX mean "all links", as DCGM 4.6.0 reads its field
# 449 (DcgmCacheManager::ReadAndCacheNvLinkBandwidth); cumulative KiB.
ALL_LINKS = 0xFFFFFFFF
NVLINK_GPU_FIELDS: dict[str, tuple[str, int]] = {
    "tx_kib": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", ALL_LINKS),
    "rx_kib": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", ALL_LINKS),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 0),
}
KIB = 1024.0
# CRC errors by type have no per-link field beyond link 11; the error-counter call has.
NVLINK_CRC = {
    "crc_flit_errors": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data_errors": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}


class NvLinkReader:
    """NVLink state and counters of every GPU; caches link counts and the previous totals."""

    def __init__(self, nvml: Any, *, clock: Callable[[], float] = time.time,
                 unsupported: Callable[[Exception], bool]) -> None:
        self._nvml = nvml
        self._clock = clock
        self._unsupported = unsupported
        self._links: dict[int, int] = {}  # GPU index -> NVLink count, probed once
        self._warned: set[tuple[int, str, Any]] = set()
        self._prev: dict[int, tuple[float, float, float]] = {}  # GPU -> (time, tx KiB, rx KiB)

    def gpu_totals(self, index: int, handle: Any) -> dict[str, float]:
        """Per-GPU NVLink totals: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (TX + RX KiB, a counter,
        as DCGM 4.6.0 sums them), DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES (bytes per second since
        the previous collection) and the four error totals. A GPU without NVLink answers
        "not supported" per field, which leaves those series out."""
        nvml = self._nvml
        ids = [(getattr(nvml, name), scope) for name, scope in NVLINK_GPU_FIELDS.values()]
        answers = self._call(index, "gpu fields", nvml.nvmlDeviceGetFieldValues, handle, ids)
        if answers is None:
            return {}
        got: dict[str, float] = {}
        for key, fv in zip(NVLINK_GPU_FIELDS, answers, strict=True):
            if fv.nvmlReturn == nvml.NVML_SUCCESS:
                got[key] = float(getattr(fv.value, VALUE_MEMBERS[fv.valueType]))
        tx, rx = got.pop("tx_kib", None), got.pop("rx_kib", None)
        if tx is not None and rx is not None:
            got["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = tx + rx
            now = self._clock()
            prev = self._prev.get(index)
            self._prev[index] = (now, tx, rx)
            if prev is not None and now > prev[0]:
                span = now - prev[0]
                got["DCGM_FI_PROF_NVLINK_TX_BYTES"] = max(0.0, tx - prev[1]) * KIB / span
                got["DCGM_FI_PROF_NVLINK_RX_BYTES"] = max(0.0, rx - prev[2]) * KIB / span
        return got

    def _link_count(self, handle: Any) -> int:
        """Links that answer nvmlDeviceGetNvLinkState; a GPU without NVLink has none.

        NVML_NVLINK_MAX_LINKS (36 in nvidia-ml-py 13) bounds every architecture; past a GPU's
        own links the driver answers InvalidArgument (or NotSupported), which ends the walk.
        An H100 SXM alone in a pass-through VM answered NotSupported from link 0 on
        (docs/measured-h100.md, 2026-11-26), so it has no link series at all.
        """
        nvml = self._nvml
        count = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                if self._unsupported(exc) or getattr(exc, "value", None) == nvml.NVML_ERROR_INVALID_ARGUMENT:
                    break
                raise
            count = link + 1
        return count

    def links(self, index: int, handle: Any) -> tuple[NvLinkReading, ...]:
        """State per link, then every link's counters in one field-values call.

        `nvlink` is an opt-in diagnostic family: an NVML error in it leaves that link's
        series (or one value) out and is logged, instead of failing the GPU's whole reading
        (health 0, temperature and utilisation gone). A lost GPU still fails the reading.
        """
        nvml = self._nvml
        try:
            links = self._links.get(index)
            if links is None:
                links = self._links[index] = self._link_count(handle)
            if not links:
                return ()
            states = {link: self._call(index, "state", nvml.nvmlDeviceGetNvLinkState, handle, link)
                      for link in range(links)}
            ids = [(getattr(nvml, name), link) for link in range(links) for name, _ in NVLINK_FIELDS.values()]
            answers = self._call(index, "fields", nvml.nvmlDeviceGetFieldValues, handle, ids)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            self._failed(index, "link probe", exc)
            return ()
        out = []
        for link in range(links):
            if states[link] is None:
                continue
            values: dict[str, float | None] = {}
            for slot, (attr, (_, scale)) in enumerate(NVLINK_FIELDS.items()):
                values[attr] = None
                fv: Any = None if answers is None else answers[link * len(NVLINK_FIELDS) + slot]
                if fv is not None and fv.nvmlReturn == nvml.NVML_SUCCESS:
                    values[attr] = float(getattr(fv.value, VALUE_MEMBERS[fv.valueType])) * scale
            for attr, counter in NVLINK_CRC.items():
                got = self._call(index, attr, nvml.nvmlDeviceGetNvLinkErrorCounter,
                                        handle, link, getattr(nvml, counter))
                values[attr] = None if got is None else float(got)
            out.append(NvLinkReading(link, states[link] == nvml.NVML_FEATURE_ENABLED, **values))
        return tuple(out)

    def _call(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """One NVLink call's answer, or None on any NVML error but a lost GPU."""
        nvml = self._nvml
        try:
            return call(*args)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            if not self._unsupported(exc):
                self._failed(index, what, exc)
            return None

    def _failed(self, index: int, what: str, exc: Exception) -> None:
        """Warn once per GPU, call and error: a link that keeps failing must not flood the log."""
        key = (index, what, getattr(exc, "value", None))
        if key not in self._warned:
            self._warned.add(key)
            log.warning("nvlink read failed gpu=%d call=%s error=%r (series left out)", index, what, str(exc))

