"""Blocks: objects of a Zarr v3 array written with the ``sharding_indexed`` codec.

Zarr calls these objects shards; we say *block* to keep them apart from writer shards. A
block holds ``chunks_per_block`` inner chunks, each the raw little-endian bytes of
``chunk_rows`` rows followed by their crc32c, then the chunk index (one ``(offset, nbytes)``
uint64 pair per inner chunk) and the index's crc32c. Inner chunks are uncompressed, so once
a block's index is known, rows map to byte ranges by arithmetic, and every inner chunk a
read touches is verified against its checksum, partial reads included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import numpy as np
from google_crc32c import value as crc32c_value

from rangestream.errors import ChecksumError, CorruptDataError, MetadataError

MISSING = np.uint64(2**64 - 1)
CRC_NBYTES = 4


def crc32c(data: bytes | memoryview | np.ndarray) -> int:
    if isinstance(data, memoryview):  # google_crc32c takes bytes and arrays, not memoryviews
        data = np.frombuffer(data, dtype=np.uint8)
    return int(google_crc32c.value(data))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ArrayLayout:
    """How one array's rows are cut into inner chunks and blocks.

    A row is one element of axis 0 with its trailing shape (a token, a structured stream
    element stored as bytes, a frame of a temporal field).
    """

    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    chunk_rows: int
    block_rows: int
    #: Every block stores its inner chunks back to back from offset 0, in order, so a
    #: reader can compute byte ranges without fetching the block's chunk index. Our writer
    #: always produces this; the crc32c of each chunk still guards against a wrong layout.
    dense_chunks: bool = True

    # Derived sizes, computed once: they sit on the per-window hot path.
    row_nbytes: int = field(init=False, repr=False, compare=False)
    chunk_nbytes: int = field(init=False, repr=False, compare=False)
    stored_chunk_nbytes: int = field(init=False, repr=False, compare=False)
    chunks_per_block: int = field(init=False, repr=False, compare=False)
    index_nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.chunk_rows < 1 or self.block_rows < self.chunk_rows:
            raise MetadataError(
                f"invalid layout: chunk_rows={self.chunk_rows}, block_rows={self.block_rows}"
            )
        if self.block_rows % self.chunk_rows:
            raise MetadataError("block_rows must be a multiple of chunk_rows")
        chunks_per_block = self.block_rows // self.chunk_rows
        if chunks_per_block > 1 << 22:
            raise MetadataError(f"{chunks_per_block} inner chunks per block is too many")
        row_nbytes = self.dtype.itemsize * math.prod(self.row_shape)
        derived = {
            "row_nbytes": row_nbytes,
            "chunk_nbytes": self.chunk_rows * row_nbytes,
            "stored_chunk_nbytes": self.chunk_rows * row_nbytes + CRC_NBYTES,
            "chunks_per_block": chunks_per_block,
            "index_nbytes": 16 * chunks_per_block + CRC_NBYTES,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @classmethod
    def for_sizes(
        cls,
        dtype: np.dtype[Any],
        row_shape: tuple[int, ...],
        *,
        chunk_bytes: int,
        block_bytes: int,
        dense_chunks: bool = True,
    ) -> ArrayLayout:
        """A layout whose inner chunks and stored blocks come close to the byte targets.

        ``block_bytes`` bounds the whole stored object (chunks, their checksums and the
        chunk index), so objects stay within a store's piece size when chosen to.
        """
        row_nbytes = dtype.itemsize * math.prod(row_shape)
        chunk_rows = max(1, chunk_bytes // row_nbytes)
        per_chunk = chunk_rows * row_nbytes + CRC_NBYTES + 16  # data, crc32c, index entry
        chunks_per_block = max(1, (block_bytes - CRC_NBYTES) // per_chunk)
        return cls(dtype, tuple(row_shape), chunk_rows, chunk_rows * chunks_per_block, dense_chunks)

    @property
    def stored_trailing_ndim(self) -> int:
        """Trailing dimensions of the stored Zarr array (structured rows add a byte axis)."""
        structured = self.dtype.fields is not None or self.dtype.subdtype is not None
        return len(self.row_shape) + (1 if structured else 0)

    def block_key(self, array_key: str, block: int) -> str:
        return f"{array_key}/c/{block}" + "/0" * self.stored_trailing_ndim

    def num_blocks(self, length: int) -> int:
        return -(-length // self.block_rows)

    def to_json(self) -> dict[str, Any]:
        from rangestream.layout.dtypes import dtype_to_json

        return {
            "dtype": dtype_to_json(self.dtype),
            "row_shape": list(self.row_shape),
            "chunk_rows": self.chunk_rows,
            "block_rows": self.block_rows,
            "dense_chunks": self.dense_chunks,
        }

    @classmethod
    def from_json(cls, value: Any, what: str) -> ArrayLayout:
        from rangestream.layout.dtypes import dtype_from_json

        if not isinstance(value, dict):
            raise MetadataError(f"{what}: layout must be an object")
        row_shape = value.get("row_shape")
        if not isinstance(row_shape, list) or len(row_shape) > 8:
            raise MetadataError(f"{what}: row_shape must be a short list")
        for extent in row_shape:
            if type(extent) is not int or not 1 <= extent <= 1 << 24:
                raise MetadataError(f"{what}: row_shape entry {extent!r} is invalid")
        chunk_rows, block_rows = value.get("chunk_rows"), value.get("block_rows")
        for name, number in (("chunk_rows", chunk_rows), ("block_rows", block_rows)):
            if type(number) is not int or not 1 <= number <= 1 << 40:
                raise MetadataError(f"{what}: {name} {number!r} is invalid")
        dense = value.get("dense_chunks", False)
        if not isinstance(dense, bool):
            raise MetadataError(f"{what}: dense_chunks must be a boolean")
        layout = cls(dtype_from_json(value.get("dtype"), what), tuple(row_shape), chunk_rows,
                     block_rows, dense)  # fmt: skip
        if layout.row_nbytes > 1 << 28 or layout.chunk_nbytes > 1 << 31:
            raise MetadataError(f"{what}: rows or chunks are unreasonably large")
        return layout


def encode_block(layout: ArrayLayout, rows: bytes | memoryview | np.ndarray) -> bytes:
    """The object for one block holding ``rows`` (at most ``block_rows`` rows of bytes)."""
    data = np.frombuffer(rows, dtype=np.uint8) if not isinstance(rows, np.ndarray) else rows
    data = data.reshape(-1)
    row_nbytes = layout.row_nbytes
    num_rows = data.size // row_nbytes
    if num_rows * row_nbytes != data.size or not 0 < num_rows <= layout.block_rows:
        raise ValueError(f"a block takes 1..{layout.block_rows} whole rows, got {data.size} B")
    present = -(-num_rows // layout.chunk_rows)
    stored = layout.stored_chunk_nbytes
    out = np.zeros(present * stored + layout.index_nbytes, dtype=np.uint8)
    chunks = out[: present * stored].reshape(present, stored)
    flat = np.zeros(present * layout.chunk_nbytes, dtype=np.uint8)
    flat[: data.size] = data
    chunks[:, : layout.chunk_nbytes] = flat.reshape(present, layout.chunk_nbytes)
    checksums = np.fromiter(
        (crc32c(chunks[i, : layout.chunk_nbytes]) for i in range(present)),
        dtype="<u4",
        count=present,
    )
    chunks[:, layout.chunk_nbytes :] = checksums.view(np.uint8).reshape(present, CRC_NBYTES)
    index = np.full((layout.chunks_per_block, 2), MISSING, dtype="<u8")
    index[:present, 0] = np.arange(present, dtype=np.uint64) * np.uint64(stored)
    index[:present, 1] = stored
    index_bytes = index.tobytes()
    tail = out[present * stored :]
    tail[: len(index_bytes)] = np.frombuffer(index_bytes, dtype=np.uint8)
    tail[len(index_bytes) :] = np.frombuffer(
        np.uint32(crc32c(index_bytes)).astype("<u4").tobytes(), dtype=np.uint8
    )
    return out.tobytes()


def parse_block_index(layout: ArrayLayout, raw: bytes | memoryview, where: str) -> np.ndarray:
    """Verify and decode a block's chunk index into an ``(n, 2)`` uint64 array."""
    if len(raw) != layout.index_nbytes:
        raise CorruptDataError(
            f"{where}: chunk index is {len(raw)} bytes, expected {layout.index_nbytes} "
            "(object truncated or written with another layout)"
        )
    body = memoryview(raw)[:-CRC_NBYTES]
    stored = int.from_bytes(memoryview(raw)[-CRC_NBYTES:], "little")
    if crc32c(body) != stored:
        raise ChecksumError(f"{where}: chunk index checksum mismatch")
    return np.frombuffer(body, dtype="<u8").reshape(-1, 2)


