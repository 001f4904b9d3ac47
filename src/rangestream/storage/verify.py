"""Scanning a committed dataset for damage: every block, chunk index, checksum and index.

Reads check only what they touch, so damage in data nobody has read yet stays silent. A
scan reads every block of the committed version and checks, per block: that the object
exists and has the size its array's length implies, its chunk index (crc32c and every
entry), and the crc32c of every inner chunk (each bad one is reported). Blocks are read
whole up to ``PIECE_BYTES`` and in pieces beyond, so memory is bounded by what is read,
never by what a damaged layout claims. Per array: that the Zarr array metadata
agrees with the manifest and that no block objects lie past the array's end. Across
arrays: ``record_ends`` never decrease and end at the stream's length;
``payload_offsets`` start at 0, never decrease and end at the heap's length; the two
columns of ``runs`` (element ends, payload ends) start at 0, never decrease and end at the
stream's and the heap's lengths; the end rows of temporal ``record_rows`` never decrease
and end at the shard's group length. Finally, the index arrays for Zarr-only readers must
agree with the manifest. The root document is read within the metadata cap.

Problems are collected, not raised, so one scan reports all the damage it finds. Versions
under ``data/`` that no reader can reach (``rangestream gc``) are listed with their size;
they are not damage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import numpy as np

from rangestream.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    MetadataError,
    MissingObjectError,
    StorageError,
)
from rangestream.io.local import LocalStore
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ObjectRequest, RangeRequest
from rangestream.io.retry import RetryPolicy
from rangestream.io.store import ObjectStore, open_store
from rangestream.layout.block import MISSING, ArrayLayout, parse_block_index
from rangestream.layout.checksums import CRC32C_RESIDUE, crc32c
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    Manifest,
    data_prefix,
    parse_root,
    read_shard_table,
)
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.storage.gc import Orphan, find_orphans
from rangestream.storage.writing import library_errors

__all__ = ["Problem", "VerifyReport", "averify_dataset", "verify_dataset"]

#: Blocks fetched at once; bounds the scan's memory to about this many blocks.
DEFAULT_VERIFY_CONCURRENCY = 8
_INT64 = np.dtype("<i8")
#: Runs of missing blocks reported per array; a wrong length could make millions.
MAX_REPORTED_GAPS = 20

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


@dataclass(frozen=True)
class Problem:
    """One piece of damage: where it is (an object URL, maybe a byte range) and what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class VerifyReport:
    """What a scan checked and the damage it found (``ok`` when there is none)."""

    url: str
    kind: str = ""
    commit_id: str = ""
    shards: int = 0
    arrays: int = 0
    blocks: int = 0
    chunks: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: Versions under ``data/`` that are neither committed nor the one it replaced:
    #: not damage, but space that ``rangestream gc`` can reclaim.
    orphans: list[Orphan] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))

    def lines(self) -> list[str]:
        """The report as printed by ``rangestream verify``."""
        out = [
            f"dataset   {self.url}",
            f"kind      {self.kind or '?'}",
            f"commit    {self.commit_id or '?'}",
            f"checked   {self.arrays} arrays in {self.shards} shards: {self.blocks} blocks, "
            f"{self.chunks} inner chunks, {self.bytes:,} bytes",
        ]
        if self.orphans:
            size = sum(orphan.bytes for orphan in self.orphans)
            out.append(
                f"orphans   {len(self.orphans)} version(s) not part of the dataset, {size:,} "
                f"bytes (`rangestream gc {self.url}` lists them, --yes deletes them)"
            )
            out.extend(f"  {orphan.prefix}: {orphan.bytes:,} bytes" for orphan in self.orphans)
        if self.ok:
            out.append("result    OK: every checksum and index invariant holds")
        else:
            out.append(f"result    DAMAGED: {len(self.problems)} problem(s)")
            out.extend(f"  {problem}" for problem in self.problems)
        return out


@dataclass
class _OffsetCheck:
    """Streaming check of one shard's offsets array, block by block, in order."""

    name: str
    end: int  # the length the last offset must equal
    starts_at_zero: bool
    where: str
    column: int | None = None  # of a (rows, k) int64 array; None for a 1-D one
    previous: int | None = None
    broken: bool = False

    def feed(self, values: np.ndarray, report: VerifyReport, first_row: int) -> None:
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

    def finish(self, report: VerifyReport) -> None:
        if not self.broken and self.previous is not None and self.previous != self.end:
            self._fail(report, f"{self.name} end at {self.previous}, expected {self.end}")

    def _fail(self, report: VerifyReport, message: str) -> None:
        self.broken = True
        report.add(self.where, message)


