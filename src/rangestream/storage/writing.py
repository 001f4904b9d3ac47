"""Writing a dataset: buffered block uploads per shard, part manifests, one commit.

A write is a *session* with a fresh commit id: every object goes under
``data/<commit_id>/``, invisible to readers. Each writer (one per process when writing in
parallel) owns distinct shards and, on a clean close, records what it wrote in a part
manifest. The commit gathers the parts, checks they do not overlap, and writes the root
``zarr.json`` last: that single atomic put is what makes the dataset exist. A session that
fails or is abandoned leaves the previous commit (or nothing) visible.

The root is replaced only if it is still the version the commit read (a conditional put:
S3 ``If-Match`` / ``If-None-Match``, a lock and a rename on local disk, check-then-put
elsewhere) and read back afterwards, so of two concurrent commits the one that lost
learns it (``CommitConflictError``) instead of reporting a success nobody can read.
Every error a caller can cause here ends in the library's exception classes.

A writer's memory is bounded by a budget (``max_buffered_bytes``), not by the number of
shards it owns: each shard's partial last block waits in memory until it fills, and when
the partial blocks of all shards together exceed the budget, those of the least recently
appended shards are uploaded as raw *pieces* under ``data/<commit>/spill/<part id>/`` and
dropped from memory. A block with pieces is assembled when it fills (or at close): its
pieces are read back, joined with the rows still in memory and uploaded as the block. Each
spill costs one put; each block assembled from ``n`` pieces costs ``n`` gets; the writer
deletes its spill prefix once at close (one listing and a batched delete). Bytes move
about twice instead of once for the spilled rows, which is what a budget far below
``shards x block`` buys.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import copy
import datetime
import json
import os
import random
import re
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rangestream.errors import (
    AccessDeniedError,
    CommitConflictError,
    CommitError,
    ConcurrentWriteError,
    CorruptDataError,
    DatasetExistsError,
    InvalidShardError,
    MetadataError,
    RangestreamError,
    SchemaMismatchError,
    StorageError,
    WriterClosedError,
)
from rangestream.io.local import LocalStore
from rangestream.io.process import io_loop, run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.retry import retrying
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.dtypes import little_endian
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    SHARD_TABLE,
    Manifest,
    data_prefix,
    parse_root,
    read_shard_table,
    shard_prefix,
)
from rangestream.layout.zarr_json import array_document, dumps, group_document
from rangestream.storage.options import LayoutOptions

if TYPE_CHECKING:
    from rangestream.storage.base import Storage

T = TypeVar("T")

#: Uploads in flight per writer; bounds memory to about this many blocks.
MAX_PENDING_UPLOADS = 8
#: Default bound on the bytes of partial blocks one writer keeps in memory, all its shards
#: together (64 partial blocks of 4 MiB); beyond, the least recently appended shards'
#: partial blocks are uploaded as pieces and dropped from memory.
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
#: Objects the commit reads or writes at once (parts, index and group documents).
COMMIT_CONCURRENCY = 64
#: What a caller-chosen part id may be: it becomes the object name ``parts/<id>.json``.
_PART_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class _Uploader:
    """Puts objects: directly for local files, pipelined on the I/O loop otherwise."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._pending: deque[Future[None]] = deque()

    def put(self, key: str, data: bytes) -> None:
        if isinstance(self.store, LocalStore):
            self.store.put_sync(key, data)
            return
        while len(self._pending) >= MAX_PENDING_UPLOADS:
            self._pending.popleft().result()
        self._pending.append(asyncio.run_coroutine_threadsafe(self.store.put(key, data), io_loop()))

    def get_all(self, keys: Sequence[str]) -> list[bytes]:
        """Whole objects, fetched together (pieces of a block being assembled)."""
        store = self.store
        if isinstance(store, LocalStore):
            return [store.get_sync(key) for key in keys]

        async def fetch() -> list[bytes]:
            return list(await asyncio.gather(*(store.get(key) for key in keys)))

        return asyncio.run_coroutine_threadsafe(fetch(), io_loop()).result()

    def delete_prefix(self, prefix: str) -> None:
        if isinstance(self.store, LocalStore):
            run_blocking(self.store.delete_prefix(prefix))
            return
        asyncio.run_coroutine_threadsafe(self.store.delete_prefix(prefix), io_loop()).result()

    def flush(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def drop(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()


class _ArrayWriter:
    """Rows of one array of one shard, uploaded one full block at a time.

    The rows of the block being filled are in memory (``buffered`` bytes), or partly in
    pieces that ``spill`` uploaded (``_pieces``: their sizes; piece ``i`` of block ``b`` is
    ``<spill_key>/<b>.<i>``), which the block's assembly reads back.
    """

    def __init__(self, key: str, layout: ArrayLayout, uploader: _Uploader, spill_key: str) -> None:
        self.key = key
        self.layout = layout
        self.uploader = uploader
        self.spill_key = spill_key
        self.length = 0
        self._buffer = bytearray()
        self._blocks_written = 0
        self._pieces: list[int] = []
        self._piece_bytes = 0
        self._block_nbytes = layout.block_rows * layout.row_nbytes

    @property
    def buffered(self) -> int:
        """Bytes of rows held in memory."""
        return len(self._buffer)

    def append(self, rows: np.ndarray) -> None:
        if rows.dtype != self.layout.dtype and little_endian(rows.dtype) == self.layout.dtype:
            rows = rows.astype(self.layout.dtype)  # stored little-endian, values equal
        data = np.ascontiguousarray(rows).view(np.uint8).reshape(-1)
        self._buffer += data.data
        self.length += data.size // self.layout.row_nbytes
        while self._piece_bytes + len(self._buffer) >= self._block_nbytes:
            take = self._block_nbytes - self._piece_bytes
            block = self._assemble(self._buffer[:take])
            del self._buffer[:take]
            self._upload(block, self.layout)

    def spill(self) -> int:
        """Upload the rows held in memory as a piece of the current block; bytes freed."""
        freed = len(self._buffer)
        if freed:
            self.uploader.put(self._piece_key(len(self._pieces)), bytes(self._buffer))
            self._pieces.append(freed)
            self._piece_bytes += freed
            self._buffer = bytearray()
        return freed

    def _piece_key(self, piece: int) -> str:
        return f"{self.spill_key}/{self._blocks_written}.{piece}"

    def _assemble(self, tail: bytes | bytearray) -> bytes | bytearray:
        """The current block's rows: its pieces, read back, then ``tail``."""
        if not self._pieces:
            return tail
        self.uploader.flush()  # the pieces must have landed before they are read back
        keys = [self._piece_key(piece) for piece in range(len(self._pieces))]
        datas = self.uploader.get_all(keys)
        for key, nbytes, data in zip(keys, self._pieces, datas, strict=True):
            if len(data) != nbytes:
                raise StorageError(
                    f"{self.uploader.store.describe(key)}: a spilled piece of {nbytes} bytes "
                    f"read back as {len(data)} bytes"
                )
        self._pieces.clear()
        self._piece_bytes = 0
        return b"".join([*datas, bytes(tail)])

    def _upload(self, block: bytes | bytearray, layout: ArrayLayout) -> None:
        key = layout.block_key(self.key, self._blocks_written)
        self.uploader.put(key, encode_block(layout, bytes(block)))
        self._blocks_written += 1

    def finish(self, attributes: dict[str, Any] | None = None) -> int:
        # an array that never filled a block is stored as one block of its own length
        layout = self.layout.stored_for(self.length) if not self._blocks_written else self.layout
        rest = self._assemble(self._buffer)
        if rest:
            self._upload(rest, layout)
        self._buffer = bytearray()
        document = array_document(layout, self.length, attributes)
        self.uploader.put(f"{self.key}/zarr.json", dumps(document))
        return self.length


class ShardEncoder(abc.ABC):
    """Turns one appended record into the rows it adds to each array of a shard.

    Storage kinds subclass this. ``encode`` must validate everything before returning, so
    a bad record raises and leaves the shard untouched.
    """

    def initial_rows(self) -> Mapping[str, np.ndarray]:
        """Rows every shard starts with (the leading 0 of an offsets array)."""
        return {}

    @abc.abstractmethod
    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        """The rows ``data`` adds to each array, given each array's current length."""


def check_shard(shard: Any) -> int:
    if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)):
        raise InvalidShardError(f"shard must be a non-negative integer, got {shard!r}")
    shard = int(shard)
    if shard < 0:
        raise InvalidShardError(f"shard must be a non-negative integer, got {shard}")
    return shard


