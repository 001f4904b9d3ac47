"""Opening a storage: one lifecycle for every kind.

A storage is a description (URL, options). Reading needs the committed version opened in the
reading process: a store, the manifest (one bounded request for the root document, plus
whatever compact index the kind reads at open), a range reader with its counter, and the
executor that runs read programs (mapped local blocks, or fetched byte ranges). That is an
:class:`OpenedStorage`, made by an :class:`Opening`: once per process, for sync callers
under a lock, for async callers once per event loop at a time, and never carried across a
fork (it lives in a ``ProcessLocal``). Sync and async readers are two faces of one opened
version.
"""

from __future__ import annotations

import asyncio
import operator
import weakref
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from rangestream.errors import DatasetNotFoundError, MissingObjectError
from rangestream.io.cache.settings import cache_for
from rangestream.io.local import LocalStore
from rangestream.io.process import ProcessLocal
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ObjectRequest
from rangestream.io.stats import IOStats
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import MappedExecutor, Program, RemoteExecutor
from rangestream.layout.manifest import MAX_ROOT_BYTES, ROOT_KEY, Manifest, read_shard_table
from rangestream.layout.manifest_parsing import parse_root
from rangestream.layout.pieces import StoredArray

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind

__all__ = ["OpenedStorage", "Opening", "ShardArrays", "ShardIds"]

T = TypeVar("T")
#: Arrays (one per shard and array name) an opened version keeps made; past this many it
#: forgets them all and makes them again on demand (each is a few hundred bytes).
MAX_KEPT_ARRAYS = 8192


class ShardIds(Sequence[int]):
    """The shard ids of a version by position, as Python ints, over one int64 array.

    A list of 10^5 ints costs 3.6 MB and a dict from id to position twice that; this is the
    array the manifest holds, and a position is found by arithmetic when ids are
    ``0 .. n-1`` (the common case), by bisection otherwise.
    """

    __slots__ = ("_dense", "_ids")

    def __init__(self, ids: np.ndarray) -> None:
        self._ids = ids
        self._dense = len(ids) == 0 or (int(ids[0]) == 0 and int(ids[-1]) == len(ids) - 1)

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, position: int) -> int: ...

    @overload
    def __getitem__(self, position: slice) -> list[int]: ...

    def __getitem__(self, position: int | slice) -> int | list[int]:
        if isinstance(position, slice):
            return [int(s) for s in self._ids[position]]
        return int(self._ids[position])

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids.tolist())

    def __contains__(self, shard: object) -> bool:
        try:
            number = operator.index(shard)  # type: ignore[arg-type]
        except TypeError:
            return False
        return self.position(number) is not None

    def position(self, shard: int) -> int | None:
        """Where shard ``shard`` is in the version (``None``: it has no rows)."""
        ids = self._ids
        if self._dense:
            return shard if 0 <= shard < len(ids) else None
        position = int(np.searchsorted(ids, shard))
        return position if position < len(ids) and int(ids[position]) == shard else None


class ShardArrays(Sequence[StoredArray]):
    """Array ``name`` of every shard, by position, made when first asked for.

    What the per-shard lists of arrays were, without making 10^5 of them at open.
    ``layout`` is the one every shard's blocks can be addressed with (the manifest's).
    """

    __slots__ = ("_opened", "layout", "name")

    def __init__(self, opened: OpenedStorage, name: str) -> None:
        self._opened = opened
        self.name = name
        self.layout = opened.manifest.arrays[name]

    def __len__(self) -> int:
        return len(self._opened.shard_ids)

    @overload
    def __getitem__(self, position: int) -> StoredArray: ...

    @overload
    def __getitem__(self, position: slice) -> list[StoredArray]: ...

    def __getitem__(self, position: int | slice) -> StoredArray | list[StoredArray]:
        if isinstance(position, slice):
            return [self[p] for p in range(len(self))[position]]
        shard_ids = self._opened.shard_ids
        if position < 0:
            position += len(shard_ids)
        return self._opened.array(shard_ids[position], self.name)


