"""Checking block objects: size, chunk index, the crc32c of every inner chunk, and the
offset arrays followed from block to block.

Blocks of at most ``PIECE_BYTES`` are read whole, a window of them at once; larger ones in
pieces, one block at a time, so memory is bounded by what is read, never by what a damaged
layout claims. Findings are merged in block order, so the offset checks follow each array
from its first block to its last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import google_crc32c
import numpy as np

from rangestream.errors import CorruptDataError, StorageError
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import RangeRequest
from rangestream.layout.block import MISSING, ArrayLayout, parse_block_index
from rangestream.layout.checksums import CRC32C_RESIDUE, crc32c
from rangestream.layout.manifest import Manifest
from rangestream.storage.maintenance.verify_report import Problem, VerifyReport

__all__ = ["PIECE_BYTES", "Block", "OffsetCheck", "offset_checks", "scan_blocks"]

_INT64 = np.dtype("<i8")

#: ``offsets array -> (array whose length it must end at, whether it starts at 0)``.
#: Offsets arrays: for each, ``(column or None, the array whose length it must end at,
#: whether it starts at 0)``; ``None`` as the target means "the first other array" (the
#: temporal groups, which all have one row per frame).
_OFFSET_ARRAYS: dict[str, list[tuple[int | None, str | None, bool]]] = {
    "record_ends": [(None, "stream", False)],
    "payload_offsets": [(None, "payload_heap", True)],
    "runs": [(0, "stream", True), (1, "payload_heap", True)],
    "record_rows": [(1, None, False)],
}


#: Blocks up to this size are read with one request; larger ones in pieces of about this
#: size, so a scan's memory stays near ``max_concurrency * PIECE_BYTES`` whatever the
#: layout claims (inner chunks of up to 2 GiB, blocks of 2**40 rows).
PIECE_BYTES = 16 << 20


class ProblemSink(Protocol):
    """Where checks put what they find: the report, or one block's findings."""

    def add(self, where: str, message: str) -> None: ...


@dataclass
class OffsetCheck:
    """Streaming check of one shard's offsets array, block by block, in order."""

    name: str
    end: int  # the length the last offset must equal
    starts_at_zero: bool
    where: str
    column: int | None = None  # of a (rows, k) int64 array; None for a 1-D one
    previous: int | None = None
    broken: bool = False

    def feed(self, values: np.ndarray, report: ProblemSink, first_row: int) -> None:
        if self.broken or not len(values):
            return
        if self.previous is None and self.starts_at_zero and int(values[0]) != 0:
            self._fail(report, f"{self.name}[0] is {int(values[0])}, expected 0")
            return
        joined = values if self.previous is None else np.r_[self.previous, values]
        bad = np.flatnonzero(np.diff(joined) < 0)
        if len(bad):
            row = first_row + int(bad[0]) - (0 if self.previous is None else 1)
            self._fail(report, f"{self.name} decrease at row {row + 1}")
            return
        if int(values.min()) < 0 or int(values.max()) > self.end:
            self._fail(report, f"{self.name} leave [0, {self.end}] (the length of the data)")
            return
        self.previous = int(values[-1])

    def finish(self, report: ProblemSink) -> None:
        if not self.broken and self.previous is not None and self.previous != self.end:
            self._fail(report, f"{self.name} end at {self.previous}, expected {self.end}")

    def _fail(self, report: ProblemSink, message: str) -> None:
        self.broken = True
        report.add(self.where, message)


@dataclass
class Block:
    key: str
    layout: ArrayLayout
    rows: int  # rows of the array this block holds
    first_row: int
    checks: list[OffsetCheck]
    size: int  # bytes of the stored object, from the listing


@dataclass
class Findings:
    """What one block's scan found, merged into the report in block order."""

    problems: list[Problem] = field(default_factory=list)
    chunks: int = 0
    bytes: int = 0
    #: ``(first row, values)`` of verified rows of an offsets array, in row order.
    values: list[tuple[int, np.ndarray]] = field(default_factory=list)
    #: Whether the block's offsets can be followed (no bad or missing chunk).
    intact: bool = True

    def add(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))