@dataclass
class _Block:
    key: str
    layout: ArrayLayout
    rows: int  # rows of the array this block holds
    first_row: int
    checks: list[_OffsetCheck]
    size: int  # bytes of the stored object, from the listing


@dataclass
class _Findings:
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


def verify_dataset(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], Any] | None = None,
    on_total: Callable[[int], Any] | None = None,
    max_concurrency: int = DEFAULT_VERIFY_CONCURRENCY,
    retry: RetryPolicy | None = None,
) -> VerifyReport:
    """Scan the dataset at ``url``; see ``averify_dataset``."""
    return run_blocking(
        averify_dataset(
            url,
            storage_options,
            progress=progress,
            on_total=on_total,
            max_concurrency=max_concurrency,
            retry=retry,
        )
    )


async def averify_dataset(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    progress: Callable[[int], Any] | None = None,
    on_total: Callable[[int], Any] | None = None,
    max_concurrency: int = DEFAULT_VERIFY_CONCURRENCY,
    retry: RetryPolicy | None = None,
) -> VerifyReport:
    """Check every block, checksum and index invariant of the committed dataset at ``url``.

    Parameters
    ----------
    url, storage_options
        The dataset, as given to a storage.
    progress
        Called with the number of blocks just checked (e.g. a tqdm bar's ``update``).
    on_total
        Called once with the number of blocks the scan will check, before it starts.
    max_concurrency
        Blocks fetched at once (each is read whole, so this bounds memory).
    retry
        Retry policy for transient storage errors.

    Returns
    -------
    VerifyReport
        Damage is reported there; only an absent dataset raises (``DatasetNotFoundError``).
    """
    store = open_store(url, storage_options)
    reader = RangeReader(store, max_concurrency=max_concurrency, retry=retry)
    report = VerifyReport(url=str(url))
    try:
        with library_errors(f"scanning {url}"):  # listings: reads convert their own
            manifest = await _read_manifest(reader, report)
            if manifest is not None:
                await _scan(reader, manifest, report, progress, on_total, max_concurrency)
    finally:
        if isinstance(store, LocalStore):
            store.close_files()
        else:
            await store.aclose()
    return report


async def _read_manifest(reader: RangeReader, report: VerifyReport) -> Manifest | None:
    store = reader.store
    try:  # bounded by the metadata cap, as the readers' open is
        (raw,) = await reader.fetch([ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)])
    except MissingObjectError as error:
        raise DatasetNotFoundError(
            f"no dataset at {report.url}: {ROOT_KEY} not found (never committed?)"
        ) from error
    try:
        if len(raw) > MAX_ROOT_BYTES:
            raise MetadataError(f"larger than the {MAX_ROOT_BYTES}-byte metadata cap")
        manifest = parse_root(bytes(raw), store.describe(ROOT_KEY))
    except CorruptDataError as error:
        report.add(store.describe(ROOT_KEY), f"unreadable dataset metadata: {error}")
        return None
    if not manifest.complete:
        try:
            manifest = await RemoteExecutor(reader, verify=True).run(
                read_shard_table(manifest, store.describe)
            )
        except CorruptDataError as error:
            report.add(store.describe(manifest.table_key), f"unreadable shard table: {error}")
            return None
    report.kind, report.commit_id = manifest.kind, manifest.commit_id
    report.shards = len(manifest.shard_ids)
    return manifest


async def _scan(
    reader: RangeReader,
    manifest: Manifest,
    report: VerifyReport,
    progress: Callable[[int], Any] | None,
    on_total: Callable[[int], Any] | None,
    max_concurrency: int,
) -> None:
    store = reader.store
    blocks: list[_Block] = []
    checks: list[_OffsetCheck] = []
    for position, shard in enumerate(int(s) for s in manifest.shard_ids):
        for name in manifest.arrays:
            report.arrays += 1
            length = int(manifest.lengths[name][position])
            layout = manifest.stored_layout(name, length)
            key = manifest.array_key(shard, name)
            await _check_array_metadata(reader, key, layout, length, report)
            present = await _block_objects(store, key, layout, length, report)
            array_checks = _offset_checks(manifest, name, layout, position, store.describe(key))
            checks.extend(array_checks)
            if len(present) < layout.num_blocks(length):
                for check in array_checks:
                    check.broken = True  # values cannot be followed across a missing block
            for block, size in present:
                first = block * layout.block_rows
                rows = min(layout.block_rows, length - first)
                blocks.append(
                    _Block(layout.block_key(key, block), layout, rows, first, array_checks, size)
                )
    if on_total is not None:
        on_total(len(blocks))
    # Blocks of at most PIECE_BYTES are read whole, a window of them at once; larger ones
    # in pieces, one block at a time. Either way findings are taken in block order, so the
    # offset checks follow each array from its first block to its last.
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
    for check in checks:
        check.finish(report)
    await _check_index_arrays(reader, manifest, report)
    report.orphans = (await find_orphans(store, report.url, grace=0)).orphans


