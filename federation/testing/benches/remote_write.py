"""Prometheus remote-write 1.0 requests for benches that feed a real Prometheus live samples.

Why: a TSDB built ahead with ``promtool tsdb create-blocks-from`` can hold samples "in the
future", but the head then refuses every sample older than the newest block, so the rules'
own records are dropped until the clock passes the last sample. Pushed through the
remote-write receiver (``--web.enable-remote-write-receiver``, as the children feed the
master) the samples land in the head at the time they carry, and so do the records.

Format (prometheus/prompb ``remote.proto``/``types.proto``, remote-write spec 1.0):
``WriteRequest.timeseries = 1``; ``TimeSeries.labels = 1``, ``samples = 2``; ``Label.name = 1``,
``value = 2``; ``Sample.value = 1`` (double), ``timestamp = 2`` (int64, ms). Labels sorted by
name. The body is snappy's block format; literals only (valid snappy, no compression: the
receiver is on loopback, and a pure-Python compressor would cost more than it saves).

Every series of one request carries the same sample, so a request is the series' encoded
labels (built once) joined with one encoded sample.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
#: Largest literal one snappy element carries with a 2-byte length.
_LITERAL_MAX = 1 << 16


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_labels(labels: Mapping[str, str]) -> bytes:
    """``TimeSeries.labels`` of one series, sorted by name."""
    pairs = sorted(labels.items())
    return b"".join(_field(1, _field(1, name.encode()) + _field(2, value.encode())) for name, value in pairs)


def encode_sample(value: float, timestamp_ms: int) -> bytes:
    """``TimeSeries.samples`` holding one sample (field 1 fixed64 double, field 2 varint)."""
    return _field(2, b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(timestamp_ms))


def write_request(series: Iterable[bytes], *, value: float, timestamp_ms: int) -> bytes:
    """A ``WriteRequest`` (uncompressed): each of ``series`` (from ``encode_labels``) with one sample."""
    sample = encode_sample(value, timestamp_ms)
    return b"".join(_field(1, labels + sample) for labels in series)


def snappy_literal(data: bytes) -> bytes:
    """``data`` in snappy's block format as literal elements only."""
    out = [_varint(len(data))]
    for start in range(0, len(data), _LITERAL_MAX):
        chunk = data[start : start + _LITERAL_MAX]
        size = len(chunk) - 1
        out.append(bytes([size << 2]) if size < 60 else bytes([61 << 2]) + size.to_bytes(2, "little"))
        out.append(chunk)
    return b"".join(out)


def batches(series: Sequence[bytes], size: int) -> list[Sequence[bytes]]:
    """``series`` cut into requests of at most ``size`` series."""
    return [series[start : start + size] for start in range(0, len(series), size)]