#: What a write does to a dataset already committed at its URL.
MODES = ("create", "overwrite", "append")


def write_mode(overwrite: bool, mode: str | None) -> str:
    """One of ``MODES`` from a writer's ``overwrite`` flag and ``mode`` argument."""
    if mode is None:
        return "overwrite" if overwrite else "create"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if overwrite and mode != "overwrite":
        raise ValueError(f"overwrite=True contradicts mode={mode!r}")
    return mode


@dataclass
class WriteSession:
    """One write of a dataset: a commit id that writers in any process share.

    Picklable: create it in the coordinating process, hand it to workers, let each call
    ``sync_writer()`` for its own shards, then call ``commit()`` once all are closed.

    An append session (``appends_to``: the commit it extends) numbers its writers' shards
    from ``first_shard``, one past the highest shard of that version, and commits a
    version holding the old shards (their data stays where it was written) and the new.
    """

    storage: Storage
    commit_id: str
    overwrite: bool = False
    appends_to: str | None = None
    first_shard: int = 0

    @property
    def prefix(self) -> str:
        return data_prefix(self.commit_id)

    @property
    def mode(self) -> str:
        if self.appends_to is not None:
            return "append"
        return "overwrite" if self.overwrite else "create"

    def sync_writer(
        self, *, part_id: str | None = None, max_buffered_bytes: int | None = None
    ) -> DatasetWriter:
        """A writer for this session; closing it records its part but commits nothing.

        ``part_id`` names the writer's part manifest (a random id by default). A caller
        that may run the same work twice (a retried task) passes an id derived from the
        work itself, so the second run overwrites the first run's part instead of adding
        a conflicting one. ``max_buffered_bytes`` bounds the partial blocks the writer
        keeps in memory (``DEFAULT_MAX_BUFFERED_BYTES``; see the module notes).
        """
        return DatasetWriter(self, part_id=part_id, max_buffered_bytes=max_buffered_bytes)

    def commit(self) -> Manifest:
        """Publish everything the session's closed writers wrote, atomically.

        Raises ``CommitConflictError`` if another write committed the dataset meanwhile
        (this version is then not published), and library errors for every other failure.
        """
        with library_errors(f"committing {self.storage.url}"):
            return run_blocking(self._commit())

    def _appended(self, committed: Manifest | None) -> Manifest | None:
        """The version this append extends, checked to be the one committed now."""
        if self.appends_to is None:
            return None
        where = self.storage.url
        if committed is None or committed.commit_id != self.appends_to:
            found = "no readable version" if committed is None else committed.commit_id
            raise CommitConflictError(
                f"{where}: this append extends version {self.appends_to}, but {found} is "
                f"committed now; its objects under {self.prefix}/ are left for "
                "`rangestream gc` (or session.abort()). Append again to the new version."
            )
        return committed

    def abort(self) -> None:
        """Delete everything written under this session's commit id."""

        async def delete() -> None:
            store = self.storage._new_write_store()
            try:
                await store.delete_prefix(self.prefix)
            finally:
                await store.aclose()

        with library_errors(f"deleting the aborted write {self.storage.url}/{self.prefix}"):
            run_blocking(delete())

    async def _commit(self) -> Manifest:
        storage = self.storage
        store = storage._new_write_store()
        try:
            old_root, version = await _read_root(store)
            exists, previous = old_root is not None, None
            if old_root is not None:
                with contextlib.suppress(MetadataError):  # unreadable: replaced, not chained
                    previous = _parse_bounded_root(old_root, store.describe(ROOT_KEY))
            base = self._appended(previous)
            if base is not None:
                base = await completed(store, base)
            if exists and not self.overwrite and base is None:
                raise DatasetExistsError(
                    f"{storage.url} already holds a committed dataset; "
                    "pass overwrite=True to replace it, or mode='append' to add shards"
                )
            part_keys = sorted(
                key for key in await store.list(f"{self.prefix}/parts") if key.endswith(".json")
            )
            raws = await _bounded(
                [store.get_range(key, 0, MAX_ROOT_BYTES + 1) for key in part_keys]
            )
            owners: dict[int, str] = {}
            shard_lengths: dict[int, dict[str, int]] = {}
            for key, raw in zip(part_keys, raws, strict=True):
                part, schema = _parse_part(raw, store.describe(key))
                if schema is not None:
                    storage = storage._bind_schema(schema, store.describe(key))
                for shard, lengths in part.items():
                    if shard in owners:
                        raise CommitError(
                            f"shard {shard} was written by two writers ({owners[shard]} and "
                            f"{key}); each shard must have exactly one writer"
                        )
                    owners[shard] = key
                    shard_lengths[shard] = lengths
            if base is not None:
                storage = storage._bind_schema(base.schema, store.describe(ROOT_KEY))
            layouts = storage._array_layouts()
            ids = np.asarray(sorted(shard_lengths), dtype=np.int64)
            lengths = {
                name: np.asarray([shard_lengths[int(s)][name] for s in ids], dtype=np.int64)
                for name in layouts
            }
            inherited: dict[str, list[int]] = {}
            if base is not None:
                check_appendable(storage, base)
                ids, lengths, inherited = _extend(base, ids, lengths)
            # when, for people (inspect); readers order versions by the chain, not by time
            extra: dict[str, Any] = {"committed_at": _utc_now()}
            if previous is not None:
                extra["previous_commit_id"] = previous.commit_id
                if previous.inherited:  # kept for its readers too (gc, the next commit)
                    extra["previous_inherited"] = list(previous.inherited)
            schema = storage._committed_schema()
            manifest = Manifest(
                storage.kind, self.commit_id, schema, layouts, ids, lengths, extra, inherited
            )
            groups = (
                "data/zarr.json",
                f"{self.prefix}/zarr.json",
                f"{self.prefix}/shards/zarr.json",
            )
            await _bounded(
                [
                    *(store.put(key, dumps(group_document())) for key in groups),
                    *_index_puts(store, self.prefix, manifest),
                    storage._write_derived_index(store, manifest),
                ]
            )
            with library_errors(f"writing {store.describe(ROOT_KEY)}"):
                root = dumps(manifest.root_document())
                await _publish_root(store, root, version, self.commit_id)
            if previous is not None:
                # Readers may still be on the version just replaced; the one before it goes,
                # with the data it inherited, except what the two live versions still read.
                older = previous.extra.get("previous_commit_id")
                live = {*manifest.commits, *previous.commits}
                if isinstance(older, str):
                    for commit in [older, *previous.extra.get("previous_inherited", [])]:
                        if commit not in live:
                            # leftover objects are garbage, not a failed commit
                            with contextlib.suppress(Exception):
                                await store.delete_prefix(data_prefix(commit))
            return manifest
        finally:
            await store.aclose()