def _merge(report: VerifyReport, block: _Block, findings: _Findings) -> None:
    report.blocks += 1
    report.chunks += findings.chunks
    report.bytes += findings.bytes
    report.problems.extend(findings.problems)
    for first_row, values in findings.values:
        _feed(block, values, report, first_row)
    if not findings.intact:
        for check in block.checks:
            check.broken = True


def _feed(block: _Block, values: np.ndarray, report: VerifyReport, first_row: int) -> None:
    rows = values.reshape(-1, block.layout.row_nbytes // 8)
    for check in block.checks:
        column = rows[:, check.column] if check.column is not None else rows[:, 0]
        check.feed(column, report, first_row)


def _offset_checks(
    manifest: Manifest, name: str, layout: ArrayLayout, position: int, where: str
) -> list[_OffsetCheck]:
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
        checks.append(_OffsetCheck(label, end, starts_at_zero, where, column))
    return checks


#: Blocks up to this size are read with one request; larger ones in pieces of about this
#: size, so a scan's memory stays near ``max_concurrency * PIECE_BYTES`` whatever the
#: layout claims (inner chunks of up to 2 GiB, blocks of 2**40 rows).
PIECE_BYTES = 16 << 20


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


async def _scan_or_report(reader: RangeReader, block: _Block, *, feed: bool = False) -> _Findings:
    """``_scan_block``, with a block that cannot be read reported instead of raised."""
    try:
        return await _scan_block(reader, block, feed=feed)
    except (CorruptDataError, StorageError) as error:
        findings = _Findings(intact=False)
        findings.add(reader.store.describe(block.key), f"cannot be read: {error}")
        return findings


async def _scan_block(reader: RangeReader, block: _Block, *, feed: bool = False) -> _Findings:
    """Check one block object: its size, chunk index and every inner chunk's crc32c.

    Reads the object whole when it is small, else its index and then its chunks in pieces
    of about ``PIECE_BYTES``; every allocation is bounded by bytes actually read, never by
    what the layout claims. Every bad inner chunk is reported (consecutive ones as one
    run), not only the first. With ``feed`` the block's offset values go straight to its
    checks (blocks in pieces run alone, in order) instead of into the findings.
    """
    findings = _Findings()
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
    block: _Block, rows: np.ndarray, first_row: int, findings: _Findings, feed: bool
) -> None:
    if feed:
        report = VerifyReport(url="")  # problems of the check go to the findings
        _feed(block, rows.copy(), report, first_row)
        findings.problems.extend(report.problems)
    else:
        findings.values.append((first_row, rows.copy()))