async def scan_blocks(
    reader: RangeReader,
    blocks: list[Block],
    report: VerifyReport,
    progress: Callable[[int], Any] | None,
    max_concurrency: int,
) -> None:
    """Check ``blocks`` (in array and block order) and add what they hold to ``report``."""
    for start in range(0, len(blocks), max_concurrency):
        window = blocks[start : start + max_concurrency]
        small = [block for block in window if block.size <= PIECE_BYTES]
        found = dict(
            zip(
                map(id, small),
                await asyncio.gather(*(_scan_or_report(reader, block) for block in small)),
                strict=True,
            )
        )
        for block in window:
            findings = found.get(id(block))
            if findings is None:
                findings = await _scan_or_report(reader, block, feed=True)
            _merge(report, block, findings)
        if progress is not None:
            progress(len(window))


def _merge(report: VerifyReport, block: Block, findings: Findings) -> None:
    report.blocks += 1
    report.chunks += findings.chunks
    report.bytes += findings.bytes
    report.problems.extend(findings.problems)
    for first_row, values in findings.values:
        _feed(block, values, report, first_row)
    if not findings.intact:
        for check in block.checks:
            check.broken = True


def _feed(block: Block, values: np.ndarray, report: ProblemSink, first_row: int) -> None:
    rows = values.reshape(-1, block.layout.row_nbytes // 8)
    for check in block.checks:
        column = rows[:, check.column] if check.column is not None else rows[:, 0]
        check.feed(column, report, first_row)


def offset_checks(
    manifest: Manifest, name: str, layout: ArrayLayout, position: int, where: str
) -> list[OffsetCheck]:
    """The offset invariants array ``name`` of one shard must satisfy, if any."""
    specs = _OFFSET_ARRAYS.get(name)
    if specs is None or layout.dtype != _INT64:
        return []
    columns = layout.row_shape[0] if layout.row_shape else None
    if layout.row_shape not in ((), (2,)):
        return []
    checks = []
    for column, target, starts_at_zero in specs:
        if (column is None) != (columns is None):
            continue
        if target is None:
            target = next((other for other in manifest.arrays if other != name), None)
        if target is None or target not in manifest.arrays:
            continue
        end = int(manifest.lengths[target][position])
        label = name if column is None else f"{name}[:, {column}]"
        checks.append(OffsetCheck(label, end, starts_at_zero, where, column))
    return checks


async def _read(reader: RangeReader, key: str, start: int, end: int) -> bytes:
    (data,) = await reader.fetch([RangeRequest(key, start, end)], max_concurrency=1)
    return bytes(data)


def _runs(numbers: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, last)`` of sorted integers."""
    if not len(numbers):
        return []
    breaks = np.flatnonzero(np.diff(numbers) != 1)
    firsts = np.r_[numbers[0], numbers[breaks + 1]]
    lasts = np.r_[numbers[breaks], numbers[-1]]
    return [(int(a), int(b)) for a, b in zip(firsts, lasts, strict=True)]


def _chunks(first: int, last: int) -> str:
    return f"inner chunk {first}" if first == last else f"inner chunks {first}..{last}"


async def _scan_or_report(reader: RangeReader, block: Block, *, feed: bool = False) -> Findings:
    """``_scan_block``, with a block that cannot be read reported instead of raised."""
    try:
        return await _scan_block(reader, block, feed=feed)
    except (CorruptDataError, StorageError) as error:
        findings = Findings(intact=False)
        findings.add(reader.store.describe(block.key), f"cannot be read: {error}")
        return findings


async def _scan_block(reader: RangeReader, block: Block, *, feed: bool = False) -> Findings:
    """Check one block object: its size, chunk index and every inner chunk's crc32c.

    Reads the object whole when it is small, else its index and then its chunks in pieces
    of about ``PIECE_BYTES``; every allocation is bounded by bytes actually read, never by
    what the layout claims. Every bad inner chunk is reported (consecutive ones as one
    run), not only the first. With ``feed`` the block's offset values go straight to its
    checks (blocks in pieces run alone, in order) instead of into the findings.
    """
    findings = Findings()
    layout, size = block.layout, block.size
    where = reader.store.describe(block.key)
    stored = layout.stored_chunk_nbytes
    present = -(-block.rows // layout.chunk_rows)
    if layout.dense_chunks and size != present * stored + layout.index_nbytes:
        findings.add(
            where,
            f"object is {size} bytes; {block.rows} rows in {present} chunks of {stored} "
            f"bytes and the index make {present * stored + layout.index_nbytes} (truncated, "
            "or the manifest's length disagrees)",
        )
        findings.intact = False
        return findings
    if size < layout.index_nbytes:
        findings.add(where, f"{size} bytes cannot hold the {layout.index_nbytes}-byte index")
        findings.intact = False
        return findings
    heap_end = size - layout.index_nbytes
    whole = await _read(reader, block.key, 0, size) if size <= PIECE_BYTES else None
    raw_index = (
        whole[heap_end:] if whole is not None else await _read(reader, block.key, heap_end, size)
    )
    findings.bytes += size if whole is not None else len(raw_index)
    try:
        index = parse_block_index(layout, raw_index, "chunk index")
    except CorruptDataError as error:
        findings.add(f"{where} bytes [{heap_end}, {size})", str(error))
        findings.intact = False
        return findings
    good = _check_index(layout, index, present, heap_end, where, findings)
    if len(good) < present:
        findings.intact = False
    bad: list[int] = []
    offsets = index[:, 0]
    for piece in _pieces(layout, offsets, good):
        first_offset = int(offsets[piece[0]])
        end_offset = int(offsets[piece[-1]]) + stored
        if whole is not None:
            data = whole[first_offset:end_offset]
        elif end_offset - first_offset <= PIECE_BYTES:
            data = await _read(reader, block.key, first_offset, end_offset)
            findings.bytes += len(data)
        else:  # one inner chunk larger than a piece: its crc32c, piece by piece
            if not await _huge_chunk_ok(reader, block.key, first_offset, stored, findings):
                bad.append(piece[0])
            elif block.checks and findings.intact:
                await _feed_huge_chunk(reader, block, piece[0], first_offset, findings, feed)
            continue
        chunks = np.frombuffer(data, dtype=np.uint8).reshape(len(piece), stored)
        findings.chunks += len(piece)
        piece_bad = [c for c, chunk in zip(piece, chunks, strict=True)
                     if crc32c(chunk) != CRC32C_RESIDUE]  # fmt: skip
        if piece_bad:
            bad.extend(piece_bad)
            findings.intact = False
        if block.checks and findings.intact:
            values = chunks[:, : layout.chunk_nbytes].reshape(-1)
            first_row = piece[0] * layout.chunk_rows
            keep = min(len(piece) * layout.chunk_rows, block.rows - first_row)
            rows = values[: keep * layout.row_nbytes].view(_INT64)
            _hand_over(block, rows, block.first_row + first_row, findings, feed)
    for first, last in _runs(np.asarray(sorted(bad), dtype=np.int64)):
        start, end = int(offsets[first]), int(offsets[last]) + stored
        span = f"bytes [{start}, {end})" if layout.dense_chunks or first == last else "bytes"
        findings.add(f"{where} {span}", f"checksum mismatch in {_chunks(first, last)}")
    return findings


def _hand_over(
    block: Block, rows: np.ndarray, first_row: int, findings: Findings, feed: bool
) -> None:
    if feed:
        _feed(block, rows.copy(), findings, first_row)
    else:
        findings.values.append((first_row, rows.copy()))


def _check_index(
    layout: ArrayLayout,
    index: np.ndarray,
    present: int,
    heap_end: int,
    where: str,
    findings: Findings,
) -> np.ndarray:
    """Chunk numbers whose index entries are valid; every invalid one is reported.

    Vectorised over the whole index (at most 2**22 entries), and entries of valid chunks
    must not overlap, so checking them reads each stored byte at most once.
    """
    stored = layout.stored_chunk_nbytes
    offsets, sizes = index[:, 0], index[:, 1]
    beyond = np.flatnonzero(offsets[present:] != MISSING) + present
    for first, last in _runs(beyond):
        findings.add(where, f"chunk index lists {_chunks(first, last)}, past the array's end")
    offsets, sizes = offsets[:present], sizes[:present]
    missing = offsets == MISSING
    for first, last in _runs(np.flatnonzero(missing)):
        findings.add(where, f"{_chunks(first, last)} missing from the chunk index")
    numbers = np.arange(present, dtype=np.uint64)
    expected = numbers * np.uint64(stored) if layout.dense_chunks else offsets
    limit = np.uint64(max(heap_end - stored, 0))
    wrong = ~missing & (
        (sizes != stored) | (offsets != expected) | (offsets > limit) | (heap_end < stored)
    )
    for first, last in _runs(np.flatnonzero(wrong)):
        findings.add(
            where,
            f"chunk index entry {first}{f'..{last}' if last > first else ''} is (offset "
            f"{int(offsets[first])}, {int(sizes[first])} bytes), expected "
            f"({int(expected[first])}, {stored}) within the first {heap_end} bytes",
        )
    good = np.flatnonzero(~missing & ~wrong)
    if not layout.dense_chunks and len(good) > 1:
        order = good[np.argsort(offsets[good], kind="stable")]
        overlapping = order[1:][offsets[order[1:]] < offsets[order[:-1]] + np.uint64(stored)]
        for chunk in overlapping[:20]:
            findings.add(where, f"inner chunk {int(chunk)} overlaps another in the block")
        good = np.setdiff1d(good, overlapping)
    return good


def _pieces(layout: ArrayLayout, offsets: np.ndarray, good: np.ndarray) -> list[list[int]]:
    """Good chunks in chunk order, grouped into reads of at most about ``PIECE_BYTES``:
    consecutive chunks stored back to back (any chunks, when the block was read whole)."""
    stored = layout.stored_chunk_nbytes
    per_piece = max(1, PIECE_BYTES // stored)
    pieces: list[list[int]] = []
    for chunk in (int(c) for c in good):
        last = pieces[-1] if pieces else None
        if (
            last is not None
            and len(last) < per_piece
            and last[-1] == chunk - 1
            and int(offsets[chunk]) == int(offsets[last[-1]]) + stored
        ):
            last.append(chunk)
        else:
            pieces.append([chunk])
    return pieces


async def _huge_chunk_ok(
    reader: RangeReader, key: str, offset: int, stored: int, findings: Findings
) -> bool:
    """The crc32c of one stored chunk larger than a piece, read piece by piece."""
    crc = 0
    for start in range(offset, offset + stored, PIECE_BYTES):
        data = await _read(reader, key, start, min(start + PIECE_BYTES, offset + stored))
        findings.bytes += len(data)
        crc = google_crc32c.extend(crc, data)
    findings.chunks += 1
    return int(crc) == CRC32C_RESIDUE


async def _feed_huge_chunk(
    reader: RangeReader,
    block: Block,
    chunk: int,
    offset: int,
    findings: Findings,
    feed: bool,
) -> None:
    """Offset values of a verified chunk larger than a piece, read again piece by piece."""
    layout = block.layout
    first_row = chunk * layout.chunk_rows
    rows = min(layout.chunk_rows, block.rows - first_row)
    step = max(1, PIECE_BYTES // layout.row_nbytes)
    for row in range(0, rows, step):
        count = min(step, rows - row)
        start = offset + row * layout.row_nbytes
        data = await _read(reader, block.key, start, start + count * layout.row_nbytes)
        findings.bytes += len(data)
        values = np.frombuffer(data, dtype=_INT64)
        _hand_over(block, values, block.first_row + first_row + row, findings, feed)
