"""Writing temporal records: rows of each field group, kept inside blocks, and the index.

Every group's blocks share one grid, and a record that would straddle a grid line (and fits
in one block) starts at the line instead, after zero rows, so a window of it is one range
request per group. The commit gathers every shard's ``record_rows`` into
``index/record_rows`` (global record order), with the cumulative ``index/frame_starts`` and
``index/frame_histogram`` beside it (``storage.temporal.index``), streaming: its memory is
one index block, not the record count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream.errors import CorruptDataError
from rangestream.io.range_reader import RangeReader
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.checksums import CRC_NBYTES
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import Manifest, data_prefix
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.layout.zarr_json import array_document, dumps
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.temporal.index import RecordIndex
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

__all__ = [
    "DEFAULT_WINDOW_FRAMES",
    "FRAME_STARTS_ARRAY",
    "HISTOGRAM_ARRAY",
    "INDEX_ARRAY",
    "IndexLayouts",
    "TemporalShardEncoder",
    "chunk_frames_for",
    "group_layouts",
    "write_record_index",
]

_INT64 = np.dtype("<i8")
#: The whole-dataset record index written by the commit, relative to the data prefix:
#: every shard's ``record_rows`` (first and end row of each record) in shard order.
INDEX_ARRAY = "index/record_rows"
#: The global frame where every K-th record starts (K = ``record_rows`` chunk rows), then
#: the total: the cumulative index a sampler searches, K times smaller than the records.
FRAME_STARTS_ARRAY = "index/frame_starts"
#: ``(frames, records)`` per distinct frame count, ascending.
HISTOGRAM_ARRAY = "index/frame_histogram"


@dataclass(frozen=True)
class IndexLayouts:
    """Layouts of the three whole-dataset index arrays."""

    rows: ArrayLayout
    frame_starts: ArrayLayout
    histogram: ArrayLayout


class TemporalShardEncoder(ShardEncoder):
    """Encodes records into group rows, padding so that no record straddles a block.

    ``aligned_rows`` is the block grid every group's blocks share (each group's
    ``block_rows`` is a multiple of it). A record that would cross one of its boundaries
    but fits within ``aligned_rows`` frames starts at the next boundary instead, after
    zero rows in every group: a window of it is then one range per group, never two, as
    LitData's chunks never split a sample. Longer records are stored unpadded (they cross
    boundaries wherever they start). Padding costs on average ``frames / (2 *
    aligned_rows)`` of a record's rows.
    """

    def __init__(self, schema: TemporalSchema, aligned_rows: int) -> None:
        self.schema = schema
        self.first_array = schema.groups[0].array
        self.aligned_rows = aligned_rows

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        rows, frames = self.schema.encode(data)
        first = lengths[self.first_array]
        used = first % self.aligned_rows
        if used and frames <= self.aligned_rows and used + frames > self.aligned_rows:
            pad = self.aligned_rows - used
            for array, values in rows.items():
                padded = np.zeros((pad + frames, *values.shape[1:]), dtype=values.dtype)
                padded[pad:] = values
                rows[array] = padded
            first += pad
        rows[RECORD_ROWS] = np.asarray([[first, first + frames]], dtype=_INT64)
        return rows


#: The window length (frames) that inner chunks are sized for by default: the reference's
#: and the benchmark's windows are 64-96 frames.
DEFAULT_WINDOW_FRAMES = 64
#: Bound on a window's fetched bytes over its group payload, for windows of the length
#: chunks are sized for, wherever the window starts (see ``chunk_frames_for``).
MAX_OVERFETCH = 1.25


def fetched_ratio(row_nbytes: int, chunk_frames: int, window: int) -> float:
    """Most bytes a window of ``window`` frames fetches over its payload, among all starts:
    whole inner chunks of ``chunk_frames`` rows, each with its 4-byte checksum."""
    chunks = -(-(window - 1) // chunk_frames) + 1
    return chunks * (chunk_frames * row_nbytes + CRC_NBYTES) / (window * row_nbytes)


def chunk_frames_for(row_nbytes: int, window: int, most_frames: int, most_bytes: int) -> int:
    """Frames per inner chunk of a group whose rows are ``row_nbytes`` bytes: the largest
    power of two (at most ``most_frames`` and ``most_bytes`` of rows) whose windows of
    ``window`` frames fetch at most ``MAX_OVERFETCH`` times their payload wherever they
    start; where none does (rows of a few bytes, whose chunks' checksums alone exceed the
    bound), the one that fetches least. Larger chunks mean fewer checksums and chunk index
    entries (16 bytes each, stored per chunk), so the largest that meets the bound wins."""
    top = max(1, min(most_frames, most_bytes // row_nbytes))
    candidates = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    fitting = [c for c in candidates if fetched_ratio(row_nbytes, c, window) <= MAX_OVERFETCH]
    if fitting:
        return max(fitting)
    return min(reversed(candidates), key=lambda c: fetched_ratio(row_nbytes, c, window))


def group_layouts(
    schema: TemporalSchema,
    layout_of: Any,
    chunk_frames: int,
    chunk_bytes: int,
    window_frames: int = DEFAULT_WINDOW_FRAMES,
) -> dict[str, ArrayLayout]:
    """Each group's layout, all on one block grid so records can be kept inside blocks.

    Inner chunks hold a power of two of frames, chosen per group by its row size
    (``chunk_frames_for``: at most ``chunk_frames`` and ``chunk_bytes``), so the largest
    chunk row count is a multiple of every other. The shared grid is the smallest block
    (the widest group's), cut to a multiple of that; every group's block is the largest
    multiple of the grid within ``block_bytes`` (at least one), so each grid boundary that a
    record avoids is the only kind of block boundary in any group (see
    ``TemporalShardEncoder``).
    """
    natural = {}
    for group in schema.groups:
        frames = chunk_frames_for(group.row_nbytes, window_frames, chunk_frames, chunk_bytes)
        natural[group.array] = layout_of(
            group.row_dtype, group.row_shape, chunk_bytes=frames * group.row_nbytes
        )
    if not natural:
        return {}
    step = max(layout.chunk_rows for layout in natural.values())
    grid = min(layout.block_rows for layout in natural.values())
    grid = max(step, grid - grid % step)
    return {
        array: ArrayLayout(
            layout.dtype,
            layout.row_shape,
            layout.chunk_rows,
            grid * max(1, layout.block_rows // grid),
            layout.dense_chunks,
        )
        for array, layout in natural.items()
    }


class _IndexArrayWriter:
    """Rows appended in order, uploaded block by block: memory of one block, whatever N."""

    def __init__(self, store: ObjectStore, key: str, layout: ArrayLayout) -> None:
        self.store, self.key, self.layout = store, key, layout
        self.pending: list[np.ndarray] = []
        self.pending_rows = 0
        self.block = 0
        self.length = 0

    async def append(self, rows: np.ndarray) -> None:
        self.pending.append(rows)
        self.pending_rows += len(rows)
        self.length += len(rows)
        while self.pending_rows >= self.layout.block_rows:
            await self._flush(self.layout.block_rows)

    async def _flush(self, count: int) -> None:
        data = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        piece, rest = data[:count], data[count:]
        self.pending = [rest] if len(rest) else []
        self.pending_rows = len(rest)
        block = encode_block(self.layout, np.ascontiguousarray(piece).view(np.uint8))
        await self.store.put(self.layout.block_key(self.key, self.block), block)
        self.block += 1

    async def close(self, description: str, attributes: dict[str, Any] | None = None) -> None:
        if self.pending_rows:
            await self._flush(self.pending_rows)
        document = array_document(self.layout, self.length, {"description": description,
                                                             **(attributes or {})})  # fmt: skip
        await self.store.put(f"{self.key}/zarr.json", dumps(document))


async def write_record_index(
    store: ObjectStore,
    manifest: Manifest,
    schema: TemporalSchema,
    layouts: IndexLayouts,
    reader: RangeReader,
    where: str,
) -> None:
    """Write ``index/record_rows``, ``index/frame_starts`` and ``index/frame_histogram``.

    Every shard's ``record_rows`` is read in pieces of at most one index block, checked
    (``RecordIndex``'s checks, plus each shard's last record ending where its group arrays
    do), and appended in shard order, so the commit's memory is one block and the
    histogram, not the record count.
    """
    prefix = data_prefix(manifest.commit_id)
    shard_layout = manifest.arrays[RECORD_ROWS]
    rows_out = _IndexArrayWriter(store, f"{prefix}/{INDEX_ARRAY}", layouts.rows)
    starts_out = _IndexArrayWriter(store, f"{prefix}/{FRAME_STARTS_ARRAY}", layouts.frame_starts)
    stride = layouts.rows.chunk_rows
    executor = RemoteExecutor(reader, verify=True)
    index = RecordIndex(manifest, schema, None, None, None, where)  # checks the lengths
    histogram: dict[int, int] = {}
    frames_before = 0  # global frames before the next record
    record = 0  # global number of the next record
    piece_rows = max(stride, layouts.rows.block_rows - layouts.rows.block_rows % stride)
    for part, (shard, n) in enumerate(
        zip(manifest.shard_ids, manifest.lengths[RECORD_ROWS], strict=True)
    ):
        n = int(n)
        array = StoredArray(manifest.array_key(int(shard), RECORD_ROWS), shard_layout, n,
                            RECORD_ROWS)  # fmt: skip
        previous_end = 0
        for low in range(0, n, piece_rows):
            read = RowRead.whole(array, low, min(n, low + piece_rows))

            def fetch(read: RowRead = read) -> Any:
                yield [read]

            await executor.run(fetch())
            rows = read.target.reshape(-1).view(_INT64).reshape(-1, 2)
            index.check_rows(record, rows, previous_end)
            previous_end = int(rows[-1, 1])
            counts = rows[:, 1] - rows[:, 0]
            # frame_starts: the start of every stride-th global record
            ends = frames_before + np.cumsum(counts)
            firsts = ends - counts
            due = (np.arange(record, record + len(rows)) % stride) == 0
            if due.any():
                await starts_out.append(firsts[due])
            frames_before = int(ends[-1])
            for value, number in zip(*np.unique(counts, return_counts=True), strict=True):
                histogram[int(value)] = histogram.get(int(value), 0) + int(number)
            await rows_out.append(rows)
            record += len(rows)
        if n and previous_end != int(index.part_rows[part]):
            raise CorruptDataError(
                f"{where}: shard {int(shard)}'s records end at row {previous_end}, its group "
                f"arrays hold {int(index.part_rows[part])} rows"
            )
    await starts_out.append(np.asarray([frames_before], dtype=_INT64))
    await rows_out.close(
        "first and end row of each record in its shard's group arrays, shard by shard"
    )
    await starts_out.close(
        "global frame at which every rangestream_record_stride-th record starts; the total "
        "frames last",
        {"rangestream_record_stride": stride},
    )
    values = sorted(histogram)
    pairs = np.asarray([[value, histogram[value]] for value in values], dtype=_INT64)
    histogram_out = _IndexArrayWriter(store, f"{prefix}/{HISTOGRAM_ARRAY}", layouts.histogram)
    if len(pairs):
        await histogram_out.append(pairs.reshape(-1, 2))
    await histogram_out.close("every distinct frame count and the number of records with it")
