"""``StreamStorage``: fixed-size elements (tokens, or structured rows of aligned fields).

Per shard: ``stream`` (the elements) and ``record_ends`` (cumulative element count at the
end of each record). This module holds what a stream storage is (its arrays, schema and
format) and its two readers; windows over the concatenation of shards are read by
``stream.windows``, records by ``stream.records``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import (
    InvalidRecordError,
    SchemaMismatchError,
)
from rangestream.formats.described import check_given_format, format_from_schema, format_schema
from rangestream.io.local import INLINE_READ_BYTES
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import (
    check_plain_dtype,
    dtype_from_json,
    dtype_to_json,
    little_endian,
)
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.storage.core.base import Storage
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.core.readers import AsyncReader, StorageFacts, SyncReader
from rangestream.storage.stream.windows import OpenedStream
from rangestream.types import StreamStorageFormat

__all__ = ["StreamStorage", "check_stream_format"]

_INT64 = np.dtype("<i8")
#: Default bytes of per-shard record ends a reader keeps (8 bytes per record).
DEFAULT_RECORD_ENDS_CACHE_BYTES = 64 * 1024 * 1024


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


def check_stream_format(storage_format: Any, methods: Sequence[str]) -> np.dtype[Any]:
    """The format's ``stream_dtype``, once the format is checked to have what a kind needs."""
    dtype = getattr(storage_format, "stream_dtype", None)
    if not isinstance(dtype, np.dtype):
        raise TypeError(
            f"storage_format must have a numpy stream_dtype, got {type(storage_format).__name__}"
        )
    for method in methods:
        if not callable(getattr(storage_format, method, None)):
            raise TypeError(
                f"storage_format must have a {method} method, got {type(storage_format).__name__}"
            )
    check_plain_dtype(dtype, "stream_dtype")
    return dtype


class StreamStorage(Storage):
    """Fixed-size stream elements in shards, read as windows over their concatenation.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``StreamStorageFormat`` (e.g. ``StreamNumpyFormat``) defining ``stream_dtype``,
        ``pack`` and ``unpack``; needed to write. Readers may omit it when the dataset
        records its format (formats with a ``schema()``, as ``StreamNumpyFormat``, are
        recorded by every write): ``StreamStorage(url)``. A format given to read is
        checked against the stored dtype and format.
    record_ends_cache_bytes
        Bytes of per-shard record ends each reader keeps: ``read_record`` and windows with
        record boundaries read a shard's ends whole on its first touch, then need no
        request for them.
    **options
        See ``Storage`` (storage_options, read and layout options).
    """

    kind = "stream"
    opened_class = OpenedStream
    #: The methods the format must have.
    format_methods: tuple[str, ...] = ("pack", "unpack")

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_format: StreamStorageFormat[Any, Any, Any] | None = None,
        *,
        record_ends_cache_bytes: int = DEFAULT_RECORD_ENDS_CACHE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        if storage_format is not None:
            check_stream_format(storage_format, self.format_methods)
        self.storage_format = storage_format
        self.record_ends_cache_bytes = integer(
            record_ends_cache_bytes, "record_ends_cache_bytes", minimum=0
        )

    @property
    def stream_dtype(self) -> np.dtype[Any]:
        """The dtype of one element: the format's, or the stored one (which opens the
        dataset in this process, once, when no format was given)."""
        if self.storage_format is not None:
            return np.dtype(self.storage_format.stream_dtype)
        return self.default_opening.get_sync().dtype  # type: ignore[attr-defined, no-any-return]

    def array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "stream": self._layout(self._writing_format().stream_dtype),
            "record_ends": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 8192)),
        }

    def kind_schema(self) -> dict[str, Any]:
        storage_format = self._writing_format()
        schema = {"stream_dtype": dtype_to_json(little_endian(storage_format.stream_dtype))}
        described = format_schema(storage_format)
        if described is not None:
            schema["format"] = described
        return schema

    def _stored_dtype(self, manifest: Manifest) -> np.dtype[Any]:
        return dtype_from_json(manifest.schema.get("stream_dtype"), "stored stream_dtype")

    def reading_format(self, manifest: Manifest) -> Any:
        """The given format once checked against the store, else the one it records."""
        stored = self._stored_dtype(manifest)
        where = f"{self.url}/{ROOT_KEY}"
        storage_format = self.storage_format
        if storage_format is not None:
            # stored little-endian: a big-endian format is the same format
            if little_endian(stored) != little_endian(storage_format.stream_dtype):
                raise SchemaMismatchError(
                    f"{self.url} stores stream_dtype {stored}, but the format has "
                    f"{storage_format.stream_dtype}"
                )
            check_given_format(storage_format, manifest.schema.get("format"), where)
            return storage_format
        recorded = manifest.schema.get("format")
        if recorded is None:
            raise SchemaMismatchError(
                f"{self.url} does not record its format (it was written with a format "
                "that has no schema(), or before formats were recorded): pass the format "
                f"it was written with, {type(self).__name__}(url, storage_format)"
            )
        storage_format = format_from_schema(recorded, where, stored)
        try:
            dtype = check_stream_format(storage_format, self.format_methods)
        except TypeError as error:
            raise SchemaMismatchError(
                f"{where}: the recorded format {recorded.get('format')!r} cannot read a "
                f"{self.kind} dataset ({error})"
            ) from error
        if little_endian(dtype) != little_endian(stored):
            raise SchemaMismatchError(
                f"{where}: the recorded format reads {dtype}, the store has {stored}"
            )
        return storage_format

    def check_schema(self, manifest: Manifest) -> None:
        if set(manifest.arrays) != {"stream", "record_ends"}:
            raise SchemaMismatchError(f"{self.url} does not hold a stream dataset's arrays")
        self.reading_format(manifest)

    def shard_encoder(self) -> ShardEncoder:
        return _StreamShardEncoder(self._writing_format())


