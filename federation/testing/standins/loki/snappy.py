"""Snappy's block format, enough to read and write what Promtail sends Loki.

Format: google/snappy format_description.txt: a varint of the decoded length, then
elements tagged by their low two bits: literal (00), copy with 1-byte offset (01), 2-byte
offset (10), 4-byte offset (11). Checked against golang/snappy's decode vectors
(snappy_test.go@03ee571c, ``TestDecode``, ``TestWriterGoldenOutput``) in the tests. The
compressor emits literals and 2-byte-offset copies found by a small hash of 4-byte
windows: valid snappy, not tuned.
"""

from __future__ import annotations


class SnappyError(ValueError):
    """Corrupt input, as snappy's ErrCorrupt."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise SnappyError("bad length varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def decompress(data: bytes) -> bytes:
    length, pos = _varint(data, 0)
    out = bytearray()
    while pos < len(data):
        tag = data[pos]
        kind = tag & 3
        if kind == 0:
            size = tag >> 2
            pos += 1
            if size >= 60:
                extra = size - 59
                if pos + extra > len(data):
                    raise SnappyError("literal length runs past the input")
                size = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            size += 1
            if pos + size > len(data):
                raise SnappyError("literal runs past the input")
            out += data[pos : pos + size]
            pos += size
            continue
        if kind == 1:
            if pos + 2 > len(data):
                raise SnappyError("copy runs past the input")
            size, offset = 4 + ((tag >> 2) & 7), ((tag >> 5) << 8) | data[pos + 1]
            pos += 2
        else:
            width = 2 if kind == 2 else 4
            if pos + 1 + width > len(data):
                raise SnappyError("copy runs past the input")
            size, offset = 1 + (tag >> 2), int.from_bytes(data[pos + 1 : pos + 1 + width], "little")
            pos += 1 + width
        if offset == 0 or offset > len(out):
            raise SnappyError("copy offset out of range")
        for _ in range(size):  # byte by byte: a copy may overlap what it writes
            out.append(out[-offset])
    if len(out) != length:
        raise SnappyError(f"decoded {len(out)} bytes, header says {length}")
    return bytes(out)


def _literal(chunk: bytes) -> bytes:
    n = len(chunk) - 1
    if n < 60:
        return bytes([n << 2]) + chunk
    size = n.to_bytes((n.bit_length() + 7) // 8, "little")
    return bytes([(59 + len(size)) << 2]) + size + chunk


def compress(data: bytes) -> bytes:
    length, header = len(data), bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        header.append(byte | (0x80 if length else 0))
        if not length:
            break
    table: dict[bytes, int] = {}
    out, pos, start = bytearray(header), 0, 0
    while pos + 4 <= len(data):
        window = data[pos : pos + 4]
        match = table.get(window)
        table[window] = pos
        if match is None or pos - match > 0xFFFF:
            pos += 1
            continue
        size = 4
        while pos + size < len(data) and size < 64 and data[match + size] == data[pos + size]:
            size += 1
        if start < pos:
            out += _literal(data[start:pos])
        out += bytes([((size - 1) << 2) | 2]) + (pos - match).to_bytes(2, "little")
        pos += size
        start = pos
    if start < len(data):
        out += _literal(data[start:])
    return bytes(out)
