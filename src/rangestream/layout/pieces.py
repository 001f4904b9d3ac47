"""Row ranges of stored arrays to pieces of blocks: the only place that knows chunk geometry.

A read names rows ``[start, stop)`` of an array of one shard and where they land
(:class:`RowRead`). Its rows are cut at block boundaries into :class:`Piece` objects: one
block, a run of rows in it, the inner chunks that hold them and the row of the output they
land at. Both executors consume pieces (``layout.fetched``: byte ranges through the range
reader; ``layout.mapped``: copies out of mapped blocks), check them with one checksum step
(``layout.checksums``) and copy them with one copier (``layout.copy``), so every storage
kind's windows, records and documents share this geometry and nothing else restates it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rangestream.errors import CorruptDataError, OutOfRangeError
from rangestream.io.ranges import RangeRequest
from rangestream.layout.block import MISSING, ArrayLayout

__all__ = [
    "Output",
    "Piece",
    "RowRead",
    "StoredArray",
    "direct_spans",
    "indexed_spans",
    "output_rows",
    "pieces",
]


@dataclass(frozen=True, slots=True, eq=False)
class StoredArray:
    """One array of one shard as stored: its key, layout, length and name.

    ``ident`` is a small integer unique among the arrays of one opened dataset; mapped
    blocks are found by ``block_base + block`` (``ident << 40``) instead of by building
    their path. The layout's sizes are copied onto the array once: single windows read
    them on every call.
    """

    key: str
    layout: ArrayLayout
    length: int
    kind: str
    ident: int = 0
    block_base: int = field(init=False, repr=False)
    block_rows: int = field(init=False, repr=False)
    chunk_rows: int = field(init=False, repr=False)
    stored: int = field(init=False, repr=False)
    row_nbytes: int = field(init=False, repr=False)
    dense: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        layout = self.layout
        for name, value in (
            ("block_base", self.ident << 40),
            ("block_rows", layout.block_rows),
            ("chunk_rows", layout.chunk_rows),
            ("stored", layout.stored_chunk_nbytes),
            ("row_nbytes", layout.row_nbytes),
            ("dense", layout.dense_chunks),
        ):
            object.__setattr__(self, name, value)

    def block_key(self, block: int) -> str:
        return self.layout.block_key(self.key, block)


#: ``(target, field_offset, field_nbytes)``: copy bytes ``[field_offset, field_offset +
#: field_nbytes)`` of every row into ``target``, a C-contiguous array of exactly ``rows *
#: field_nbytes`` bytes (its shape and dtype are the caller's: a token array, a frame field).
Output = tuple[np.ndarray, int, int]


@dataclass(slots=True)
class RowRead:
    """Rows ``[start, stop)`` of ``array``, copied into ``outputs`` by an executor.

    Outputs are made only once the rows are known to exist (``ready``, called by the
    executor after its checks): lengths come from stored metadata, and a damaged or hostile
    length must fail on a small request, not on allocating what it claims. Made with
    :meth:`whole` (all bytes of each row into a new array), or with ``outputs`` or a
    ``make`` function of the caller's (some fields of each row, into its arrays).
    """

    array: StoredArray
    start: int
    stop: int
    outputs: tuple[Output, ...] | None = None
    make: Callable[[RowRead], tuple[Output, ...]] | None = None
    #: The array ``whole`` made, once ready (``None`` for the caller's own outputs).
    target: Any = field(default=None)

    @classmethod
    def whole(
        cls, array: StoredArray, start: int, stop: int, dtype: np.dtype[Any] | None = None
    ) -> RowRead:
        """All bytes of each row into a new array of ``dtype`` (default: bytes per row)."""
        return cls(array, start, stop, make=partial(_whole_rows, dtype=dtype))

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def ready(self) -> tuple[Output, ...]:
        """The outputs, made now if they are not yet."""
        outputs = self.outputs
        if outputs is None:
            assert self.make is not None, "a RowRead needs outputs or a make function"
            outputs = self.outputs = self.make(self)
        return outputs

    def check(self) -> None:
        """Raise ``OutOfRangeError`` unless the rows lie within the array."""
        if not 0 <= self.start <= self.stop <= self.array.length:
            raise OutOfRangeError(
                f"rows [{self.start}, {self.stop}) outside {self.array.key} of length "
                f"{self.array.length}"
            )


def output_rows(output: Output, at: int, rows: int, total: int) -> np.ndarray:
    """The part of an output that rows ``[at, at + rows)`` of the read land in."""
    target, _offset, nbytes = output
    if at == 0 and rows == total:
        return target
    flat = target.reshape(-1).view(np.uint8)
    return flat[at * nbytes : (at + rows) * nbytes]


def _whole_rows(read: RowRead, dtype: np.dtype[Any] | None) -> tuple[Output, ...]:
    layout = read.array.layout
    rows = max(0, read.stop - read.start)
    if dtype is None:
        target = np.empty((rows, layout.row_nbytes), dtype=np.uint8)
    else:
        target = np.empty(rows * layout.row_nbytes // dtype.itemsize, dtype=dtype)
    read.target = target
    return ((target, 0, layout.row_nbytes),)


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[row, row + rows)`` of one block of ``read.array``, landing at output row ``at``."""

    read: RowRead
    block: int
    row: int
    rows: int
    at: int

    @property
    def array(self) -> StoredArray:
        return self.read.array

    @property
    def key(self) -> str:
        return self.read.array.block_key(self.block)

    @property
    def first_chunk(self) -> int:
        return self.row // self.read.array.layout.chunk_rows

    @property
    def end_chunk(self) -> int:
        """One past the last inner chunk holding the piece's rows."""
        return (self.row + self.rows - 1) // self.read.array.layout.chunk_rows + 1

    def dense_span(self) -> tuple[int, int]:
        """Byte range of the piece's inner chunks in a densely laid out block."""
        stored = self.read.array.layout.stored_chunk_nbytes
        return self.first_chunk * stored, self.end_chunk * stored


