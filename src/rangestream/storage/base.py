"""What every storage kind shares: its URL and options, opening, writing and reading.

A storage object is a cheap, picklable description (URL, format, options). It opens
nothing until a reader or writer is made, so it can be built in a parent process and
handed to DataLoader workers; every worker opens its own store, event loop and sessions.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from rangestream.errors import (
    DatasetExistsError,
    DatasetNotFoundError,
    MissingObjectError,
)
from rangestream.io.loop import current_pid, run_sync
from rangestream.io.range_reader import (
    DEFAULT_COALESCE_GAP,
    DEFAULT_MAX_CONCURRENCY,
    IOStats,
    RangeReader,
    ReadProgram,
)
from rangestream.io.ranges import ObjectRequest
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.store import LocalStore, ObjectStore, is_local_url, open_store
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import little_endian
from rangestream.layout.manifest import MAX_ROOT_BYTES, ROOT_KEY, Manifest, parse_root
from rangestream.layout.rows import BlockIndexCache, RowRange, read_rows
from rangestream.storage.writing import (
    CommittingWriter,
    ShardEncoder,
    WriteSession,
    new_session,
    read_committed,
)

#: Target size of one inner chunk: the unit of checksums and of over-fetch per window end.
DEFAULT_CHUNK_BYTES = 1024
#: Upper bound on one block (one stored object), its checksums and chunk index included.
DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024


class Storage(abc.ABC):
    """Base of the storage kinds; see ``StreamStorage`` and ``DocumentStorage``.

    Parameters
    ----------
    url
        A local path (``str`` or ``pathlib.Path``), ``file://``, ``s3://bucket/prefix``,
        ``memory://name`` or any other fsspec URL.
    storage_options
        fsspec options, e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for MinIO;
        credentials in here never appear in reprs or error messages.
    chunk_bytes, block_bytes
        Target sizes of inner chunks and blocks for new writes. Readers take the layout
        from the stored metadata.
    max_concurrency
        Requests in flight for one read call.
    coalesce_gap
        Ranges of one object this close together are fetched as one request.
    retry
        Retry policy for transient storage errors.
    verify_checksums
        Check each inner chunk's crc32c on every read (on by default).
    dense_chunks
        Record in new writes that blocks are laid out densely, so readers compute byte
        ranges without fetching chunk indexes (one request fewer on a block's first read).
        ``False`` makes readers fetch and cache each block's chunk index, as a generic
        Zarr reader does.
    """

    kind: ClassVar[str] = ""
    #: The class holding this kind's opened state and read programs.
    opened_class: ClassVar[type[OpenedStorage]]

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
        retry: RetryPolicy | None = None,
        verify_checksums: bool = True,
        dense_chunks: bool = True,
    ) -> None:
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str) or not url:
            raise TypeError(f"url must be a non-empty str or os.PathLike, got {url!r}")
        if chunk_bytes < 1 or block_bytes < chunk_bytes:
            raise ValueError(
                f"need 1 <= chunk_bytes <= block_bytes, got {chunk_bytes}, {block_bytes}"
            )
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.chunk_bytes = chunk_bytes
        self.block_bytes = block_bytes
        self.max_concurrency = max_concurrency
        self.coalesce_gap = coalesce_gap
        self.retry = retry or RetryPolicy()
        self.verify_checksums = verify_checksums
        self.dense_chunks = dense_chunks

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def is_local(self) -> bool:
        """Whether reads go to local files, where a sync ``pread`` beats any event loop."""
        return is_local_url(self.url)

    def preload_readers(self) -> None:
        """Import the client code that reading this storage needs, without opening it.

        ``StatefulDataLoader`` calls it before its workers fork, so that forked workers do
        not each import the S3 client (about 200 ms of CPU) before their first batch.
        """
        self._new_store().preload()

    def _layout(
        self,
        dtype: np.dtype[Any],
        row_shape: tuple[int, ...] = (),
        *,
        chunk_bytes: int | None = None,
    ) -> ArrayLayout:
        """The layout of a new array of this storage, from its size targets (stored
        little-endian: writers convert rows of another byte order)."""
        return ArrayLayout.for_sizes(
            little_endian(np.dtype(dtype)),
            row_shape,
            chunk_bytes=chunk_bytes or self.chunk_bytes,
            block_bytes=max(self.block_bytes, chunk_bytes or 0),
            dense_chunks=self.dense_chunks,
        )

    # -- hooks of the storage kinds --------------------------------------------------
    @abc.abstractmethod
    def _array_layouts(self) -> dict[str, ArrayLayout]:
        """The arrays every shard of a new write has, and their layouts."""

    def _array_attributes(self, name: str) -> dict[str, Any]:
        return {}

    def _schema(self) -> dict[str, Any]:
        return {}

    def _check_schema(self, manifest: Manifest) -> None:  # noqa: B027 - optional hook
        """Raise ``SchemaMismatchError`` if the caller's format differs from the stored one."""

    @abc.abstractmethod
    def _shard_encoder(self) -> ShardEncoder:
        """A fresh encoder for one shard of a writer."""

    def _bind_record(self, data: Any) -> Storage:
        """The storage that writes ``data`` and every later record of one writer.

        Kinds whose schema comes from the first record written (``TemporalArrayStorage``)
        validate ``data`` and return a copy with that schema fixed; the writer then takes its
        array layouts and encoders from the copy and records its schema in its part.
        """
        return self

    def _bind_schema(self, schema: dict[str, Any], where: str) -> Storage:
        """The storage that commits parts whose writers recorded ``schema`` (from ``where``).

        Called once per part that carries a schema (see ``_bind_record``); a kind raises
        ``SchemaMismatchError`` if ``schema`` differs from one it is already bound to.
        """
        return self

    async def _write_derived_index(  # noqa: B027 - optional hook
        self, store: ObjectStore, manifest: Manifest
    ) -> None:
        """Write index arrays computed from the written shards, before the commit publishes.

        Kinds whose readers need a compact index of the whole dataset at open override this
        (``TemporalArrayStorage``: every record's frame end, one small array).
        """

    # -- stores -------------------------------------------------------------------------
    def _new_store(self) -> ObjectStore:
        return open_store(self.url, self.storage_options)

    def _new_write_store(self) -> ObjectStore:
        """The store for writers and commits: remote calls retried like range reads."""
        store = self._new_store()
        if isinstance(store, LocalStore):  # local errors are not transient
            return store
        return RetryingStore(store, self.retry)

    # -- writing ------------------------------------------------------------------------
    def parallel_write(self, *, overwrite: bool = False) -> WriteSession:
        """Start a write that several processes share, each owning distinct shards.

        Hand the returned session to each worker; there, ``with session.sync_writer() as
        w: w.append(shard, record)``. When all workers are done, ``session.commit()``
        publishes the dataset in one atomic step.
        """
        if not overwrite:
            exists, _ = run_sync(self._probe())
            if exists:
                raise DatasetExistsError(
                    f"{self.url} already holds a committed dataset; "
                    "pass overwrite=True to replace it"
                )
        return new_session(self, overwrite)

    async def _probe(self) -> tuple[bool, Manifest | None]:
        store = self._new_write_store()
        try:
            return await read_committed(store)
        finally:
            await store.aclose()

    def sync_writer(self, *, overwrite: bool = False) -> CommittingWriter:
        """A writer that commits the dataset when its ``with`` block exits cleanly."""
        return CommittingWriter(self.parallel_write(overwrite=overwrite))

    def exists(self) -> bool:
        """Whether a committed dataset is at the URL."""
        return run_sync(self._probe())[0]


class OpenedStorage:
    """A storage's committed version, opened: manifest, store, range reader, caches.

    Holds everything per process and per loop; made inside the process that reads.
    """

    def __init__(self, storage: Storage, store: ObjectStore, manifest: Manifest) -> None:
        self.storage = storage
        self.store = store
        self.manifest = manifest
        self.reader = RangeReader(
            store,
            max_concurrency=storage.max_concurrency,
            coalesce_gap=storage.coalesce_gap,
            retry=storage.retry,
        )
        self.block_indexes = BlockIndexCache()
        self._shard_position = {int(s): i for i, s in enumerate(manifest.shard_ids)}
        self._arrays: dict[tuple[int, str], tuple[str, ArrayLayout, int]] = {}

    @property
    def num_shards(self) -> int:
        """One more than the highest shard id written (absent shards have length 0)."""
        ids = self.manifest.shard_ids
        return int(ids[-1]) + 1 if len(ids) else 0

    def bounds(self, name: str, minus: int = 0) -> np.ndarray:
        """Cumulative per-shard lengths of array ``name`` (less ``minus`` per shard)."""
        lengths = self.manifest.lengths[name] - minus
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def rows(self, ranges: list[RowRange]) -> ReadProgram[list[np.ndarray]]:
        return read_rows(
            ranges,
            self.block_indexes,
            describe=self.store.describe,
            verify_checksums=self.storage.verify_checksums,
        )

    @property
    def stats(self) -> IOStats:
        return self.reader.stats

    def shard_length(self, name: str, shard: int) -> int:
        position = self._shard_position.get(shard)
        return 0 if position is None else int(self.manifest.lengths[name][position])

    def row_range(self, shard: int, name: str, start: int, stop: int) -> RowRange:
        cached = self._arrays.get((shard, name))
        if cached is None:
            cached = self._arrays[(shard, name)] = (
                self.manifest.array_key(shard, name),
                self.manifest.arrays[name],
                self.shard_length(name, shard),
            )
        key, layout, length = cached
        return RowRange(key, layout, length, start, stop)

    def describe(self, key: str) -> str:
        return self.store.describe(key)


def _open_program(storage: Storage) -> ReadProgram[Manifest]:
    (raw,) = yield [ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)]
    manifest = parse_root(bytes(raw), f"{storage.url}/{ROOT_KEY}", storage.kind)
    storage._check_schema(manifest)
    return manifest