def chunk_byte_runs(
    layout: ArrayLayout, index: np.ndarray, first_chunk: int, last_chunk: int, where: str
) -> list[tuple[int, int, int, int]]:
    """Byte runs ``(start, end, first, last)`` covering inner chunks ``first..last``.

    Consecutive chunks stored back to back form one run, so one range request fetches them.
    """
    entries = index[first_chunk : last_chunk + 1]
    offsets = entries[:, 0]
    sizes = entries[:, 1]
    if (offsets == MISSING).any():
        missing = first_chunk + int(np.flatnonzero(offsets == MISSING)[0])
        raise CorruptDataError(f"{where}: inner chunk {missing} is missing from the block")
    if (sizes != layout.stored_chunk_nbytes).any():
        raise CorruptDataError(
            f"{where}: inner chunk sizes differ from {layout.stored_chunk_nbytes} bytes "
            "(compressed or foreign layout)"
        )
    if int(offsets.max()) > 1 << 50:
        raise CorruptDataError(f"{where}: chunk offsets are out of range")
    runs: list[tuple[int, int, int, int]] = []
    run_start = 0
    for i in range(1, len(offsets) + 1):
        if i == len(offsets) or int(offsets[i]) != int(offsets[i - 1]) + int(sizes[i - 1]):
            start = int(offsets[run_start])
            end = int(offsets[i - 1]) + int(sizes[i - 1])
            runs.append((start, end, first_chunk + run_start, first_chunk + i - 1))
            run_start = i
    return runs