class OpenedStorage:
    """A storage's committed version, opened in this process: what every read needs.

    Kinds subclass it with their read programs; ``index`` is what the kind's
    ``open_index`` read at open.
    """

    def __init__(
        self,
        storage: StorageKind,
        store: ObjectStore,
        manifest: Manifest,
        executor: RemoteExecutor | MappedExecutor,
        index: Any = None,
    ) -> None:
        self.storage = storage
        self.store = store
        self.manifest = manifest
        self.executor = executor
        self.mapped = executor if isinstance(executor, MappedExecutor) else None
        self.remote = executor.remote if isinstance(executor, MappedExecutor) else executor
        self.reader = self.remote.reader
        self.shard_ids = ShardIds(manifest.shard_ids)
        self._name_numbers = {name: i + 1 for i, name in enumerate(manifest.arrays)}
        self._arrays: dict[tuple[int, str], StoredArray] = {}
        self._stored_layouts: dict[tuple[str, int], ArrayLayout] = {}

    # -- what is stored -------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """One more than the highest shard id written (absent shards have length 0)."""
        return self.shard_ids[-1] + 1 if len(self.shard_ids) else 0

    def bounds(self, name: str, minus: int = 0) -> np.ndarray:
        """Cumulative per-shard lengths of array ``name`` (less ``minus`` per shard)."""
        lengths = self.manifest.lengths[name] - minus
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def shard_length(self, name: str, shard: int) -> int:
        position = self.shard_ids.position(shard)
        return 0 if position is None else int(self.manifest.lengths[name][position])

    def arrays_of(self, name: str) -> ShardArrays:
        """Array ``name`` of every shard, by position, made on demand."""
        return ShardArrays(self, name)

    def array(self, shard: int, name: str) -> StoredArray:
        """Array ``name`` of ``shard`` (kept while fewer than ``MAX_KEPT_ARRAYS`` are).

        Its ``ident`` is a function of the array name and the shard's position, so an array
        made again finds the blocks mapped for it before, and a sequence of one name's arrays
        by position has blocks keyed ``block_base(0) + (position << 40) + block``
        (``MappedExecutor.block_copier``). Its layout is the one its blocks are stored with
        (``ArrayLayout.stored_for``: a version 2 array of one block declares its own size).
        """
        found = self._arrays.get((shard, name))
        if found is None:
            position = self.shard_ids.position(shard)
            if position is None:  # no rows, so no blocks: one ident serves every such array
                length, ident = 0, (len(self._name_numbers) + 1) << 24
            else:
                length = int(self.manifest.lengths[name][position])
                ident = (self._name_numbers[name] << 24) + position
            if len(self._arrays) >= MAX_KEPT_ARRAYS:
                self._arrays.clear()
            found = self._arrays[(shard, name)] = StoredArray(
                self.manifest.array_key(shard, name),
                self._stored_layout(name, length),
                length,
                name,
                ident,
            )
        return found

    def _stored_layout(self, name: str, length: int) -> ArrayLayout:
        layout = self.manifest.arrays[name]
        if length > layout.block_rows:
            return layout
        chunks = -(-max(length, 1) // layout.chunk_rows)  # one layout per chunk count
        found = self._stored_layouts.get((name, chunks))
        if found is None:
            if len(self._stored_layouts) >= MAX_KEPT_ARRAYS:
                self._stored_layouts.clear()
            found = self._stored_layouts[(name, chunks)] = self.manifest.stored_layout(name, length)
        return found

    def describe(self, key: str) -> str:
        return self.store.describe(key)

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes since opening (the open's included)."""
        return self.reader.stats

    # -- running programs --------------------------------------------------------------------
    def run_sync(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        return self.executor.run_sync(program, max_concurrency=max_concurrency)

    async def run(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        return await self.executor.run(program, max_concurrency=max_concurrency)

    # -- releasing ---------------------------------------------------------------------------
    async def arelease_connections(self) -> None:
        """Release the running loop's connections (and open files), keeping everything
        else: the manifest, the kind's index, the caches and mapped blocks. A read on
        another loop reconnects there; nothing is opened again."""
        await self.store.aclose()

    def release_sync(self) -> None:
        """Release open files, mappings and connections; reads make them again when needed."""
        if self.mapped is not None:
            self.mapped.maps.clear()
        self.store.close_sync()

    async def arelease(self) -> None:
        """``release_sync`` for the running loop's connections."""
        if self.mapped is not None:
            self.mapped.maps.clear()
        await self.store.aclose()


def _open_program(
    storage: StorageKind, store: ObjectStore
) -> Generator[Any, Any, tuple[Manifest, Any]]:
    (raw,) = yield [ObjectRequest(ROOT_KEY, MAX_ROOT_BYTES)]
    manifest = parse_root(bytes(raw), store.describe(ROOT_KEY), storage.kind)
    storage.check_schema(manifest)
    # the per-shard rows of a dataset of many shards: one more request per 4 MiB of them
    manifest = yield from read_shard_table(manifest, store.describe)
    index = yield from storage.open_index(manifest)
    return manifest, index


def _not_found(storage: StorageKind, store: ObjectStore, error: MissingObjectError) -> Exception:
    """What a missing root means: no dataset, or (said plainly) no bucket or directory."""
    cause = f"{error.__cause__ or ''}"
    if "NoSuchBucket" in cause:
        bucket = storage.url.split("://", 1)[-1].split("/", 1)[0]
        return DatasetNotFoundError(
            f"no dataset at {storage.url}: bucket {bucket!r} does not exist"
        )
    if isinstance(store, LocalStore) and not store.root.is_dir():
        what = "not a directory" if store.root.exists() else "no such directory"
        return DatasetNotFoundError(f"no dataset at {storage.url}: {what}")
    return DatasetNotFoundError(
        f"no dataset at {storage.url}: {ROOT_KEY} not found (never committed?)"
    )


def _parts(storage: StorageKind) -> tuple[ObjectStore, RemoteExecutor | MappedExecutor]:
    store = storage.new_store()
    options = storage.read_options
    reader = RangeReader(
        store,
        max_concurrency=options.max_concurrency,
        coalesce_gap=options.coalesce_gap,
        max_coalesced_bytes=options.max_coalesced_bytes,
        retry=options.retry,
        cache=cache_for(store.url, options.cache_dir, options.cache_bytes),
    )
    remote = RemoteExecutor(reader, verify=options.verify_checksums)
    executor: RemoteExecutor | MappedExecutor = remote
    if type(store) is LocalStore and options.mapped:
        executor = MappedExecutor(store, remote)
    return store, executor


def open_sync(storage: StorageKind) -> OpenedStorage:
    """Open the committed version with sync I/O (the process's I/O loop for remote stores)."""
    store, executor = _parts(storage)
    try:
        manifest, index = executor.run_sync(_open_program(storage, store))
    except MissingObjectError as error:
        store.close_sync()
        if _is_root(store, error):
            raise _not_found(storage, store, error) from error
        raise
    except BaseException:
        store.close_sync()
        raise
    return storage.opened_class(storage, store, manifest, executor, index)


async def open_async(storage: StorageKind) -> OpenedStorage:
    """Open the committed version on the running loop."""
    store, executor = _parts(storage)
    try:
        manifest, index = await executor.run(_open_program(storage, store))
    except MissingObjectError as error:
        await store.aclose()
        if _is_root(store, error):
            raise _not_found(storage, store, error) from error
        raise
    except BaseException:
        await store.aclose()
        raise
    return storage.opened_class(storage, store, manifest, executor, index)


def _is_root(store: ObjectStore, error: MissingObjectError) -> bool:
    """Whether the missing object is the root document (not an index read at open)."""
    return f"object {store.describe(ROOT_KEY)} is missing" in str(error)


class Opening:
    """The opened version of one storage in this process, made once and shared.

    ``get_sync`` opens under a lock (threads racing share one open); ``get_async`` opens on
    the running loop, once per loop at a time (a cancelled caller leaves the open running
    for the others; a failed open is tried again by the next caller).
    """

    def __init__(self, storage: StorageKind) -> None:
        self.storage = storage
        self.opened = ProcessLocal[OpenedStorage]()
        self._tasks = ProcessLocal[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]]()

    def get_sync(self) -> OpenedStorage:
        opened = self.opened.value
        if opened is None:
            opened = self.opened.get_or_make(lambda: open_sync(self.storage))
        return opened

    async def get_async(self) -> OpenedStorage:
        opened = self.opened.value
        if opened is not None:
            return opened
        tasks = self._tasks.get_or_make(weakref.WeakKeyDictionary)
        loop = asyncio.get_running_loop()
        task = tasks.get(loop)
        if task is None:
            task = tasks[loop] = loop.create_task(open_async(self.storage))
            task.add_done_callback(_retrieve_exception)
        try:
            opened = await asyncio.shield(task)
        except BaseException:
            if task.done():  # the open failed: the next call tries again
                tasks.pop(loop, None)
            raise
        if self.opened.value is None:
            self.opened.value = opened
        tasks.pop(loop, None)
        return self.opened.value

    def release_sync(self) -> None:
        """Release files and the I/O loop's connections, keeping the opened version.

        For a reader that outlives one use (a persistent DataLoader worker's next epoch):
        its next read opens nothing and keeps what the reader learnt (indexes, offsets).
        """
        opened = self.opened.value
        if opened is not None:
            opened.store.close_sync()

    async def arelease(self) -> None:
        """``release_sync`` for the running loop: call it before closing a loop whose reads
        are done; a later read on another loop reuses the opened version."""
        opened = self.opened.value
        if opened is not None:
            await opened.arelease_connections()

    def forget_sync(self) -> None:
        """Release and forget the opened version; the next read opens the dataset again."""
        opened = self.opened.pop()
        if opened is not None:
            opened.release_sync()

    async def aforget(self) -> None:
        opened = self.opened.pop()
        if opened is not None:
            await opened.arelease()


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # consumed here so an open nobody awaits any more does not warn