async def _bounded(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Await ``calls`` with at most ``COMMIT_CONCURRENCY`` running at once, results in order.

    A failure cancels the calls still running (``TaskGroup``) and is raised as it is.
    """
    slots = asyncio.Semaphore(COMMIT_CONCURRENCY)

    async def one(call: Coroutine[Any, Any, T]) -> T:
        try:
            async with slots:
                return await call
        finally:
            call.close()  # one cancelled before it started is closed, not left unawaited

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(call)) for call in calls]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


@contextlib.contextmanager
def library_errors(what: str) -> Iterator[None]:
    """Raise the library's own class for an ``OSError`` of the store (``what`` failed).

    Reads already end in library errors (the range reader converts them); on the write
    path a local ``PermissionError`` or ``NotADirectoryError``, or S3's 403 (``retrying``
    passes permanent errors through untouched), reached the caller as a bare builtin.
    ``AccessDeniedError`` is also a ``PermissionError``, and every ``StorageError`` an
    ``OSError``, so code written against the builtins still catches them.
    """
    try:
        yield
    except RangestreamError:
        raise
    except PermissionError as error:
        raise AccessDeniedError(f"{what} was refused: {error}") from error
    except OSError as error:
        raise StorageError(f"{what} failed: {error}") from error


def keep_failure(failure: BaseException, cleanup: BaseException, leftovers: str) -> None:
    """Make ``failure`` carry the error of its clean-up, which failed too.

    The write's own failure is what its caller must see; the clean-up's becomes its
    context (unless that already holds another error) and a note says where the
    leftovers are.
    """
    if cleanup.__context__ is failure:
        cleanup.__context__ = None  # no cycle between the two
    if failure.__context__ is None or failure.__context__ is failure.__cause__:
        failure.__context__ = cleanup  # the cause, if any, still tells where it came from
    failure.add_note(
        f"cleaning up after this failure failed too ({type(cleanup).__name__}: {cleanup}); "
        f"the objects under {leftovers} are left for `rangestream gc`"
    )


async def read_committed(store: ObjectStore) -> tuple[bool, Manifest | None]:
    """Whether a root document exists, and its manifest if it is a readable one.

    Reads at most ``MAX_ROOT_BYTES + 1`` bytes, as readers do: a root beyond the cap is
    unreadable metadata, not a reason to hold gigabytes.
    """
    with library_errors(f"reading {store.describe(ROOT_KEY)}"):
        try:
            raw = await store.get_range(ROOT_KEY, 0, MAX_ROOT_BYTES + 1)
        except FileNotFoundError:
            return False, None
    try:
        return True, await completed(store, _parse_bounded_root(raw, store.describe(ROOT_KEY)))
    except CorruptDataError:
        return True, None


async def completed(store: ObjectStore, manifest: Manifest) -> Manifest:
    """``manifest`` with its shard ids and lengths, read from ``index/shards`` if the root
    does not list them (an append numbers its shards after them and lists them all)."""
    if manifest.complete:
        return manifest
    reader = RangeReader(store)
    return await RemoteExecutor(reader, verify=True).run(read_shard_table(manifest, store.describe))


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def unwrapped(store: ObjectStore) -> ObjectStore:
    """The store whose own methods count: a ``RetryingStore``'s inner one.

    ``RetryingStore`` retries the basic calls; for conditional writes and listings with
    sizes the inner store's implementation is the real one, retried with ``retried``.
    """
    return store.inner if isinstance(store, RetryingStore) else store


async def retried(
    store: ObjectStore, what: str, call: Callable[[], Awaitable[T]], key: str = ROOT_KEY
) -> T:
    """``call()`` with the retries of ``store`` if it is a ``RetryingStore``."""
    if isinstance(store, RetryingStore):
        where = f"{what} {store.describe(key)}"
        return await retrying(store.policy, random.Random(), lambda _attempt: call(), where)
    return await call()


async def _read_root(store: ObjectStore) -> tuple[bytes | None, str | None]:
    """The root document (at most the cap and one byte) and its version; ``None``s if absent."""
    target = unwrapped(store)
    try:
        return await retried(
            store, "get", lambda: target.get_versioned(ROOT_KEY, MAX_ROOT_BYTES + 1)
        )
    except FileNotFoundError:
        return None, None


async def _publish_root(
    store: ObjectStore, document: bytes, version: str | None, commit_id: str
) -> None:
    """Write the root only over the version the commit read, and make sure it stayed.

    The write is conditional (S3 ``If-Match`` / ``If-None-Match``, a lock and a rename on
    local disk); a store without conditional writes checks, then writes. Either way the
    root is read back: another commit that replaced this one without having seen it (a
    store that ignores the condition, or the check-then-write race) is caught there.
    Raises ``CommitConflictError`` naming the version that won.
    """
    target, refused = unwrapped(store), False
    try:
        await retried(
            store,
            "put",
            lambda: target.put_if_version(ROOT_KEY, document, version, MAX_ROOT_BYTES + 1),
        )
    except ConcurrentWriteError:
        refused = True  # or a retried write whose first attempt went through: read back
    found, _ = await _read_root(store)
    if found == document:
        return
    where = store.describe(ROOT_KEY)
    winner = None
    if found is not None:
        with contextlib.suppress(MetadataError):
            winner = _parse_bounded_root(found, where)
    if not refused and winner is not None and winner.extra.get("previous_commit_id") == commit_id:
        return  # committed, then replaced by a later write that saw this version
    other = f"commit {winner.commit_id}" if winner is not None else "another write"
    how = (
        "while this commit ran"
        if refused
        else "right after this commit, without seeing it (the store has no conditional writes)"
    )
    raise CommitConflictError(
        f"{where}: {other} was published {how}, so commit {commit_id} is not the dataset's "
        f"version; its objects under {data_prefix(commit_id)}/ are left for `rangestream gc` "
        "(or session.abort()). Write again to replace the other version."
    )


def _parse_bounded_root(raw: bytes, where: str) -> Manifest:
    if len(raw) > MAX_ROOT_BYTES:
        raise MetadataError(f"{where} is larger than the {MAX_ROOT_BYTES}-byte metadata cap")
    return parse_root(raw, where)


def _index_puts(
    store: ObjectStore, prefix: str, manifest: Manifest
) -> list[Coroutine[Any, Any, None]]:
    """The puts of ``index/``: the shard table (one row per shard: its id and each array's
    rows), which readers read at open when the root does not list the shards, and the same
    numbers one array per column (``shard_ids``, ``<array>_length``, as version 1 wrote
    them), for readers that know only Zarr."""
    int64 = np.dtype("<i8")
    puts = [store.put(f"{prefix}/index/zarr.json", dumps(group_document()))]
    table = manifest.table_rows()
    arrays: list[tuple[str, ArrayLayout, np.ndarray, dict[str, Any]]] = [
        (
            SHARD_TABLE.removeprefix("index/"),
            manifest.table_layout,
            table,
            {"rangestream_columns": manifest.table_columns},
        ),
        ("shard_ids", _column_layout(), table[:, 0], {}),
    ]
    for i, name in enumerate(manifest.arrays):
        arrays.append((f"{name}_length", _column_layout(), table[:, 1 + i], {}))
    for name, layout, values, attributes in arrays:
        key = f"{prefix}/index/{name}"
        data = np.ascontiguousarray(values, dtype=int64)
        for block in range(layout.num_blocks(len(data))):
            rows = data[block * layout.block_rows : (block + 1) * layout.block_rows]
            encoded = encode_block(layout, rows.view(np.uint8))
            puts.append(store.put(layout.block_key(key, block), encoded))
        document = array_document(layout, len(data), attributes)
        puts.append(store.put(f"{key}/zarr.json", dumps(document)))
    return puts


def _column_layout() -> ArrayLayout:
    return ArrayLayout.for_sizes(np.dtype("<i8"), (), chunk_bytes=64 * 1024, block_bytes=1 << 22)


def _parse_part(raw: bytes, where: str) -> tuple[dict[int, dict[str, int]], dict[str, Any] | None]:
    """A part's shard lengths, and the schema its writer bound (``Storage._bind_record``)."""
    try:
        if len(raw) > MAX_ROOT_BYTES:
            raise ValueError(f"larger than the {MAX_ROOT_BYTES}-byte metadata cap")
        document = json.loads(raw)
        shards = document["shards"]
        schema = document.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError("schema must be an object")
        return {
            int(shard): {str(name): int(length) for name, length in lengths.items()}
            for shard, lengths in shards.items()
        }, schema
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise CommitError(f"part manifest {where} is unreadable: {error}") from error