#: CRC-32C of any message followed by its own little-endian CRC-32C: checking a stored
#: chunk against this constant verifies it in one call, without splitting off the trailer.
CRC32C_RESIDUE = 0x48674BC7


#: ``stored chunk size -> [CRC-32C of n intact stored chunks for n = 0, 1, ...]``.
_INTACT_RUNS: dict[int, list[int]] = {}


def _crc_of_intact_chunks(stored: int, count: int) -> int:
    """The CRC-32C of any ``count`` intact stored chunks of ``stored`` bytes each.

    An intact stored chunk (bytes, then their CRC) always has the CRC ``CRC32C_RESIDUE``,
    and the CRC of a concatenation depends only on the parts' CRCs and lengths, so every
    run of ``count`` intact chunks has one CRC, whatever the chunks hold.
    """
    table = _INTACT_RUNS.get(stored)
    if table is None or len(table) <= count:
        table = list(table or [0])  # built aside, then published whole: threads may race
        body = bytes(stored - CRC_NBYTES)
        intact = body + crc32c(body).to_bytes(CRC_NBYTES, "little")
        while len(table) <= count:
            table.append(google_crc32c.extend(table[-1], intact))
        if len(_INTACT_RUNS) >= 64:  # layouts come from stored metadata: bound the cache
            _INTACT_RUNS.clear()
        _INTACT_RUNS[stored] = table
    return table[count]


def _stored_chunks(
    layout: ArrayLayout, data: bytes | memoryview, where: Any
) -> tuple[np.ndarray, int]:
    """``data`` as a byte array and its number of stored chunks, if it is whole chunks."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    count = buffer.size // layout.stored_chunk_nbytes
    if count * layout.stored_chunk_nbytes != buffer.size:
        place = where() if callable(where) else where
        raise CorruptDataError(f"{place}: {buffer.size} bytes is not a whole number of chunks")
    return buffer, count


def check_chunks(layout: ArrayLayout, data: bytes | memoryview, where: Any) -> None:
    """Raise ``ChecksumError`` unless every stored chunk in ``data`` matches its crc32c.

    One CRC over the whole read is compared with the CRC every intact run of that many
    chunks has (one call instead of one per chunk, a sixth of the time for a 9-chunk
    window). A damaged chunk changes that CRC for certain (the combination is invertible
    per chunk), so only then are the chunks checked one by one, to name the bad one.

    ``where`` is a string or a zero-argument callable producing one (built only on error).
    """
    stored = layout.stored_chunk_nbytes
    buffer, count = _stored_chunks(layout, data, where)
    value = google_crc32c.value
    whole = value(data if isinstance(data, bytes) else buffer)
    if whole == _crc_of_intact_chunks(stored, count):
        return
    # google_crc32c takes bytes or arrays (not memoryviews); slicing bytes is the cheapest
    chunks = (
        (data[o : o + stored] for o in range(0, count * stored, stored))
        if isinstance(data, bytes)
        else iter(buffer.reshape(count, stored))
    )
    for i, chunk in enumerate(chunks):
        if value(chunk) != CRC32C_RESIDUE:
            place = where() if callable(where) else where
            raise ChecksumError(f"{place}: checksum mismatch in inner chunk {i} of the read")


def first_bad_mapped_chunk(
    data: np.ndarray, verified: bytearray, stored: int, first: int, end: int
) -> int | None:
    """Check the not yet verified stored chunks ``[first, end)`` of a mapped block.

    ``data`` is the whole block's bytes, ``verified`` one flag per inner chunk. Chunks that
    match their crc32c are flagged, so a process checks each chunk of an immutable block
    once however many reads touch it. Returns the first damaged chunk (never flagged, so
    every later read of it fails too), or ``None``.
    """
    if verified.find(0, first, end) < 0:
        return None
    for chunk in range(first, end):
        if verified[chunk]:
            continue
        if crc32c_value(data[chunk * stored : (chunk + 1) * stored]) != CRC32C_RESIDUE:
            return chunk
        verified[chunk] = 1
    return None


def decode_chunks(
    layout: ArrayLayout, data: bytes | memoryview, where: Any, *, verify: bool = True
) -> np.ndarray:
    """Strip (and check) the checksums of back-to-back inner chunks; returns their bytes.

    The result is a ``(chunks, chunk_nbytes)`` view of ``data``.
    """
    if verify:
        check_chunks(layout, data, where)
    buffer, count = _stored_chunks(layout, data, where)
    return buffer.reshape(count, layout.stored_chunk_nbytes)[:, : layout.chunk_nbytes]
