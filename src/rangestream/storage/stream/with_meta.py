"""``StreamWithMetaStorage``: a stream whose runs of elements reference variable-size payloads.

Per shard, five Zarr arrays:

``stream``
    The elements (``stream_dtype``), as in ``StreamStorage``.
``record_ends``
    int64, the cumulative element count at the end of each appended record.
``runs``
    int64 rows ``(element_end, payload_end)``, one per run plus a leading ``(0, 0)``:
    run ``j`` (from 1) covers elements ``[runs[j-1, 0], runs[j, 0])`` and its payload is
    heap bytes ``[runs[j-1, 1], runs[j, 1])``. One row per run, never one per element.
``payload_heap``
    uint8, the payloads of the runs back to back, in run order.
``run_index``
    int64 rows, a copy of every ``R``-th row of ``runs`` where ``R`` is the number of rows
    in one inner chunk of ``runs``: the coarse index that says which inner chunk of
    ``runs`` holds a given element's run. It is 1/R of ``runs`` (1/256 by default).

A read of a window costs, per shard it touches:

1. once per shard and reader: ``run_index`` (one request, one round; then cached);
2. one round: the ``stream`` range, plus the inner chunks of ``runs`` covering the window
   unless they are cached (one request), plus, when they are cached, the heap bytes of
   the runs the window references: adjacent in the heap, so one request fetching them
   and at most the partly used inner chunk at each end;
3. only if ``runs`` chunks were read in round 2: one more round for those heap bytes.

So a warm window (its shard's coarse index and its ``runs`` chunks cached, as for
sequential windows) is two requests in one round; a window whose ``runs`` chunk is not
cached is three requests in two rounds.

Reads of several windows (``read_many``) share each round, coalesced per object.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, SchemaMismatchError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.caches import ArrayCache
from rangestream.layout.executors import Program
from rangestream.layout.manifest import Manifest
from rangestream.layout.pieces import RowRead
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.stream.storage import (
    AsyncStreamStorageReader,
    StreamStorage,
    StreamStorageReader,
)
from rangestream.storage.stream.windows import OpenedStream, no_window
from rangestream.storage.stream.with_meta_records import MetaShardEncoder
from rangestream.types import StreamWithMetaStorageFormat

_INT64 = np.dtype("<i8")
_UINT8 = np.dtype("u1")
_ARRAYS = frozenset({"stream", "record_ends", "runs", "payload_heap", "run_index"})
_RUN_COLUMNS = ["element_end", "payload_end"]

#: A ``runs`` inner chunk holds this many times the bytes of a ``stream`` inner chunk: the
#: coarse ``run_index`` has one row per ``runs`` chunk, so larger chunks keep it small,
#: while a window still reads at most one partly used ``runs`` chunk at each end.
RUN_CHUNK_FACTOR = 4
#: Default bytes of ``runs`` inner chunks a reader keeps (sequential windows reuse them).
DEFAULT_RUN_CACHE_BYTES = 4 * 1024 * 1024
#: Default bytes of per-shard coarse ``run_index`` arrays a reader keeps.
DEFAULT_RUN_INDEX_CACHE_BYTES = 64 * 1024 * 1024


class _Segment:
    """The part of one read inside one shard, and what the read learns about it."""

    __slots__ = (
        "ends", "first_chunk", "heap", "last_chunk", "offsets", "part", "shard", "start", "stop",
    )  # fmt: skip

    def __init__(self, part: int, shard: int, start: int, stop: int) -> None:
        self.part = part
        self.shard = shard
        self.start = start
        self.stop = stop
        self.first_chunk = 0
        self.last_chunk = 0
        #: Element ends and heap ends of the runs rows bounding the segment (from the row
        #: before its first run to the row of its last run), as Python ints: a window
        #: touches few runs, and list arithmetic beats numpy calls at that size.
        self.ends: list[int] = []
        self.offsets: list[int] = []
        #: The heap bytes of the segment's runs, once read (empty if they have none).
        self.heap = b""


class OpenedStreamWithMeta(OpenedStream):
    """Read programs of a stream-with-metadata storage; shared by its sync and async readers.

    Holds the per-reader caches: each touched shard's coarse ``run_index`` and recently
    used inner chunks of ``runs``.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        storage: Any = self.storage
        self.run_chunk_rows = self.manifest.arrays["runs"].chunk_rows
        self.run_indexes = ArrayCache(storage.run_index_cache_bytes)
        self.run_chunks = ArrayCache(storage.run_cache_bytes)

    def window_reader(self, length: int, stride: int) -> Callable[[int], Any]:
        return no_window  # a window needs its payloads too: always the program

    def _where(self, shard: int, name: str) -> str:
        return self.describe(self.manifest.array_key(shard, name))

    def _rows(self, shard: int, name: str, start: int, stop: int) -> RowRead:
        return RowRead.whole(self.array(shard, name), start, stop)

    def _check_run_index(self, shard: int, index: np.ndarray) -> np.ndarray:
        runs_length = self.shard_length("runs", shard)
        expected = -(-runs_length // self.run_chunk_rows)
        elements = self.shard_length("stream", shard)
        heap = self.shard_length("payload_heap", shard)
        if (
            len(index) != expected
            or not len(index)
            or index[0, 0] != 0
            or index[0, 1] != 0
            or (np.diff(index[:, 0]) <= 0).any()
            or (np.diff(index[:, 1]) < 0).any()
            or index[-1, 0] > elements
            or index[-1, 1] > heap
        ):
            raise CorruptDataError(
                f"{self._where(shard, 'run_index')}: the coarse run index is inconsistent "
                f"with {runs_length} runs rows, {elements} elements and {heap} heap bytes"
            )
        return index

    def _rows_of_runs(
        self,
        segment: _Segment,
        indexes: dict[int, np.ndarray],
        chunks: dict[tuple[int, int], np.ndarray],
    ) -> np.ndarray:
        """Rows of ``runs`` from the segment's first chunk through its run end sentinel."""
        index = indexes[segment.shard]
        parts = [
            chunks[segment.shard, c] for c in range(segment.first_chunk, segment.last_chunk + 1)
        ]
        if segment.last_chunk + 1 < len(index):
            parts.append(index[segment.last_chunk + 1 : segment.last_chunk + 2])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def read_many_parts(
        self, requests: Sequence[tuple[int, int]]
    ) -> Program[list[tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]]]:
        """``(stream, document_shard, document_index, document_data)`` of several reads.

        Each round is shared by all reads: the coarse run indexes of shards this reader has
        not seen yet; then the stream ranges, the ``runs`` chunks not cached and the heap
        bytes of the segments whose runs are all cached; then, if ``runs`` chunks were
        read, the heap bytes of the remaining segments. A warm window is one round.
        """
        stream_reads, windows = self.window_reads(requests)
        plans = [self.segments(*self.check_range(start, length)) for start, length in requests]
        segments = [
            _Segment(part, self.shard_ids[part], low, high)
            for plan in plans
            for part, low, high in plan
        ]
        shards = sorted({segment.shard for segment in segments})

        # Round 0: coarse run indexes, once per shard and reader.
        indexes: dict[int, np.ndarray] = {}
        missing_shards = []
        for shard in shards:
            cached = self.run_indexes.get(shard)
            if cached is None:
                missing_shards.append(shard)
            else:
                indexes[shard] = cached
        if missing_shards:
            reads = [
                self._rows(s, "run_index", 0, self.shard_length("run_index", s))
                for s in missing_shards
            ]
            yield reads
            for shard, read in zip(missing_shards, reads, strict=True):
                rows = read.target.reshape(-1).view(_INT64).reshape(-1, 2)
                index = self._check_run_index(shard, rows)
                indexes[shard] = index
                self.run_indexes.put(shard, index)

        # Round 1: stream ranges and the runs chunks not cached; segments whose runs chunks
        # are all cached know their heap range already and fetch it in this round too.
        chunks: dict[tuple[int, int], np.ndarray] = {}
        wanted: dict[int, set[int]] = {}
        known: list[_Segment] = []
        for segment in segments:
            starts = indexes[segment.shard][:, 0]
            segment.first_chunk = int(starts.searchsorted(segment.start, side="right")) - 1
            segment.last_chunk = int(starts.searchsorted(segment.stop, side="left")) - 1
            complete = True
            for chunk in range(segment.first_chunk, segment.last_chunk + 1):
                cached = self.run_chunks.get((segment.shard, chunk))
                if cached is None:
                    wanted.setdefault(segment.shard, set()).add(chunk)
                    complete = False
                else:
                    chunks[segment.shard, chunk] = cached
            if complete:
                self._bound_runs(segment, self._rows_of_runs(segment, indexes, chunks))
                known.append(segment)
        run_ranges: list[tuple[int, int, int]] = []  # (shard, first chunk, last chunk)
        for shard, numbers in sorted(wanted.items()):
            ordered = sorted(numbers)
            first = ordered[0]
            for previous, chunk in zip(ordered, [*ordered[1:], None], strict=True):
                if chunk != previous + 1:  # a gap (or the end) closes a span of chunks
                    run_ranges.append((shard, first, previous))
                    first = chunk
        rows_per_chunk = self.run_chunk_rows
        early_heaps = [s for s in known if s.offsets[-1] > s.offsets[0]]
        run_reads = [
            self._rows(
                shard,
                "runs",
                first * rows_per_chunk,
                min((last + 1) * rows_per_chunk, self.shard_length("runs", shard)),
            )
            for shard, first, last in run_ranges
        ]
        heap_reads = [self._heap_read(s) for s in early_heaps]
        step = [*stream_reads, *run_reads, *heap_reads]
        if step:
            yield step
        for segment, read in zip(early_heaps, heap_reads, strict=True):
            segment.heap = read.target.tobytes()
        for (shard, first, _last), read in zip(run_ranges, run_reads, strict=True):
            rows = read.target.reshape(-1).view(_INT64).reshape(-1, 2)
            for offset in range(0, len(rows), rows_per_chunk):
                chunk_rows = rows[offset : offset + rows_per_chunk]
                chunks[shard, first + offset // rows_per_chunk] = chunk_rows
                self.run_chunks.put((shard, first + offset // rows_per_chunk), chunk_rows)

        # Round 2: the heap bytes of the other segments' runs, contiguous in the heap.
        if run_ranges:
            late = [s for s in segments if not s.offsets]
            for segment in late:
                self._bound_runs(segment, self._rows_of_runs(segment, indexes, chunks))
            late_heaps = [s for s in late if s.offsets[-1] > s.offsets[0]]
            late_reads = [self._heap_read(s) for s in late_heaps]
            if late_reads:
                yield late_reads
            for segment, read in zip(late_heaps, late_reads, strict=True):
                segment.heap = read.target.tobytes()

        results = []
        position = 0
        for plan, (window, _lengths, _shards) in zip(plans, windows, strict=True):
            mine = segments[position : position + len(plan)]
            position += len(plan)
            results.append(self._assemble(mine, window.array()))
        return results

    def _heap_read(self, segment: _Segment) -> RowRead:
        return self._rows(segment.shard, "payload_heap", segment.offsets[0], segment.offsets[-1])

    def _bound_runs(self, segment: _Segment, rows: np.ndarray) -> None:
        """Check and keep the runs rows from the segment's start through its stop."""
        ends = rows[:, 0]
        low = int(ends.searchsorted(segment.start, side="right")) - 1
        high = int(ends.searchsorted(segment.stop, side="left"))
        span = rows[max(low, 0) : high + 1].T.tolist()
        element_ends, heap_ends = span if span else ([], [])
        heap = self.shard_length("payload_heap", segment.shard)
        if (
            low < 0
            or high >= len(rows)
            or any(a >= b for a, b in itertools.pairwise(element_ends))
            or any(a > b for a, b in itertools.pairwise(heap_ends))
            or heap_ends[0] < 0
            or heap_ends[-1] > heap
        ):
            raise CorruptDataError(
                f"{self._where(segment.shard, 'runs')}: the runs around elements "
                f"[{segment.start}, {segment.stop}) are inconsistent (not increasing, or "
                f"outside the heap of {heap} bytes)"
            )
        segment.ends = element_ends
        segment.offsets = heap_ends

    def _assemble(
        self, segments: list[_Segment], stream: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
        counts: list[int] = []  # elements of each referenced run inside the window
        shards: list[int] = []  # shard of each referenced run
        document_data: list[bytes] = []
        for segment in segments:
            ends = segment.ends
            clipped = [segment.start, *ends[1:-1], segment.stop]  # inner ends lie inside
            counts.extend(b - a for a, b in itertools.pairwise(clipped))
            shards.extend([segment.shard] * (len(ends) - 1))
            heap = segment.heap
            base = segment.offsets[0]
            document_data.extend(
                heap[a - base : b - base] for a, b in itertools.pairwise(segment.offsets)
            )
        document_index = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        return stream, np.asarray(shards, dtype=np.int64), document_index, document_data

    def read_many(self, requests: Sequence[tuple[int, int]]) -> Program[list[Any]]:
        results = yield from self.read_many_parts(requests)
        return [self.format.unpack(*parts) for parts in results]

    def read(self, global_index: int, length: int) -> Program[Any]:
        (parts,) = yield from self.read_many_parts([(global_index, length)])
        return self.format.unpack(*parts)


class StreamWithMetaStorage(StreamStorage):
    """A stream of fixed-size elements whose runs each carry a variable-size payload.

    Use it when tokens need annotations a fixed-size field cannot hold (concept lists per
    paragraph, provenance, source URLs). The stream stays contiguous, each run of equal
    consecutive keys stores its payload once, and every read returns the window together
    with exactly the payloads its elements reference, also when it starts or ends inside
    a run or crosses record and shard boundaries. ``StreamDataset(storage,
    sequence_length)`` reads windows of it like those of a ``StreamStorage``.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``StreamWithMetaStorageFormat``: ``stream_dtype``, ``size``, ``pack`` (yields one
        ``(key, payload | None)`` per element, returns the stream array) and ``unpack``.
        Reopen a dataset with a format of the same ``stream_dtype``, or without one if
        the format describes itself (``schema()``, and a factory registered with
        ``rangestream.formats.register_format``).
    run_cache_bytes
        Bytes of ``runs`` inner chunks each reader keeps, so windows near recent ones need
        no request for their runs.
    run_index_cache_bytes
        Bytes of per-shard coarse run indexes each reader keeps; each is read on a shard's
        first touch (1/256 of the shard's runs with the default chunk size).
    **options
        See ``Storage`` (storage_options, chunk and block sizes, concurrency, retries).
    """

    kind = "stream_with_meta"
    opened_class = OpenedStreamWithMeta
    format_methods = ("size", "pack", "unpack")

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_format: StreamWithMetaStorageFormat[Any, Any, Any] | None = None,
        *,
        run_cache_bytes: int = DEFAULT_RUN_CACHE_BYTES,
        run_index_cache_bytes: int = DEFAULT_RUN_INDEX_CACHE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, storage_format, **options)  # type: ignore[arg-type]
        integer(run_cache_bytes, "run_cache_bytes", minimum=0)
        integer(run_index_cache_bytes, "run_index_cache_bytes", minimum=0)
        self.run_cache_bytes = run_cache_bytes
        self.run_index_cache_bytes = run_index_cache_bytes

    def array_layouts(self) -> dict[str, ArrayLayout]:
        run_chunk_bytes = RUN_CHUNK_FACTOR * self.chunk_bytes
        return {
            "stream": self._layout(self._writing_format().stream_dtype),
            "record_ends": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 8192)),
            "runs": self._layout(_INT64, (2,), chunk_bytes=run_chunk_bytes),
            "payload_heap": self._layout(_UINT8),
            "run_index": self._layout(_INT64, (2,), chunk_bytes=run_chunk_bytes),
        }

    def array_attributes(self, name: str) -> dict[str, Any]:
        if name == "runs":
            return {"rangestream_columns": _RUN_COLUMNS}
        if name == "run_index":
            stride = self.array_layouts()["runs"].chunk_rows
            return {"rangestream_columns": _RUN_COLUMNS, "rangestream_runs_row_stride": stride}
        return {}

    def check_schema(self, manifest: Manifest) -> None:
        if set(manifest.arrays) != _ARRAYS:
            raise SchemaMismatchError(
                f"{self.url} does not hold a stream-with-metadata dataset's arrays"
            )
        for name in ("runs", "run_index"):
            layout = manifest.arrays[name]
            if layout.dtype != _INT64 or layout.row_shape != (2,):
                raise SchemaMismatchError(
                    f"{self.url}: array {name!r} must hold int64 pairs, found {layout.dtype} "
                    f"rows of shape {layout.row_shape}"
                )
        if manifest.arrays["payload_heap"].dtype != _UINT8:
            raise SchemaMismatchError(f"{self.url}: payload_heap must be uint8")
        self.reading_format(manifest)

    def shard_encoder(self) -> ShardEncoder:
        return MetaShardEncoder(self._writing_format(), self.array_layouts()["runs"].chunk_rows)


class StreamWithMetaStorageReader(StreamStorageReader):
    """Sync reads of a stream-with-metadata storage: ``read``, ``read_many``, lengths, stats.

    ``read(global_index, length)`` returns the format's ``unpack`` of the window, its
    shards and the payloads it references.
    """


class AsyncStreamWithMetaStorageReader(AsyncStreamStorageReader):
    """Async reads of a stream-with-metadata storage, with the sync reader's API awaited."""


StreamWithMetaStorage.sync_reader_class = StreamWithMetaStorageReader
StreamWithMetaStorage.async_reader_class = AsyncStreamWithMetaStorageReader