class DatasetWriter:
    """Appends records to shards of one write session.

    Use as a context manager. Shards may be appended to in any order and interleaved; each
    shard's records keep their append order. On a clean exit the writer uploads what it
    buffered and records its part; an exception inside the ``with`` block discards it.

    Memory: at most ``max_buffered_bytes`` of partial blocks (default
    ``DEFAULT_MAX_BUFFERED_BYTES``), whatever the number of shards, plus the blocks being
    uploaded (``MAX_PENDING_UPLOADS``); see the module notes for what spilling costs.
    """

    def __init__(
        self,
        session: WriteSession,
        *,
        part_id: str | None = None,
        max_buffered_bytes: int | None = None,
    ) -> None:
        if part_id is not None and (
            not isinstance(part_id, str) or not _PART_ID.match(part_id) or part_id in {".", ".."}
        ):
            raise ValueError(
                f"part_id must be 1-128 characters of A-Z, a-z, 0-9, '_', '.', '-', got {part_id!r}"
            )
        if max_buffered_bytes is None:
            max_buffered_bytes = DEFAULT_MAX_BUFFERED_BYTES
        if (
            isinstance(max_buffered_bytes, bool)
            or not isinstance(max_buffered_bytes, int)
            or (max_buffered_bytes < 0)
        ):
            raise ValueError(
                f"max_buffered_bytes must be a non-negative integer, got {max_buffered_bytes!r}"
            )
        self.session = session
        self.storage = session.storage
        self.part_id = part_id if part_id is not None else uuid.uuid4().hex
        self.max_buffered_bytes = max_buffered_bytes
        self._store = self.storage._new_write_store()
        self._uploader = _Uploader(self._store)
        self._layouts = self.storage._array_layouts()
        #: Shards by their last append, least recent first (the first to spill).
        self._shards: OrderedDict[int, tuple[ShardEncoder, dict[str, _ArrayWriter]]] = OrderedDict()
        self._buffered = 0
        self._spilled = False
        self._closed = False
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def spill_prefix(self) -> str:
        """Where this writer's spilled pieces go (deleted when it closes)."""
        return f"{self.session.prefix}/spill/{self.part_id}"

    @property
    def buffered_bytes(self) -> int:
        """Bytes of partial blocks held in memory now, all shards together."""
        return self._buffered

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def append(self, shard: int, data: Any) -> None:
        """Append one record to ``shard``; validation happens before anything is written.

        In an append session, shard numbers count from the first new shard: shard ``k``
        is stored as ``session.first_shard + k``.
        """
        if self._closed:
            raise WriterClosedError("append on a closed writer")
        shard = check_shard(shard) + self.session.first_shard
        with self._lock:
            storage, layouts = self.storage, self._layouts
            if not self._shards:
                # the first record may fix the schema (kept only once it is encoded)
                storage = self.storage._bind_record(data)
                if storage is not self.storage:
                    layouts = storage._array_layouts()
            entry = self._shards.get(shard)
            if entry is None:
                encoder = storage._shard_encoder()
                initial = encoder.initial_rows()
                lengths = {name: len(initial.get(name, ())) for name in layouts}
                rows_by_array = encoder.encode(data, lengths)
                prefix = shard_prefix(self.session.commit_id, shard)
                spill = f"{self.spill_prefix}/{shard}"
                writers = {
                    name: _ArrayWriter(
                        f"{prefix}/{name}", layout, self._uploader, f"{spill}/{name}"
                    )
                    for name, layout in layouts.items()
                }
                for name, rows in initial.items():
                    writers[name].append(rows)
                entry = self._shards[shard] = (encoder, writers)
                self.storage, self._layouts = storage, layouts
            else:
                self._shards.move_to_end(shard)
                encoder, writers = entry
                lengths = {name: writer.length for name, writer in writers.items()}
                rows_by_array = encoder.encode(data, lengths)
            with library_errors(f"writing to {self.storage.url}"):
                before = sum(writer.buffered for writer in entry[1].values())
                for name, rows in rows_by_array.items():
                    entry[1][name].append(rows)
                self._buffered += sum(writer.buffered for writer in entry[1].values()) - before
                if self._buffered > self.max_buffered_bytes:
                    self._spill()

    def _spill(self) -> None:
        """Upload partial blocks of the least recently appended shards until within budget."""
        for _, writers in self._shards.values():
            for writer in writers.values():
                freed = writer.spill()
                if freed:
                    self._buffered -= freed
                    self._spilled = True
            if self._buffered <= self.max_buffered_bytes:
                return

    def close(self) -> None:
        """Upload the rest, write array metadata and this writer's part manifest."""
        if self._closed:
            return
        self._closed = True
        with library_errors(f"writing to {self.storage.url}"):
            self._finish()

    def _finish(self) -> None:
        try:
            shards: dict[str, dict[str, int]] = {}
            for shard, (_encoder, writers) in sorted(self._shards.items()):
                lengths = {name: writer.finish(self.storage._array_attributes(name))
                           for name, writer in writers.items()}  # fmt: skip
                prefix = shard_prefix(self.session.commit_id, shard)
                self._uploader.put(f"{prefix}/zarr.json", dumps(group_document()))
                shards[str(shard)] = lengths
            self._buffered = 0
            part: dict[str, Any] = {"part_id": self.part_id, "shards": shards}
            if self.storage is not self.session.storage:
                part["schema"] = self.storage._schema()  # bound by the first record
            # the part says "this writer's data is complete": it must land after the data
            self._uploader.flush()
            if self._spilled:  # every piece has been read back into its block by now
                self._uploader.delete_prefix(self.spill_prefix)
            self._uploader.put(
                f"{self.session.prefix}/parts/{self.part_id}.json", json.dumps(part).encode()
            )
            self._uploader.flush()
        except BaseException:
            self._uploader.drop()
            raise
        finally:
            self._close_store()

    def discard(self) -> None:
        """Forget everything this writer buffered; its uploaded blocks stay uncommitted."""
        self._closed = True
        self._uploader.drop()
        self._close_store()

    def _close_store(self) -> None:
        if isinstance(self._store, LocalStore):
            self._store.close_files()
        elif self._pid == os.getpid():
            run_blocking(self._store.aclose())