def _check_index(
    layout: ArrayLayout,
    index: np.ndarray,
    present: int,
    heap_end: int,
    where: str,
    findings: _Findings,
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
    reader: RangeReader, key: str, offset: int, stored: int, findings: _Findings
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
    block: _Block,
    chunk: int,
    offset: int,
    findings: _Findings,
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


async def _get_json(reader: RangeReader, key: str) -> Any:
    """A small JSON document, read with the reader's retries (``FileNotFoundError`` if absent)."""
    try:
        (raw,) = await reader.fetch([ObjectRequest(key)])
    except MissingObjectError as error:
        raise FileNotFoundError(key) from error
    return json.loads(bytes(raw))


async def _check_array_metadata(
    reader: RangeReader, key: str, layout: ArrayLayout, length: int, report: VerifyReport
) -> None:
    """The array's ``zarr.json`` must give the manifest's length and the layout's chunks."""
    where = reader.store.describe(f"{key}/zarr.json")
    try:
        document = await _get_json(reader, f"{key}/zarr.json")
        shape = document["shape"]
        block_rows = document["chunk_grid"]["configuration"]["chunk_shape"][0]
        chunk_rows = document["codecs"][0]["configuration"]["chunk_shape"][0]
    except FileNotFoundError:
        report.add(where, "array metadata is missing")
        return
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
        report.add(where, f"array metadata is unreadable: {error!r}")
        return
    if not isinstance(shape, list) or not shape or shape[0] != length:
        report.add(where, f"shape {shape!r} disagrees with the manifest's length {length}")
    if (block_rows, chunk_rows) != (layout.block_rows, layout.chunk_rows):
        report.add(
            where,
            f"blocks of {block_rows!r} rows in chunks of {chunk_rows!r} disagree with the "
            f"manifest's {layout.block_rows} and {layout.chunk_rows}",
        )


async def _block_objects(
    store: ObjectStore, key: str, layout: ArrayLayout, length: int, report: VerifyReport
) -> list[tuple[int, int]]:
    """``(number, size)`` of the array's stored blocks, in order; missing and extra ones
    are reported.

    Works from the listing, never from ``range(number of blocks)``: the length comes from
    the manifest, and a damaged one may claim more blocks than any store could hold.
    """
    expected = layout.num_blocks(length)
    present: list[tuple[int, int]] = []
    for found in await store.list_details(f"{key}/c"):
        number = found.key[len(key) + 3 :].split("/", 1)[0]
        block = int(number) if number.isdigit() and len(number) < 20 else -1
        if 0 <= block < expected and found.key == layout.block_key(key, block):
            present.append((block, found.size))
        else:
            report.add(
                store.describe(found.key),
                f"object lies past the array's end ({length} rows in the manifest)",
            )
    present.sort()
    gaps = 0
    numbers = [block for block, _ in present]
    for first, stop in zip([-1, *numbers], [*numbers, expected], strict=True):
        if stop - first > 1 and gaps < MAX_REPORTED_GAPS:
            gaps += 1
            missing = layout.block_key(key, first + 1)
            more = f" and the {stop - first - 2} blocks after it" if stop - first > 2 else ""
            report.add(store.describe(missing), f"block object is missing{more}")
    return present


async def _check_shard_table(reader: RangeReader, manifest: Manifest, report: VerifyReport) -> None:
    """``index/shards`` (what readers of many shards open with) must equal the manifest."""
    where = reader.store.describe(manifest.table_key)
    count = manifest.num_shards
    array = StoredArray(manifest.table_key, manifest.table_layout, count, "shards")
    read = RowRead.whole(array, 0, count, _INT64)
    try:
        await RemoteExecutor(reader, verify=True).execute([read])
    except CorruptDataError as error:
        report.add(where, f"cannot be read: {error}")
        return
    if not np.array_equal(read.target.reshape(count, -1), manifest.table_rows()):
        report.add(where, "its rows differ from the shards the root lists")


async def _check_index_arrays(
    reader: RangeReader, manifest: Manifest, report: VerifyReport
) -> None:
    """The per-shard counts stored for Zarr-only readers must equal the manifest's."""
    store = reader.store
    if manifest.format_version >= 2:
        await _check_shard_table(reader, manifest, report)
    expected = {"shard_ids": manifest.shard_ids}
    expected.update({f"{name}_length": values for name, values in manifest.lengths.items()})
    prefix = f"{data_prefix(manifest.commit_id)}/index"
    for name, values in expected.items():
        key = f"{prefix}/{name}"
        where = store.describe(key)
        try:
            document = await _get_json(reader, f"{key}/zarr.json")
            chunk_rows = int(document["codecs"][0]["configuration"]["chunk_shape"][0])
            block_rows = int(document["chunk_grid"]["configuration"]["chunk_shape"][0])
            if not (1 <= chunk_rows <= 1 << 28 and 1 <= block_rows <= 1 << 40):
                raise MetadataError(f"chunks of {chunk_rows} rows in blocks of {block_rows}")
            layout = ArrayLayout(_INT64, (), chunk_rows, block_rows)
            length = int(document["shape"][0])
        except FileNotFoundError:
            report.add(where, "index array is missing")
            continue
        except (
            ValueError,
            KeyError,
            TypeError,
            IndexError,
            RecursionError,
            CorruptDataError,
        ) as error:
            report.add(where, f"index array metadata is unreadable: {error!r}")
            continue
        if length != len(values):
            report.add(where, f"holds {length} values, the manifest {len(values)}")
            continue
        read = RowRead.whole(StoredArray(key, layout, length, name), 0, length)
        try:
            await RemoteExecutor(reader, verify=True).execute([read])
        except CorruptDataError as error:
            report.add(where, f"cannot be read: {error}")
            continue
        stored = read.target.reshape(-1).view(_INT64)
        if not np.array_equal(stored, values):
            shown = f"{stored[:8].tolist()}{'...' if len(stored) > 8 else ''}"
            report.add(where, f"values {shown} differ from the manifest's")
