"""``StreamStorage``: fixed-size elements (tokens, or structured rows of aligned fields).

Per shard: ``stream`` (the elements) and ``record_ends`` (cumulative element count at the
end of each record). A read of ``[global_index, global_index + length)`` over the
concatenation of shards (in shard order) is one range request per shard touched once the
blocks' chunk indexes are cached.
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rangestream.errors import InvalidRecordError, SchemaMismatchError
from rangestream.io.loop import current_pid
from rangestream.io.range_reader import ReadProgram
from rangestream.io.store import INLINE_READ_BYTES, ObjectStore
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import (
    check_plain_dtype,
    dtype_from_json,
    dtype_to_json,
    little_endian,
)
from rangestream.layout.manifest import Manifest
from rangestream.storage.base import (
    AsyncReaderBase,
    OpenedStorage,
    Storage,
    SyncReaderBase,
)
from rangestream.storage.stream_mapped import MappedStreamReads, mapped_stream_reads
from rangestream.storage.writing import ShardEncoder
from rangestream.types import StreamStorageFormat

_INT64 = np.dtype("<i8")


class _StreamShardEncoder(ShardEncoder):
    def __init__(self, storage_format: StreamStorageFormat[Any, Any, Any]) -> None:
        self.format = storage_format
        self.dtype = np.dtype(storage_format.stream_dtype)

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        stream = self.format.pack(data)
        check_stream_array(stream, self.dtype, type(self.format).__name__)
        end = lengths["stream"] + len(stream)
        return {"stream": stream, "record_ends": np.asarray([end], dtype=_INT64)}


def check_stream_array(stream: Any, dtype: np.dtype[Any], who: str) -> None:
    if not isinstance(stream, np.ndarray):
        raise InvalidRecordError(
            f"{who}.pack must return a numpy array, got {type(stream).__name__}"
        )
    if stream.ndim != 1:
        raise InvalidRecordError(f"{who}.pack returned shape {stream.shape}; streams are 1-D")
    if stream.dtype != dtype:
        raise InvalidRecordError(
            f"{who}.pack returned dtype {stream.dtype}, the format's stream_dtype is {dtype}"
        )


class OpenedStream(OpenedStorage):
    """Read programs of a stream storage; shared by its sync and async readers."""

    def __init__(self, storage: Storage, store: ObjectStore, manifest: Manifest) -> None:
        super().__init__(storage, store, manifest)
        self.stream_bounds = self.bounds("stream")
        self.total_length = int(self.stream_bounds[-1])
        self._bounds = [int(b) for b in self.stream_bounds]  # bisect on ints beats numpy here
        self._ids = [int(s) for s in manifest.shard_ids]
        self.dtype = manifest.arrays["stream"].dtype
        self.format: StreamStorageFormat[Any, Any, Any] = storage.storage_format  # type: ignore[attr-defined]

    def check_range(self, global_index: int, length: int) -> tuple[int, int]:
        global_index, length = int(global_index), int(length)
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if global_index < 0 or global_index + length > self.total_length:
            raise IndexError(
                f"elements [{global_index}, {global_index + length}) are outside the stream "
                f"of {self.total_length} elements"
            )
        return global_index, length

    def plan(self, global_index: int, length: int) -> list[tuple[int, int, int]]:
        """``(shard id, local start, local stop)`` segments of a global range."""
        bounds, ids = self._bounds, self._ids
        stop = global_index + length
        position = global_index
        part = bisect.bisect_right(bounds, position) - 1
        out = []
        while position < stop:
            while bounds[part + 1] <= position:  # skip empty shards
                part += 1
            part_stop = min(stop, bounds[part + 1])
            out.append((ids[part], position - bounds[part], part_stop - bounds[part]))
            position = part_stop
            part += 1
        return out

    def read_many_elements(
        self, requests: Sequence[tuple[int, int]]
    ) -> ReadProgram[list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """Elements, segment lengths and segment shards of several reads, in one round."""
        plans = [self.plan(*self.check_range(g, n)) for g, n in requests]
        ranges = [
            self.row_range(shard, "stream", start, stop)
            for plan in plans
            for shard, start, stop in plan
        ]
        parts = yield from self.rows(ranges)
        out = []
        position = 0
        for plan in plans:
            pieces = parts[position : position + len(plan)]
            position += len(plan)
            if len(pieces) == 1:
                data = pieces[0].reshape(-1).view(self.dtype)
            elif pieces:
                data = np.concatenate(pieces).reshape(-1).view(self.dtype)
            else:
                data = np.empty(0, dtype=self.dtype)
            lengths = np.asarray([stop - start for _, start, stop in plan], dtype=np.int64)
            shards = np.asarray([shard for shard, _, _ in plan], dtype=np.int64)
            out.append((data, lengths, shards))
        return out

    def read_many(self, requests: Sequence[tuple[int, int]]) -> ReadProgram[list[Any]]:
        results = yield from self.read_many_elements(requests)
        return [self.format.unpack(data, lengths, shards) for data, lengths, shards in results]

    def read(self, global_index: int, length: int) -> ReadProgram[Any]:
        ((data, lengths, shards),) = yield from self.read_many_elements([(global_index, length)])
        return self.format.unpack(data, lengths, shards)


class StreamStorage(Storage):
    """Fixed-size stream elements in shards, read as windows over their concatenation.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``StreamStorageFormat`` (e.g. ``StreamNumpyFormat``) defining ``stream_dtype``,
        ``pack`` and ``unpack``. Reopen a dataset with a format of the same dtype.
    **options
        See ``Storage`` (storage_options, chunk and block sizes, concurrency, retries).
    """

    kind = "stream"
    opened_class = OpenedStream

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_format: StreamStorageFormat[Any, Any, Any],
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        dtype = getattr(storage_format, "stream_dtype", None)
        if not isinstance(dtype, np.dtype):
            raise TypeError(
                "storage_format must have a numpy stream_dtype, got "
                f"{type(storage_format).__name__}"
            )
        check_plain_dtype(dtype, "stream_dtype")
        self.storage_format = storage_format

    def _array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "stream": self._layout(self.storage_format.stream_dtype),
            "record_ends": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 8192)),
        }

    def _schema(self) -> dict[str, Any]:
        return {"stream_dtype": dtype_to_json(little_endian(self.storage_format.stream_dtype))}

    def _check_schema(self, manifest: Manifest) -> None:
        stored = dtype_from_json(manifest.schema.get("stream_dtype"), "stored stream_dtype")
        # stored little-endian: a big-endian format is the same format
        if little_endian(stored) != little_endian(self.storage_format.stream_dtype):
            raise SchemaMismatchError(
                f"{self.url} stores stream_dtype {stored}, but the format has "
                f"{self.storage_format.stream_dtype}"
            )
        if set(manifest.arrays) != {"stream", "record_ends"}:
            raise SchemaMismatchError(f"{self.url} does not hold a stream dataset's arrays")

    def _shard_encoder(self) -> ShardEncoder:
        return _StreamShardEncoder(self.storage_format)

    def sync_reader(self) -> StreamStorageReader:
        """A reader that blocks; on a local path it reads with ``pread`` directly."""
        return StreamStorageReader(self)

    def async_reader(self) -> AsyncStreamStorageReader:
        """A reader for ``async with``; bound to the loop that enters it."""
        return AsyncStreamStorageReader(self)


class _StreamFacts:
    opened: Any

    @property
    def num_shards(self) -> int:
        return int(self.opened.num_shards)

    @property
    def total_length(self) -> int:
        """Elements over all shards."""
        return int(self.opened.total_length)

    def length(self, shard: int) -> int:
        """Elements in ``shard`` (0 for a shard that was never written)."""
        return int(self.opened.shard_length("stream", int(shard)))

    def num_records(self, shard: int) -> int:
        return int(self.opened.shard_length("record_ends", int(shard)))


class StreamStorageReader(_StreamFacts, SyncReaderBase):
    """Sync reads of a stream storage.

    On a plain local path, windows inside one block are copied out of memory-mapped blocks
    (``rangestream.storage.stream_mapped``); everything else, and every error, takes the
    generic read program.
    """

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self._mapped: MappedStreamReads | None = None
        self._mapped_for: OpenedStorage | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mapped"] = state["_mapped_for"] = None  # mappings are per process
        return state

    def _mapped_reads(self) -> MappedStreamReads | None:
        opened = self._open()
        if self._mapped_for is not opened:  # first use, or reopened (a forked child)
            assert isinstance(opened, OpenedStream)
            self._mapped = mapped_stream_reads(opened)
            self._mapped_for = opened
        return self._mapped

    def read(self, global_index: int, length: int) -> Any:
        """Decode elements ``[global_index, global_index + length)`` with the format."""
        mapped = self._mapped
        if mapped is None or self._pid != current_pid() or self._opened is None:
            mapped = self._mapped_reads()
        if mapped is not None:
            found = mapped.read_one(global_index, length)
            if found is not None:
                return mapped.unpack(*found)
        return self._run(self.opened.read(global_index, length))

    def read_many(self, requests: Sequence[tuple[int, int]]) -> list[Any]:
        """Several ``(global_index, length)`` reads fetched together."""
        mapped = self._mapped_reads()
        if mapped is not None:
            found = mapped.read_many_elements(requests)
            if found is not None:
                unpack = mapped.unpack
                return [unpack(*elements) for elements in found]
        return self._run(self.opened.read_many(requests))


class AsyncStreamStorageReader(_StreamFacts, AsyncReaderBase):
    """Async reads of a stream storage.

    On a plain local path, windows inside one block are copied out of mapped blocks as the
    sync reader does, inline (reads over ``INLINE_READ_BYTES`` in a worker thread), as
    small local reads are: the copy takes microseconds.
    """

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self._mapped: MappedStreamReads | None = None
        self._mapped_for: OpenedStorage | None = None

    def _mapped_reads(self, opened: OpenedStorage) -> MappedStreamReads | None:
        if self._mapped_for is not opened:
            assert isinstance(opened, OpenedStream)
            self._mapped = mapped_stream_reads(opened)
            self._mapped_for = opened
        return self._mapped

    async def read(
        self, global_index: int, length: int, *, max_concurrency: int | None = None
    ) -> Any:
        opened = await self._aopen()
        mapped = self._mapped_reads(opened)
        if mapped is not None and type(length) is int:
            if length * mapped.itemsize <= INLINE_READ_BYTES:
                found = mapped.read_one(global_index, length)
            else:
                found = await asyncio.to_thread(mapped.read_one, global_index, length)
            if found is not None:
                return mapped.unpack(*found)
        return await self._run(opened.read(global_index, length), max_concurrency)

    async def read_many(
        self, requests: Sequence[tuple[int, int]], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._aopen()
        mapped = self._mapped_reads(opened)
        if mapped is not None:
            requests = list(requests)
            nbytes = sum(int(length) for _, length in requests) * mapped.itemsize
            if nbytes <= INLINE_READ_BYTES:
                found = mapped.read_many_elements(requests)
            else:
                found = await asyncio.to_thread(mapped.read_many_elements, requests)
            if found is not None:
                return [mapped.unpack(*elements) for elements in found]
        return await self._run(opened.read_many(requests), max_concurrency)