class CommittingWriter(DatasetWriter):
    """The single-process writer: commits on a clean exit, deletes its objects otherwise.

    When the deletion fails too, the write's own failure is raised, carrying the
    deletion's error as context; the objects left behind are found by ``rangestream gc``.
    """

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        super().discard()
        self._abort_after(exc)  # the with block's exception propagates, not the abort's

    def close(self) -> None:
        if self._closed:
            return
        try:
            super().close()
            self.session.commit()
        except BaseException as failure:
            self._abort_after(failure)
            raise

    def discard(self) -> None:
        super().discard()
        self.session.abort()

    def _abort_after(self, failure: BaseException) -> None:
        try:
            self.session.abort()
        except Exception as cleanup:
            keep_failure(failure, cleanup, f"{self.storage.url}/{self.session.prefix}/")


def new_session(storage: Storage, overwrite: bool, base: Manifest | None = None) -> WriteSession:
    """A session with a fresh commit id; with ``base``, one that appends to that version."""
    if base is None:
        return WriteSession(storage, uuid.uuid4().hex, overwrite)
    first = int(base.shard_ids[-1]) + 1 if len(base.shard_ids) else 0
    return WriteSession(storage, uuid.uuid4().hex, False, base.commit_id, first)


def check_appendable(storage: Storage, base: Manifest) -> None:
    """Refuse to append ``storage``'s records to ``base``: another kind, format or layout.

    Every shard of a version shares one layout per array, so the appended shards must be
    cut as the committed ones were.
    """
    where = storage.url
    if base.kind != storage.kind:
        raise SchemaMismatchError(
            f"{where} holds a {base.kind!r} dataset; a {storage.kind!r} write cannot append to it"
        )
    check_appendable_version(base, where)
    storage._check_schema(base)
    layouts = storage._array_layouts()
    if set(layouts) != set(base.arrays):
        raise SchemaMismatchError(
            f"{where} stores arrays {sorted(base.arrays)}, the appended records {sorted(layouts)}"
        )
    for name, layout in layouts.items():
        stored = base.arrays[name]
        if layout != stored:
            raise SchemaMismatchError(
                f"{where}: array {name!r} is stored as {stored}, the appended shards would be "
                f"{layout}; append with the chunk_bytes and block_bytes of the first write"
            )


