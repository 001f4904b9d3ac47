"""Writing a dataset: sessions, the writers that append records to shards, part manifests.

A write is a *session* with a fresh commit id: every object goes under
``data/<commit_id>/``, invisible to readers. Each writer (one per process when writing in
parallel) owns distinct shards and, on a clean close, records what it wrote in a part
manifest; ``commit.py`` publishes the parts as one version. A writer's memory is bounded
by a budget (``max_buffered_bytes``), not by the number of shards it owns
(``block_uploads.py`` says what spilling costs). Every error a caller can cause here ends
in the library's exception classes.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import InvalidShardError, WriterClosedError
from rangestream.io.local import LocalStore
from rangestream.io.process import run_blocking
from rangestream.layout.manifest import Manifest, data_prefix, shard_prefix
from rangestream.layout.zarr_json import dumps, group_document
from rangestream.storage.core.block_uploads import ArrayWriter, Uploader
from rangestream.storage.core.commit import commit_session
from rangestream.storage.core.kill_points import kill_point
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.core.live_versions import live_commits
from rangestream.storage.core.parts import part_document
from rangestream.storage.core.store_errors import keep_failure, library_errors

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind


#: Default bound on the bytes of partial blocks one writer keeps in memory, all its shards
#: together (64 partial blocks of 4 MiB); beyond, the least recently appended shards'
#: partial blocks are uploaded as pieces and dropped from memory.
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
#: What a caller-chosen part id may be: it becomes the object name ``parts/<id>.json``.
_PART_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


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

    storage: StorageKind
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
        keeps in memory (``DEFAULT_MAX_BUFFERED_BYTES``; ``block_uploads`` says what
        spilling costs).
        """
        return DatasetWriter(self, part_id=part_id, max_buffered_bytes=max_buffered_bytes)

    def commit(self, *, check_objects: bool = True) -> Manifest:
        """Publish everything the session's closed writers wrote, atomically.

        Raises ``CommitConflictError`` if another write committed the dataset meanwhile
        (this version is then not published), ``CommitError`` if an object the version
        names is missing (deleted since its writer wrote it), and library errors for every
        other failure. ``check_objects=False`` skips that check, for parts that claim
        shards without objects on purpose (tests and benchmarks of the commit's cost).
        """
        with library_errors(f"committing {self.storage.url}", self.storage.url):
            return run_blocking(
                commit_session(
                    self.storage,
                    self.commit_id,
                    self.overwrite,
                    self.appends_to,
                    check_objects=check_objects,
                )
            )

    def abort(self) -> None:
        """Delete everything written under this session's commit id.

        Unless the dataset reads it: a commit that failed after its root was published
        (a read-back that timed out) is the dataset now, and so is a version an append
        inherits from. Then, or when the root cannot be read to tell, nothing is deleted.
        """

        async def delete() -> None:
            store = self.storage.new_write_store()
            try:
                live = await live_commits(store)
                if live is not None and self.commit_id not in live:
                    await store.delete_prefix(self.prefix)
            finally:
                await store.aclose()

        with library_errors(f"deleting the aborted write {self.storage.url}/{self.prefix}"):
            run_blocking(delete())


class DatasetWriter:
    """Appends records to shards of one write session.

    Use as a context manager. Shards may be appended to in any order and interleaved; each
    shard's records keep their append order. On a clean exit the writer uploads what it
    buffered and records its part; an exception inside the ``with`` block discards it.

    Memory: at most ``max_buffered_bytes`` of partial blocks (default
    ``DEFAULT_MAX_BUFFERED_BYTES``), whatever the number of shards, plus the blocks being
    uploaded (``MAX_PENDING_UPLOADS``); ``block_uploads`` says what spilling costs.
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
        self._store = self.storage.new_write_store()
        self._uploader = Uploader(self._store)
        self._layouts = self.storage.array_layouts()
        #: Shards by their last append, least recent first (the first to spill).
        self._shards: OrderedDict[int, tuple[ShardEncoder, dict[str, ArrayWriter]]] = OrderedDict()
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
                storage = self.storage.bind_record(data)
                if storage is not self.storage:
                    layouts = storage.array_layouts()
            entry = self._shards.get(shard)
            if entry is None:
                encoder = storage.shard_encoder()
                initial = encoder.initial_rows()
                lengths = {name: len(initial.get(name, ())) for name in layouts}
                rows_by_array = encoder.encode(data, lengths)
                prefix = shard_prefix(self.session.commit_id, shard)
                spill = f"{self.spill_prefix}/{shard}"
                writers = {
                    name: ArrayWriter(f"{prefix}/{name}", layout, self._uploader, f"{spill}/{name}")
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
            with library_errors(f"writing to {self.storage.url}", self.storage.url):
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
        with library_errors(f"writing to {self.storage.url}", self.storage.url):
            self._finish()

    def _finish(self) -> None:
        try:
            shards: dict[int, dict[str, int]] = {}
            for shard, (_encoder, writers) in sorted(self._shards.items()):
                lengths = {name: writer.finish(self.storage.array_attributes(name))
                           for name, writer in writers.items()}  # fmt: skip
                prefix = shard_prefix(self.session.commit_id, shard)
                self._uploader.put(f"{prefix}/zarr.json", dumps(group_document()))
                shards[shard] = lengths
            self._buffered = 0
            # bound by the first record, if the kind binds one
            schema = (
                self.storage.kind_schema() if self.storage is not self.session.storage else None
            )
            # the part says "this writer's data is complete": it must land after the data
            self._uploader.flush()
            if self._spilled:  # every piece has been read back into its block by now
                self._uploader.delete_prefix(self.spill_prefix)
            kill_point("data-written")
            self._uploader.put(
                f"{self.session.prefix}/parts/{self.part_id}.json",
                part_document(self.part_id, shards, schema),
            )
            self._uploader.flush()
            kill_point("part-written")
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


def new_session(
    storage: StorageKind, overwrite: bool, base: Manifest | None = None
) -> WriteSession:
    """A session with a fresh commit id; with ``base``, one that appends to that version."""
    if base is None:
        return WriteSession(storage, uuid.uuid4().hex, overwrite)
    first = int(base.shard_ids[-1]) + 1 if len(base.shard_ids) else 0
    return WriteSession(storage, uuid.uuid4().hex, False, base.commit_id, first)


ShardEncoderFactory = Callable[[], ShardEncoder]