class _StreamFacts(StorageFacts):
    """What both readers of a stream say about it."""

    def num_elements(self, shard: int | None = None) -> int:
        """Elements in ``shard``, or in all shards (``None``)."""
        if shard is None:
            return int(self.opened.total_length)
        return int(self.opened.shard_length("stream", int(shard)))

    def num_records(self, shard: int | None = None) -> int:
        """Records (``append`` calls) in ``shard``, or in all shards (``None``)."""
        if shard is None:
            return int(self.opened.num_records)
        return int(self.opened.shard_length("record_ends", int(shard)))

    # the names these counts had first, kept for existing callers
    @property
    def total_length(self) -> int:
        """Elements over all shards (``num_elements()``)."""
        return int(self.opened.total_length)

    def length(self, shard: int) -> int:
        """Elements in ``shard`` (``num_elements(shard)``; 0 for a shard never written)."""
        return int(self.opened.shard_length("stream", int(shard)))


class StreamStorageReader(_StreamFacts, SyncReader):
    """Sync reads of a stream storage: ``read(global_index, length)``, ``read_many``."""

    def read(self, global_index: int, length: int) -> Any:
        """Decode elements ``[global_index, global_index + length)`` with the format."""
        opened = self._opening.opened.value or self._opening.get_sync()
        window = opened.read_in_block(global_index, length)
        if window is not None:
            return window
        return opened.run_sync(opened.read(global_index, length))

    def read_many(self, requests: Sequence[tuple[int, int]]) -> list[Any]:
        """Several ``(global_index, length)`` reads fetched together (coalesced)."""
        return self._run(self.opened.read_many(requests))

    def read_record(self, index: int) -> Any:
        """Record ``index``: the elements of one ``append`` call, decoded by the format.

        Sample ``i`` of an SFT set (Megatron's ``IndexedDataset[i]``); negative indexes
        count from the end. Costs the record's range once its shard's record ends are
        cached (read whole on the shard's first touch).
        """
        (record,) = self._run(self.opened.read_records([index]))
        return record

    def read_records(self, indexes: Sequence[int]) -> list[Any]:
        """Several records, their rounds shared and coalesced."""
        return self._run(self.opened.read_records(list(indexes)))  # type: ignore[no-any-return]

    def read_many_with_starts(
        self, requests: Sequence[tuple[int, int]]
    ) -> list[tuple[Any, np.ndarray]]:
        """Windows, each with the window-relative starts of the records it overlaps."""
        return self._run(self.opened.read_many_with_starts(requests))  # type: ignore[no-any-return]


class AsyncStreamStorageReader(_StreamFacts, AsyncReader):
    """Async reads of a stream storage, with the sync reader's API awaited."""

    async def read(
        self, global_index: int, length: int, *, max_concurrency: int | None = None
    ) -> Any:
        opened = await self._opened()
        if type(length) is int and length * opened.itemsize <= INLINE_READ_BYTES:
            window = opened.read_in_block(global_index, length)  # a mapped copy: inline
        else:  # a copy of this size would stall the loop: in a thread
            window = await asyncio.to_thread(opened.read_in_block, global_index, length)
        if window is not None:
            return window
        return await opened.run(opened.read(global_index, length), max_concurrency=max_concurrency)

    async def read_many(
        self, requests: Sequence[tuple[int, int]], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._opened()
        return await opened.run(opened.read_many(requests), max_concurrency=max_concurrency)

    async def read_record(self, index: int, *, max_concurrency: int | None = None) -> Any:
        (record,) = await self.read_records([index], max_concurrency=max_concurrency)
        return record

    async def read_records(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._opened()
        program = opened.read_records(list(indexes))
        return await opened.run(program, max_concurrency=max_concurrency)  # type: ignore[no-any-return]

    async def read_many_with_starts(
        self, requests: Sequence[tuple[int, int]], *, max_concurrency: int | None = None
    ) -> list[tuple[Any, np.ndarray]]:
        opened = await self._opened()
        program = opened.read_many_with_starts(requests)
        return await opened.run(program, max_concurrency=max_concurrency)  # type: ignore[no-any-return]


StreamStorage.sync_reader_class = StreamStorageReader
StreamStorage.async_reader_class = AsyncStreamStorageReader