def check_appendable_version(base: Manifest, where: str) -> None:
    """Refuse to append to a version 1 dataset: its arrays of one block are stored with
    full blocks, which a version 2 manifest would misdescribe (``Manifest.stored_layout``)."""
    if base.format_version < 2:
        raise SchemaMismatchError(
            f"{where} holds a format_version {base.format_version} dataset, which cannot be "
            "appended to; write it again with this library (format_version 2), then append"
        )


def appending_storage(storage: Storage, base: Manifest) -> Storage:
    """``storage``, with layout options that cut arrays as ``base`` stores them if its own
    do not (the first write chose other sizes): appended shards must match."""
    check_appendable_version(base, storage.url)
    if storage._array_layouts() == base.arrays:
        return storage
    for layout in base.arrays.values():
        chunk = layout.chunk_nbytes
        block = layout.chunks_per_block * (chunk + 20) + 4  # for_sizes, inverted
        candidate = copy.copy(storage)  # temporal layouts, bound by records, never match
        candidate.layout_options = LayoutOptions(chunk, max(block, chunk), layout.dense_chunks)
        if candidate._array_layouts() == base.arrays:
            return candidate
    return storage  # the commit says what differs


def _extend(
    base: Manifest, ids: np.ndarray, lengths: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list[int]]]:
    """Shard ids, lengths and inherited shards of ``base`` followed by the new shards."""
    if len(ids) and len(base.shard_ids) and int(ids[0]) <= int(base.shard_ids[-1]):
        raise CommitError(
            f"appended shard {int(ids[0])} is not after the last shard "
            f"{int(base.shard_ids[-1])} of the version it extends"
        )
    inherited = {commit: list(shards) for commit, shards in base.inherited.items()}
    own = sorted(set(base.shard_ids.tolist()) - {s for v in inherited.values() for s in v})
    if own:
        inherited[base.commit_id] = own
    merged = {
        name: np.concatenate([base.lengths[name], values]).astype(np.int64)
        for name, values in lengths.items()
    }
    return np.concatenate([base.shard_ids, ids]).astype(np.int64), merged, inherited


ShardEncoderFactory = Callable[[], ShardEncoder]