def _not_found(storage: Storage, error: MissingObjectError) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"no dataset at {storage.url}: {ROOT_KEY} not found (never committed?)"
    )


def open_sync(storage: Storage) -> tuple[ObjectStore, Manifest, IOStats]:
    store = storage._new_store()
    reader = RangeReader(store, retry=storage.retry)
    try:
        manifest = reader.run_sync(_open_program(storage))
    except MissingObjectError as error:
        close_store_sync(store)
        raise _not_found(storage, error) from error
    except BaseException:
        close_store_sync(store)
        raise
    return store, manifest, reader.stats


async def open_async(storage: Storage) -> tuple[ObjectStore, Manifest, IOStats]:
    store = storage._new_store()
    reader = RangeReader(store, retry=storage.retry)
    try:
        manifest = await reader.run(_open_program(storage))
    except MissingObjectError as error:
        await store.aclose()
        raise _not_found(storage, error) from error
    except BaseException:
        await store.aclose()
        raise
    return store, manifest, reader.stats


def close_store_sync(store: ObjectStore) -> None:
    if isinstance(store, LocalStore):
        store.close_files()
    else:
        run_sync(store.aclose())


class SyncReaderBase:
    """Context-managed sync reader: opens on ``__enter__`` (or first use), closes on exit."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._opened: OpenedStorage | None = None
        self._pid = os.getpid()
        self._open_stats = IOStats()

    def _open(self) -> OpenedStorage:
        if self._opened is None or self._pid != current_pid():
            store, manifest, stats = open_sync(self._storage)
            self._opened = self._make_opened(store, manifest)
            self._opened.reader.stats = stats  # the open's request counts as this reader's
            self._pid = current_pid()
        return self._opened

    def _make_opened(self, store: ObjectStore, manifest: Manifest) -> OpenedStorage:
        return self._storage.opened_class(self._storage, store, manifest)

    @property
    def opened(self) -> OpenedStorage:
        return self._open()

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes this reader has issued (open included)."""
        return self._open().stats

    def _run(self, program: ReadProgram[Any]) -> Any:
        return self._open().reader.run_sync(program)

    def __enter__(self) -> Any:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._opened is not None and self._pid == os.getpid():
            close_store_sync(self._opened.store)
        self._opened = None


