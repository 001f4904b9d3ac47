"""``TemporalArrayStorage``: records of named arrays sharing a frame axis, read by window.

Per shard: one array per field group (``storage.temporal.schema``: a lone field keeps its
dtype and shape, the fields of a listed group are interleaved per frame) and
``record_rows``, the first and end row of each record in those arrays
(``storage.temporal.write``). Opening reads the root document only, whatever the record
count; a window costs one range request per selected group (one more where a record longer
than a block crosses a boundary), and one more before those when its record's index entry
is not cached yet (``storage.temporal.index``: the record index is read by range).

The storage follows the lifecycle of every kind (``storage.core.opening``): its readers are
faces of the version opened in their process. ``read_window`` and ``aread_window`` can also
be called on the storage itself, in DataLoader workers too: they use the storage's own
opened version of the process, shared by any number of threads and event loops.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rangestream.arguments import positive_integer
from rangestream.errors import SchemaMismatchError
from rangestream.io.range_reader import RangeReader
from rangestream.io.stats import IOStats
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import Program
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.storage.core.base import Storage
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.core.options import LayoutOptions
from rangestream.storage.temporal.frame_counts import FrameCounts
from rangestream.storage.temporal.index import DEFAULT_INDEX_CACHE_BYTES, RecordIndex
from rangestream.storage.temporal.read import OpenedTemporal
from rangestream.storage.temporal.readers import (
    AsyncTemporalReader,
    TemporalReader,
    aread_window,
    concurrency,
)
from rangestream.storage.temporal.schema import (
    RECORD_ROWS,
    TemporalSchema,
    normalize_field_groups,
)
from rangestream.storage.temporal.stored import open_record_index, stored_schema
from rangestream.storage.temporal.write import (
    DEFAULT_WINDOW_FRAMES,
    IndexLayouts,
    TemporalShardEncoder,
    group_layouts,
    write_record_index,
)

__all__ = [
    "DEFAULT_CHUNK_FRAMES",
    "DEFAULT_TEMPORAL_BLOCK_BYTES",
    "DEFAULT_TEMPORAL_CHUNK_BYTES",
    "TemporalArrayStorage",
]

_INT64 = np.dtype("<i8")
#: Target bytes of one inner chunk of a group array: the unit of checksums and of the
#: over-fetch at each end of a window.
DEFAULT_TEMPORAL_CHUNK_BYTES = 8 * 1024
#: Bound on one block of a group array. Larger than other storages' 4 MiB because a record
#: that would cross a block boundary starts at the next one instead, and the padding this
#: costs shrinks with the block (docs/design.md). Reads never fetch whole blocks.
DEFAULT_TEMPORAL_BLOCK_BYTES = 16 * 1024 * 1024
#: Most frames in one inner chunk, so a narrow group (a few bytes per frame) is not
#: over-fetched by hundreds of frames around a short window.
DEFAULT_CHUNK_FRAMES = 32
_INDEX_CHUNK_BYTES = 8 * 1024


class TemporalArrayStorage(Storage):
    """Records of named arrays with a common frame axis, read as windows of frames.

    A record is a flat mapping of field name to a numpy array (or torch tensor) shaped
    ``(frames, ...)``; names, dtypes and trailing shapes are fixed by the first record
    written, frame counts vary. Reading a window of some fields costs one range request per
    field group involved, so training can sample short windows out of long recordings
    straight from object storage.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    field_groups
        Lists of fields stored interleaved per frame, e.g. ``[["clock", "valid", "pose"]]``:
        a window of a group is one contiguous range, so fields read together should be
        grouped. Selecting one field of a group still fetches the whole group's rows for the
        window (over-fetch). Unlisted fields are stored alone with their own dtype and shape.
        Readers discover the grouping from the store; if given when reading, it must match.
    chunk_frames
        Most frames per inner chunk (default 32). Inner chunks hold a power of two of
        frames, chosen per field group by its row size so that a window of
        ``window_frames`` frames fetches at most 25% more than its payload wherever it
        starts (whole inner chunks and their checksums are the price of checking partial
        reads); rows of a few bytes cannot meet that bound (their chunks' 4-byte
        checksums alone exceed it) and get the chunk size that fetches least. Group small
        fields together (``field_groups``) to read them without that cost.
    window_frames
        The window length (frames) that inner chunks are sized for (default 64).
    index_cache_bytes
        Bytes of record index entries a process keeps (default 4 MiB, 24 bytes per
        record); larger datasets read the entries of the records they touch by range.
    **options
        See ``Storage``. ``chunk_bytes`` (default 8 KiB) is the target size of an inner
        chunk of a group array; ``block_bytes`` (default 16 MiB) bounds one stored block:
        a record that would cross a block boundary starts at the next block instead (zero
        rows in between), so its windows are one request per group.
    """

    kind = "temporal"
    opened_class = OpenedTemporal
    default_layout = LayoutOptions(DEFAULT_TEMPORAL_CHUNK_BYTES, DEFAULT_TEMPORAL_BLOCK_BYTES)

    def __init__(
        self,
        url: str | os.PathLike[str],
        field_groups: Sequence[Sequence[str]] | None = None,
        *,
        chunk_frames: int = DEFAULT_CHUNK_FRAMES,
        window_frames: int = DEFAULT_WINDOW_FRAMES,
        index_cache_bytes: int = DEFAULT_INDEX_CACHE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.field_groups = normalize_field_groups(field_groups)
        self.chunk_frames = positive_integer(chunk_frames, "chunk_frames")
        self.window_frames = positive_integer(window_frames, "window_frames")
        self.index_cache_bytes = positive_integer(index_cache_bytes, "index_cache_bytes")
        self._bound: TemporalSchema | None = None  # set on writer copies by the first record
        self._default_reader: TemporalReader | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_default_reader"] = None  # made again, lazily, in the new process
        return state

    # -- layout and schema (writing) ------------------------------------------------------
    def _index_layouts(self) -> IndexLayouts:
        def layout(row_shape: tuple[int, ...]) -> ArrayLayout:
            return ArrayLayout.for_sizes(
                _INT64,
                row_shape,
                chunk_bytes=_INDEX_CHUNK_BYTES,
                block_bytes=max(self.block_bytes, _INDEX_CHUNK_BYTES),
                dense_chunks=self.dense_chunks,
            )

        return IndexLayouts(layout((2,)), layout(()), layout((2,)))

    def _group_layouts(self, schema: TemporalSchema) -> dict[str, ArrayLayout]:
        return group_layouts(
            schema, self._layout, self.chunk_frames, self.chunk_bytes, self.window_frames
        )

    def array_layouts(self) -> dict[str, ArrayLayout]:
        layouts = {RECORD_ROWS: self._layout(_INT64, (2,), chunk_bytes=max(self.chunk_bytes, 8192))}
        if self._bound is not None:
            layouts.update(self._group_layouts(self._bound))
        return layouts

    def array_attributes(self, name: str) -> dict[str, Any]:
        if self._bound is None or name == RECORD_ROWS:
            return {}
        for group in self._bound.groups:
            if group.array == name:
                return {"rangestream_fields": [spec.name for spec in group.fields]}
        return {}

    def kind_schema(self) -> dict[str, Any]:
        schema = self._bound if self._bound is not None else TemporalSchema([], [])
        layouts = self._index_layouts()
        return {
            **schema.to_json(),
            "index": layouts.rows.to_json(),
            "frame_starts": layouts.frame_starts.to_json(),
            "frame_histogram": layouts.histogram.to_json(),
        }

    def bind_record(self, data: Any) -> TemporalArrayStorage:
        if self._bound is not None:
            return self
        bound = copy.copy(self)
        bound._bound = TemporalSchema.from_record(data, self.field_groups)
        return bound

    def bind_schema(self, schema: dict[str, Any], where: str) -> TemporalArrayStorage:
        parsed = TemporalSchema.from_json(schema, where)
        if self._bound is None:
            bound = copy.copy(self)
            bound._bound = parsed
            return bound
        if parsed != self._bound:
            raise SchemaMismatchError(
                f"{where} was written with another schema than an earlier part: "
                f"{self._bound.difference(parsed)}"
            )
        return self

    def shard_encoder(self) -> ShardEncoder:
        if self._bound is None:
            raise RuntimeError("the schema is fixed by the first record (see bind_record)")
        grid = min(layout.block_rows for layout in self._group_layouts(self._bound).values())
        return TemporalShardEncoder(self._bound, grid)

    async def write_derived_index(self, store: ObjectStore, manifest: Manifest) -> None:
        schema = self._bound if self._bound is not None else TemporalSchema([], [])
        reader = RangeReader(store, retry=self.retry)
        await write_record_index(
            store, manifest, schema, self._index_layouts(), reader, f"{self.url} (commit)"
        )

    # -- schema and index (opening) ---------------------------------------------------------
    def check_schema(self, manifest: Manifest) -> None:
        stored_schema(manifest, f"{self.url}/{ROOT_KEY}", self.url, self.field_groups)

    def open_index(self, manifest: Manifest) -> Program[RecordIndex]:
        """The record index: a small one read whole now (``stored.OPEN_INDEX_BYTES``),
        a larger one by range later."""
        return (yield from open_record_index(manifest, self.url, self.field_groups,
                                             self.index_cache_bytes))  # fmt: skip

    # -- readers ------------------------------------------------------------------------------
    def _reader(self) -> TemporalReader:
        reader = self._default_reader
        if reader is None:
            reader = self._default_reader = TemporalReader(self, self.default_opening)
        return reader

    @property
    def frame_counts(self) -> FrameCounts:
        """Frames of every record, in global shard-by-shard order: a lazy read-only ``int64``
        array-like (``counts[i]``, slices, index arrays, ``len``, iteration,
        ``np.asarray``) that reads the record index by range as it is used."""
        return self._reader().frame_counts

    def __len__(self) -> int:
        """Number of records."""
        return len(self._reader())

    def __getitem__(self, record: int) -> dict[str, Any]:
        """The whole record: every field, all frames (negative indexes count from the end)."""
        return self._reader()[record]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every record, whole, in order (read a batch of records at a time)."""
        return iter(self._reader())

    @property
    def fields(self) -> list[str]:
        """Field names, in the order of the first record written."""
        return self._reader().fields

    def read_records(
        self, records: Sequence[int], fields: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """See ``TemporalReader.read_records``."""
        return self._reader().read_records(records, fields)

    @property
    def total_frames(self) -> int:
        """Frames of all records together (read from the cumulative index once)."""
        return self._reader().total_frames

    def locate_frames(self, positions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """See ``TemporalReader.locate_frames``."""
        return self._reader().locate_frames(positions)

    def frame_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """See ``TemporalReader.frame_histogram``."""
        return self._reader().frame_histogram()

    def count_windows(self, frames: int) -> tuple[int, int]:
        """See ``TemporalReader.count_windows``."""
        return self._reader().count_windows(frames)

    def read_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
        max_concurrent_reads: int | None = None,
    ) -> dict[str, Any]:
        """Frames ``[start, start + frames)`` of some fields of one record.

        Parameters
        ----------
        record
            Global record index (shard by shard, in append order within a shard).
        start, frames
            The window; it must lie inside the record (no padding, no truncation).
        fields
            Field names to return (each at most once); ``None`` means all. ``[]`` returns
            ``{}`` for a window inside the record and raises for one outside it, as any
            selection does (the record's index entry is read if it is not cached).
        max_concurrency, max_concurrent_reads
            Requests in flight for this window (one name or the other; LitData calls it
            ``max_concurrent_reads``); the storage's ``max_concurrency`` by default.

        Returns
        -------
        dict
            Field name to a new array ``(frames, *trailing)`` with the stored dtype,
            writable and owning its memory: a numpy array, or a torch tensor for a field
            written as one. On a local path the window is copied out of memory-mapped
            blocks in the calling thread; elsewhere the bytes are fetched on the
            process's I/O loop. The first window of a record whose index entry is not
            cached reads it first (one more request).
        """
        reader = self._default_reader
        if reader is not None and max_concurrency is None and max_concurrent_reads is None:
            # a local window's hot path, one call shorter (``TemporalReader.read_window``)
            opened = reader.opened_holder.value
            if opened is not None:
                window = opened.window_in_block(record, start, frames, fields)
                if window is not None:
                    return window  # type: ignore[no-any-return]
                return reader.program_window(record, start, frames, fields, None)
        return self._reader().read_window(
            record, start, frames, fields,
            max_concurrency=max_concurrency, max_concurrent_reads=max_concurrent_reads,
        )  # fmt: skip

    async def aread_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
        max_concurrent_reads: int | None = None,
    ) -> dict[str, Any]:
        """``read_window`` for async callers; many may run at once on any event loop.

        The bound on requests in flight holds for this call; the process-wide bound
        (``set_process_max_concurrency``) holds across all calls. Cancelling a call cancels
        and drains its requests. Local windows are copied out of mapped blocks inline (a
        large one in a worker thread).
        """
        opened = await self.default_opening.get_async()
        return await aread_window(
            opened, record, start, frames, fields,
            concurrency(max_concurrency, max_concurrent_reads),
        )  # fmt: skip

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes this process has issued for this storage (opening too)."""
        opened = self.default_opening.opened.value
        return IOStats() if opened is None else opened.stats

    def close(self) -> None:
        """Release this process's open files, mappings or I/O-loop connections; reads make
        them again (the opened version, record index cache included, is kept)."""
        opened = self.default_opening.opened.value
        if opened is not None:
            opened.release_sync()

    async def aclose(self) -> None:
        """Release the connections the running event loop holds (or local open files)."""
        opened = self.default_opening.opened.value
        if opened is not None:
            await opened.arelease()

    def sync_reader(self) -> TemporalReader:
        return TemporalReader(self)

    def async_reader(self) -> AsyncTemporalReader:
        return AsyncTemporalReader(self)