def pieces(reads: Sequence[RowRead]) -> list[Piece]:
    """Every read's rows cut at block boundaries, in order (empty reads have none)."""
    out = []
    for read in reads:
        read.check()
        block_rows = read.array.layout.block_rows
        row = read.start
        while row < read.stop:
            block = row // block_rows
            base = block * block_rows
            end = min(read.stop, base + block_rows)
            out.append(Piece(read, block, row - base, end - row, row - read.start))
            row = end
    return out


def spans_many_blocks(read: RowRead, blocks: int) -> bool:
    """Whether ``read`` touches more than ``blocks`` blocks (a probe is due first)."""
    block_rows = read.array.layout.block_rows
    return (
        0 <= read.start < read.stop <= read.array.length
        and (read.stop - 1) // block_rows - read.start // block_rows >= blocks
    )


def indexed_spans(
    layout: ArrayLayout, index: np.ndarray, first_chunk: int, last_chunk: int, where: str
) -> list[tuple[int, int, int, int]]:
    """Byte runs ``(start, end, first, last)`` covering inner chunks ``first..last``.

    For blocks whose chunks are not known to be dense: their offsets come from the block's
    chunk index. Consecutive chunks stored back to back form one run, so one range request
    fetches them.
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


#: Row reads in one step up to which the direct path is taken (a temporal window reads one
#: per field); larger steps are the general program's.
DIRECT_READS = 16


def direct_spans(step: Sequence[object]) -> list[tuple[Piece, RangeRequest]] | None:
    """The one range of each row read of ``step``, if the direct path can serve it.

    The common cases (a window of one range in one block; a temporal window's fields)
    need none of the general program: every item a row read of rows in one dense block,
    so no probe (one block is never far), no chunk index round and one piece per read.
    The requests are the ones ``RemoteExecutor``'s general rounds would make, in the
    same order, so the reader coalesces and counts them alike. ``None`` for anything else.
    """
    if not step or len(step) > DIRECT_READS:
        return None
    direct: list[tuple[Piece, RangeRequest]] = []
    for read in step:
        if not isinstance(read, RowRead) or read.rows <= 0:
            return None
        array = read.array
        if not array.dense:
            return None
        read.check()
        block_rows, chunk_rows, stored = array.block_rows, array.chunk_rows, array.stored
        block, row = divmod(read.start, block_rows)
        rows = read.stop - read.start
        if row + rows > block_rows:
            return None
        piece = Piece(read, block, row, rows, 0)
        first, end = row // chunk_rows, (row + rows - 1) // chunk_rows + 1
        request = RangeRequest(array.block_key(block), first * stored, end * stored)
        direct.append((piece, request))
    return direct