class AsyncReaderBase:
    """Context-managed async reader bound to the loop that enters it."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._opened: OpenedStorage | None = None

    async def _aopen(self) -> OpenedStorage:
        if self._opened is None:
            store, manifest, stats = await open_async(self._storage)
            self._opened = self._storage.opened_class(self._storage, store, manifest)
            self._opened.reader.stats = stats
        return self._opened

    @property
    def opened(self) -> OpenedStorage:
        if self._opened is None:
            raise RuntimeError("use the async reader inside 'async with' (it is not open yet)")
        return self._opened

    @property
    def stats(self) -> IOStats:
        return self.opened.stats

    async def _run(self, program: ReadProgram[Any], max_concurrency: int | None = None) -> Any:
        opened = await self._aopen()
        return await opened.reader.run(program, max_concurrency=max_concurrency)

    async def __aenter__(self) -> Any:
        await self._aopen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._opened is not None:
            store = self._opened.store
            if isinstance(store, LocalStore):
                store.close_files()
            else:
                await store.aclose()
        self._opened = None


def segments(bounds: np.ndarray, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Split global ``[start, stop)`` over consecutive parts with cumulative ``bounds``.

    ``bounds`` has one more entry than parts (``bounds[0] == 0``). Returns ``(part,
    local_start, local_stop)`` for every non-empty part the range touches, in order.
    """
    if start >= stop:
        return []
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    out = []
    part = first
    position = start
    while position < stop:
        while bounds[part + 1] <= position:
            part += 1
        part_stop = min(stop, int(bounds[part + 1]))
        out.append((part, position - int(bounds[part]), part_stop - int(bounds[part])))
        position = part_stop
        part += 1
    return out
