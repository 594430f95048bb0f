"""Documents too big for one KV value: compressed, split into chunks, named by a small head.

Pure (no I/O): :mod:`federation.controller.stores.consul_store` writes what :func:`encode` gives
and reads back through :func:`decode`. Consul refuses values over 512 KiB; a controller
state for 10,000 targets is a few MiB of JSON but compresses about tenfold, so most
states are one chunk and a large one a handful.

A blob of generation ``g`` lives under ``<chunks>/<g:012d>-<digest[:16]>/<i:04d>``: the
generation orders sets for garbage collection (see :func:`collectable`), the digest keeps
two writers of the same generation (a lost check-and-set) from sharing keys. The head
records the SHA-256 of the compressed bytes, the chunk count and the raw size, so a
reader that met a chunk set being deleted under it (or any torn read) detects it and
reads the head again instead of decoding garbage.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

CHUNK_BYTES = 480 * 1024
"""Under Consul's 512 KiB value limit with room to spare."""
MAX_RAW_BYTES = 512 * 1024 * 1024
"""A head claiming more than this is refused before decompressing (a corrupt or hostile head)."""


class BlobError(Exception):
    """The chunks do not match their head (missing, torn or corrupt)."""


@dataclass(frozen=True)
class Blob:
    digest: str
    raw_size: int
    parts: tuple[bytes, ...]

    @property
    def compressed_size(self) -> int:
        return sum(len(p) for p in self.parts)

    def describe(self, *, generation: int) -> dict[str, object]:
        """The head fields that let a reader find and check the chunks."""
        return {
            "generation": generation,
            "digest": self.digest,
            "chunks": len(self.parts),
            "size": self.raw_size,
            "compressed": self.compressed_size,
            "encoding": "zlib",
        }


def encode(payload: bytes, *, chunk_bytes: int = CHUNK_BYTES) -> Blob:
    """``payload`` zlib-compressed, named by the SHA-256 of the compressed bytes, and cut in
    parts of at most ``chunk_bytes`` (Consul values, ConfigMap pieces)."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    packed = zlib.compress(payload, 6)
    parts = tuple(packed[i : i + chunk_bytes] for i in range(0, len(packed), chunk_bytes)) or (b"",)
    return Blob(digest=hashlib.sha256(packed).hexdigest(), raw_size=len(payload), parts=parts)


def set_name(generation: int, digest: str) -> str:
    """The folder (under the chunks prefix) of one generation's chunks."""
    return f"{generation:012d}-{digest[:16]}"


def chunk_keys(prefix: str, *, generation: int, digest: str, count: int) -> list[str]:
    folder = f"{prefix}/{set_name(generation, digest)}"
    return [f"{folder}/{i:04d}" for i in range(count)]


def decode(parts: Iterable[bytes | None], *, head: dict[str, object]) -> bytes:
    """The payload, or :class:`BlobError` when a chunk is missing or the bytes do not match."""
    chunks = list(parts)
    if any(p is None for p in chunks) or len(chunks) != head.get("chunks"):
        raise BlobError(
            f"chunk missing: expected {head.get('chunks')}, found {sum(p is not None for p in chunks)}"
        )
    return inflate(b"".join(p for p in chunks if p is not None), digest=head.get("digest"),
                   size=head.get("size"), what="chunks")  # fmt: skip


def inflate(packed: bytes, *, digest: object, size: object, what: str, limit: int = MAX_RAW_BYTES) -> bytes:
    """The raw bytes of ``packed`` (what :func:`encode` made), checked against the ``digest``
    and ``size`` a head names (the Consul store's chunks, the Kubernetes store's pieces);
    :class:`BlobError` naming ``what`` when they do not match."""
    if hashlib.sha256(packed).hexdigest() != digest:
        raise BlobError(f"{what} do not match the head's digest (torn or replaced while reading)")
    if not isinstance(size, int) or not 0 <= size <= limit:
        raise BlobError(f"{what}: the head names an implausible size {size!r}")
    try:
        inflater = zlib.decompressobj()
        payload = inflater.decompress(packed, size + 1)
    except zlib.error as exc:
        raise BlobError(f"{what} do not decompress: {exc}") from exc
    if len(payload) != size or inflater.unconsumed_tail:
        raise BlobError(f"{what}: {len(payload)} bytes, the head says {size}")
    return payload


def generation_of(folder: str) -> int | None:
    """``000000000012-abcdef0123456789/`` -> 12 (None for anything else)."""
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    head, sep, _ = name.partition("-")
    return int(head) if sep and head.isdigit() else None


def collectable(folders: Iterable[str], *, current: int) -> list[str]:
    """Chunk folders older than the previous generation (``current - 1``).

    The previous generation stays for a reader that fetched the old head just before the
    switch. A writer's unreferenced chunks (its check-and-set lost) are always of a
    generation at least the one it read plus one, so they go only once two newer heads
    exist, and no writer can still succeed with them: its CAS expected a head that is gone.
    """
    out = []
    for folder in folders:
        generation = generation_of(folder)
        if generation is not None and generation < current - 1:
            out.append(folder)
    return out
