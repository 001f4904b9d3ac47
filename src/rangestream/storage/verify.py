"""Scanning a committed dataset for damage: every block, chunk index, checksum and index.

Reads check only what they touch, so damage in data nobody has read yet stays silent. A
scan reads every block of the committed version whole and checks, per block: that the
object exists and has the size its array's length implies, its chunk index (crc32c and
entries), and the crc32c of every inner chunk. Per array: that the Zarr array metadata
agrees with the manifest and that no block objects lie past the array's end. Across
arrays: ``record_ends`` never decrease and end at the stream's length;
``payload_offsets`` start at 0, never decrease and end at the heap's length; the two
columns of ``runs`` (element ends, payload ends) start at 0, never decrease and end at the
stream's and the heap's lengths; the end rows of temporal ``record_rows`` never decrease
and end at the shard's group length. Finally, the index arrays for Zarr-only readers must
agree with the manifest.

Problems are collected, not raised, so one scan reports all the damage it finds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rangestream.errors import (
    CorruptDataError,
    DatasetNotFoundError,
    MissingObjectError,
)
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ObjectRequest
from rangestream.io.retry import RetryPolicy
from rangestream.io.store import ObjectStore, open_store
from rangestream.layout.block import MISSING, ArrayLayout, parse_block_index
from rangestream.layout.checksums import CRC32C_RESIDUE, crc32c
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import ROOT_KEY, Manifest, data_prefix, parse_root
from rangestream.layout.pieces import RowRead, StoredArray

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
        manifest = await _read_manifest(reader, report)
        if manifest is not None:
            await _scan(reader, manifest, report, progress, on_total, max_concurrency)
    finally:
        await store.aclose()
    return report


async def _read_manifest(reader: RangeReader, report: VerifyReport) -> Manifest | None:
    store = reader.store
    try:
        (raw,) = await reader.fetch([ObjectRequest(ROOT_KEY)])
    except MissingObjectError as error:
        raise DatasetNotFoundError(
            f"no dataset at {report.url}: {ROOT_KEY} not found (never committed?)"
        ) from error
    try:
        manifest = parse_root(bytes(raw), store.describe(ROOT_KEY))
    except CorruptDataError as error:
        report.add(store.describe(ROOT_KEY), f"unreadable dataset metadata: {error}")
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
        for name, layout in manifest.arrays.items():
            report.arrays += 1
            length = int(manifest.lengths[name][position])
            key = manifest.array_key(shard, name)
            await _check_array_metadata(reader, key, layout, length, report)
            present = await _block_objects(store, key, layout, length, report)
            array_checks = _offset_checks(manifest, name, layout, position, store.describe(key))
            checks.extend(array_checks)
            if len(present) < layout.num_blocks(length):
                for check in array_checks:
                    check.broken = True  # values cannot be followed across a missing block
            for block in present:
                first = block * layout.block_rows
                rows = min(layout.block_rows, length - first)
                blocks.append(
                    _Block(layout.block_key(key, block), layout, rows, first, array_checks)
                )
    if on_total is not None:
        on_total(len(blocks))
    # Blocks are fetched a window at a time but checked in order, so the offset checks
    # can follow each array from its first block to its last.
    for start in range(0, len(blocks), max_concurrency):
        window = blocks[start : start + max_concurrency]
        datas = await asyncio.gather(
            *(_fetch_block(reader, block) for block in window), return_exceptions=True
        )
        for block, data in zip(window, datas, strict=True):
            if isinstance(data, BaseException):
                if not isinstance(data, Exception):
                    raise data
                report.add(store.describe(block.key), f"cannot be read: {data}")
                for check in block.checks:
                    check.broken = True
            else:
                _check_block(store, block, data, report)
        if progress is not None:
            progress(len(window))
    for check in checks:
        check.finish(report)
    await _check_index_arrays(reader, manifest, report)


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


async def _fetch_block(reader: RangeReader, block: _Block) -> bytes:
    (data,) = await reader.fetch([ObjectRequest(block.key)], max_concurrency=1)
    return bytes(data)


def _check_block(store: ObjectStore, block: _Block, data: bytes, report: VerifyReport) -> None:
    """Check one whole block object; feed its rows to the array's offset check."""
    layout, where = block.layout, store.describe(block.key)
    report.blocks += 1
    report.bytes += len(data)
    stored = layout.stored_chunk_nbytes
    present = -(-block.rows // layout.chunk_rows)
    size = present * stored + layout.index_nbytes
    if layout.dense_chunks and len(data) != size:
        report.add(
            where,
            f"object is {len(data)} bytes; {block.rows} rows in {present} chunks of {stored} "
            f"bytes and the index make {size} (truncated, or the manifest's length disagrees)",
        )
        return
    if len(data) < layout.index_nbytes:
        report.add(where, f"{len(data)} bytes cannot hold the {layout.index_nbytes}-byte index")
        return
    heap_end = len(data) - layout.index_nbytes
    try:
        index = parse_block_index(layout, data[heap_end:], "chunk index")
    except CorruptDataError as error:
        report.add(f"{where} bytes [{heap_end}, {len(data)})", str(error))
        return
    offsets, sizes = index[:, 0], index[:, 1]
    absent = offsets[present:] != MISSING
    if absent.any():
        extra = present + int(np.flatnonzero(absent)[0])
        report.add(where, f"chunk index lists inner chunk {extra}, past the array's end")
        return
    # the rows are kept only for an offsets array, whose values are checked across blocks
    rows = np.empty((present if block.checks else 0, layout.chunk_nbytes), dtype=np.uint8)
    for chunk in range(present):
        offset, size = int(offsets[chunk]), int(sizes[chunk])
        if offsets[chunk] == MISSING:
            report.add(where, f"inner chunk {chunk} is missing from the chunk index")
            return
        expected_offset = chunk * stored if layout.dense_chunks else offset
        if size != stored or offset != expected_offset or offset + size > heap_end:
            report.add(
                where,
                f"chunk index entry {chunk} is (offset {offset}, {size} bytes), expected "
                f"({expected_offset}, {stored}) within the first {heap_end} bytes",
            )
            return
        body = data[offset : offset + size]
        report.chunks += 1
        if crc32c(body) != CRC32C_RESIDUE:
            report.add(
                f"{where} bytes [{offset}, {offset + size})",
                f"checksum mismatch in inner chunk {chunk}",
            )
            for check in block.checks:
                check.broken = True
            return
        if block.checks:
            rows[chunk] = np.frombuffer(body, dtype=np.uint8, count=layout.chunk_nbytes)
    if block.checks:
        width = layout.row_nbytes // 8
        values = rows.reshape(-1)[: block.rows * layout.row_nbytes].view(_INT64)
        values = values.reshape(-1, width)
        for check in block.checks:
            column = values[:, check.column] if check.column is not None else values[:, 0]
            check.feed(column, report, block.first_row)


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
) -> list[int]:
    """Numbers of the array's stored blocks, in order; missing and extra ones are reported.

    Works from the listing, never from ``range(number of blocks)``: the length comes from
    the manifest, and a damaged one may claim more blocks than any store could hold.
    """
    expected = layout.num_blocks(length)
    present: list[int] = []
    for found in await store.list(f"{key}/c"):
        number = found[len(key) + 3 :].split("/", 1)[0]
        block = int(number) if number.isdigit() and len(number) < 20 else -1
        if 0 <= block < expected and found == layout.block_key(key, block):
            present.append(block)
        else:
            report.add(
                store.describe(found),
                f"object lies past the array's end ({length} rows in the manifest)",
            )
    present.sort()
    gaps = 0
    for first, stop in zip([-1, *present], [*present, expected], strict=True):
        if stop - first > 1 and gaps < MAX_REPORTED_GAPS:
            gaps += 1
            missing = layout.block_key(key, first + 1)
            more = f" and the {stop - first - 2} blocks after it" if stop - first > 2 else ""
            report.add(store.describe(missing), f"block object is missing{more}")
    return present


async def _check_index_arrays(
    reader: RangeReader, manifest: Manifest, report: VerifyReport
) -> None:
    """The per-shard counts stored for Zarr-only readers must equal the manifest's."""
    store = reader.store
    expected = {"shard_ids": manifest.shard_ids}
    expected.update({f"{name}_length": values for name, values in manifest.lengths.items()})
    prefix = f"{data_prefix(manifest.commit_id)}/index"
    for name, values in expected.items():
        key = f"{prefix}/{name}"
        where = store.describe(key)
        try:
            document = await _get_json(reader, f"{key}/zarr.json")
            layout = ArrayLayout(
                _INT64,
                (),
                int(document["codecs"][0]["configuration"]["chunk_shape"][0]),
                int(document["chunk_grid"]["configuration"]["chunk_shape"][0]),
            )
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
