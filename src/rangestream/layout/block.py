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

import numpy as np

from rangestream.errors import ChecksumError, CorruptDataError, MetadataError
from rangestream.layout.checksums import CRC_NBYTES, crc32c

MISSING = np.uint64(2**64 - 1)


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
    #: What follows a block's number in its key: one ``/0`` per trailing stored axis.
    block_key_suffix: str = field(init=False, repr=False, compare=False)

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
            "block_key_suffix": "/0" * self.stored_trailing_ndim,
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

    def stored_for(self, length: int) -> ArrayLayout:
        """The layout an array of ``length`` rows is stored with (format version 2).

        Zarr's sharding codec gives every block of an array a chunk index of
        ``block_rows / chunk_rows`` entries, the last block included, so the chunk grid of
        an array is what can shrink, not one block of it. An array that fits in one block
        declares a block shape of its length rounded up to whole inner chunks: its block
        then holds exactly the chunks it has and an index of as many entries (20 bytes for
        a one-chunk array instead of 64 KiB for a 4 MiB block of 1 KiB chunks). A longer
        array keeps the regular grid and its last block the full index. Rows map to the
        same bytes either way (block 0 starts every array), so only the chunk index size
        and ``chunks_per_block`` differ: readers of dense layouts, which never read a chunk
        index, may keep addressing it with the full layout. Layouts that are not dense keep
        the full grid, so a reader that fetches chunk indexes needs no more than the layout.
        """
        if length > self.block_rows or not self.dense_chunks:
            return self
        rows = max(1, -(-length // self.chunk_rows)) * self.chunk_rows
        if rows == self.block_rows:
            return self
        return ArrayLayout(self.dtype, self.row_shape, self.chunk_rows, rows, self.dense_chunks)

    def block_key(self, array_key: str, block: int) -> str:
        return f"{array_key}/c/{block}{self.block_key_suffix}"

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
