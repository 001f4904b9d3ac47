"""What every storage kind shares: its URL and options, opening, writing and reading.

A storage object is a cheap, picklable description (URL, format, options). It opens
nothing until a reader or writer is made, so it can be built in a parent process and
handed to DataLoader workers; every worker opens its own store, event loop and sessions.
"""

from __future__ import annotations

import abc
import copy
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rangestream.errors import DatasetExistsError, MetadataError, SchemaMismatchError
from rangestream.io.local import LocalStore
from rangestream.io.process import run_blocking
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.store import ObjectStore
from rangestream.io.stores import is_local_url, open_store
from rangestream.layout.block import ArrayLayout
from rangestream.layout.dtypes import little_endian
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.storage.core.appending import appending_storage
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.core.opening import Opening
from rangestream.storage.core.options import LayoutOptions, split_options
from rangestream.storage.core.root import read_committed
from rangestream.storage.core.writing import (
    CommittingWriter,
    WriteSession,
    new_session,
    write_mode,
)

if TYPE_CHECKING:
    from rangestream.layout.executors import Program
    from rangestream.storage.core.opening import OpenedStorage
    from rangestream.storage.core.readers import AsyncReader, SyncReader

__all__ = ["Storage"]


class Storage(abc.ABC):
    """Base of the storage kinds: a cheap, picklable description of one dataset.

    Nothing is opened until a reader or writer is made, so a storage can be built in a
    parent process and handed to DataLoader workers: each process opens the committed
    version itself (``rangestream.storage.core.opening``), once, and readers in it are faces
    of that opened version. It implements ``StorageKind`` (``storage.core.kind``), the
    contract the lifecycle modules (opening, readers, writing, the commit) hold it to.

    Parameters
    ----------
    url
        A local path (``str`` or ``pathlib.Path``), ``file://``, ``s3://bucket/prefix``,
        ``memory://name`` or any other fsspec URL.
    storage_options
        fsspec options, e.g. ``{"client_kwargs": {"endpoint_url": ...}}`` for MinIO;
        credentials in here never appear in reprs or error messages.
    notes
        JSON facts that new writes record in the dataset's schema beside the kind's own
        keys, e.g. what produced the data (``convert`` records its preset and tokenizer
        under ``"ingest"``). Readers ignore them; ``rangestream inspect`` shows the schema.
    **options
        Read options (``max_concurrency``, ``coalesce_gap``, ``max_coalesced_bytes``,
        ``retry``, ``verify_checksums``, ``mapped``; see ``ReadOptions``, or pass
        ``read_options=ReadOptions(...)``) and layout options of new writes
        (``chunk_bytes``, ``block_bytes``, ``dense_chunks``; see ``LayoutOptions``).
        Readers take the layout from the stored metadata.
    """

    kind: ClassVar[str] = ""
    #: Layout options of new writes when the caller gives none.
    default_layout: ClassVar[LayoutOptions] = LayoutOptions()

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        notes: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str) or not url:
            raise TypeError(f"url must be a non-empty str or os.PathLike, got {url!r}")
        read, layout, unknown = split_options(options, self.default_layout)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s) {sorted(unknown)}"
            )
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.read_options = read
        self.layout_options = layout
        self.notes = _checked_notes(notes)
        #: The version this process opened for reads made on the storage itself (its
        #: ``len``, a dataset's sizes, ``zarr_group``); readers open their own.
        self.default_opening: Opening = Opening(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __bool__(self) -> bool:  # a description: never let a truth test open it via __len__
        return True

    # -- options, as attributes -------------------------------------------------------------
    @property
    def chunk_bytes(self) -> int:
        return self.layout_options.chunk_bytes

    @property
    def block_bytes(self) -> int:
        return self.layout_options.block_bytes

    @property
    def dense_chunks(self) -> bool:
        return self.layout_options.dense_chunks

    @property
    def max_concurrency(self) -> int:
        return self.read_options.max_concurrency

    @property
    def coalesce_gap(self) -> int:
        return self.read_options.coalesce_gap

    @property
    def retry(self) -> RetryPolicy:
        return self.read_options.retry

    @property
    def verify_checksums(self) -> bool:
        return self.read_options.verify_checksums

    @property
    def is_local(self) -> bool:
        """Whether reads go to local files, where a sync ``pread`` beats any event loop."""
        return is_local_url(self.url)

    def preload_readers(self) -> None:
        """Import the client code that reading this storage needs, without opening it.

        ``StatefulDataLoader`` calls it before its workers fork, so that forked workers do
        not each import the S3 client before their first batch.
        """
        self.new_store().preload()

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

    # -- reading ------------------------------------------------------------------------
    #: The class of this kind's opened version (its read programs).
    opened_class: ClassVar[type[OpenedStorage]]
    sync_reader_class: ClassVar[type[SyncReader]]
    async_reader_class: ClassVar[type[AsyncReader]]

    def sync_reader(self) -> Any:
        """A reader that blocks; on a local path it reads with ``pread`` or mapped blocks."""
        return self.sync_reader_class(self)

    def async_reader(self) -> Any:
        """A reader for ``async with``; its reads run on the loop that awaits them."""
        return self.async_reader_class(self)

    def zarr_group(self) -> Any:
        """The committed version as a read-only ``zarr.Group`` (needs ``rangestream[zarr]``).

        Every stored array is plain Zarr v3; this hands zarr-python the group of the version
        the root names, ``data/<commit>``: ``group["shards/0/stream"][:10]``.
        """
        from rangestream.storage.core.zarr_view import open_zarr_group

        return open_zarr_group(self, self.default_opening)

    def reading_format(self, manifest: Manifest) -> Any:
        """The format reads decode with: the one given, else the one the store describes."""
        return None

    def open_index(self, manifest: Manifest) -> Program[Any]:
        """What opening reads after the root document (a kind's compact index), if anything.

        A read program (``rangestream.layout.executors``) whose result is handed to the
        kind's opened class; most kinds need nothing more than the root.
        """
        return None
        yield  # a generator that yields nothing

    # -- what each kind supplies (the StorageKind members it overrides) ---------------
    @abc.abstractmethod
    def array_layouts(self) -> dict[str, ArrayLayout]:
        """The arrays every shard of a new write has, and their layouts."""

    def array_attributes(self, name: str) -> dict[str, Any]:
        return {}

    def _writing_format(self) -> Any:
        """The ``storage_format`` of a kind that takes one, which writing cannot do without
        (reading can: it takes the format the dataset records)."""
        storage_format = getattr(self, "storage_format", None)
        if storage_format is None:
            raise TypeError(
                f"{type(self).__name__}({self.url!r}) was made without a format: it reads "
                "what the dataset records, but writing needs the storage_format"
            )
        return storage_format

    def kind_schema(self) -> dict[str, Any]:
        return {}

    def committed_schema(self) -> dict[str, Any]:
        """The schema a commit stores: the kind's (``kind_schema``) and the caller's ``notes``."""
        schema = self.kind_schema()
        clash = sorted(set(schema) & set(self.notes))
        if clash:
            raise ValueError(
                f"notes {clash} would replace keys of the {self.kind} schema; use other names"
            )
        return {**schema, **self.notes}

    def check_schema(self, manifest: Manifest) -> None:  # noqa: B027 - optional hook
        """Raise ``SchemaMismatchError`` if the caller's format differs from the stored one."""

    @abc.abstractmethod
    def shard_encoder(self) -> ShardEncoder:
        """A fresh encoder for one shard of a writer."""

    def bind_record(self, data: Any) -> Storage:
        """The storage that writes ``data`` and every later record of one writer.

        Kinds whose schema comes from the first record written (``TemporalArrayStorage``)
        validate ``data`` and return a copy with that schema fixed; the writer then takes its
        array layouts and encoders from the copy and records its schema in its part.
        """
        return self

    def bind_schema(self, schema: dict[str, Any], where: str) -> Storage:
        """The storage that commits parts whose writers recorded ``schema`` (from ``where``).

        Called once per part that carries a schema (see ``bind_record``); a kind raises
        ``SchemaMismatchError`` if ``schema`` differs from one it is already bound to.
        """
        return self

    async def write_derived_index(  # noqa: B027 - optional hook
        self, store: ObjectStore, manifest: Manifest
    ) -> None:
        """Write index arrays computed from the written shards, before the commit publishes.

        Kinds whose readers need a compact index of the whole dataset at open override this
        (``TemporalArrayStorage``: every record's frame end, one small array).
        """

    # -- stores -------------------------------------------------------------------------
    def new_store(self) -> ObjectStore:
        return open_store(self.url, self.storage_options)

    def new_write_store(self) -> ObjectStore:
        """The store for writers and commits: remote calls retried like range reads."""
        store = self.new_store()
        if isinstance(store, LocalStore):  # local errors are not transient
            return store
        return RetryingStore(store, self.retry)

    # -- writing ------------------------------------------------------------------------
    def parallel_write(self, *, overwrite: bool = False, mode: str | None = None) -> WriteSession:
        """Start a write that several processes share, each owning distinct shards.

        Hand the returned session to each worker; there, ``with session.sync_writer() as
        w: w.append(shard, record)``. When all workers are done, ``session.commit()``
        publishes the dataset in one atomic step.

        Parameters
        ----------
        overwrite
            Replace a dataset already committed at the URL (``mode="overwrite"``).
        mode
            ``"create"`` (the default: refuse an existing dataset), ``"overwrite"``, or
            ``"append"``: add the written shards to the committed version as a new version.
            Shard ``k`` of an append is stored as shard ``session.first_shard + k``; the old
            shards are not copied, readers of the old version are unaffected, and the
            records must have the kind, format and layout of the stored ones. Appending
            to a URL without a dataset creates it.
        """
        mode = write_mode(overwrite, mode)
        if mode == "overwrite":
            return new_session(self, True)
        exists, manifest = run_blocking(self._probe())
        if exists and mode == "create":
            raise DatasetExistsError(
                f"{self.url} already holds a committed dataset; pass overwrite=True "
                "(--overwrite) to replace it, or mode='append' (--append) to add shards to it"
            )
        if not exists:
            return new_session(self, False)
        if manifest is None:
            raise MetadataError(
                f"{self.url}/{ROOT_KEY} cannot be read, so there is no version to append to"
            )
        return new_session(self.appending_to(manifest), False, manifest)

    def appending_to(self, manifest: Manifest) -> Storage:
        """This storage, ready to append shards to ``manifest``'s version."""
        if manifest.kind != self.kind:
            raise SchemaMismatchError(
                f"{self.url} holds a {manifest.kind!r} dataset; a {self.kind!r} write "
                "cannot append to it"
            )
        storage: Storage = self
        if getattr(self, "storage_format", False) is None:  # take the recorded format
            storage = copy.copy(self)
            storage.storage_format = self.reading_format(manifest)  # type: ignore[attr-defined]
        storage.check_schema(manifest)
        return appending_storage(storage, manifest)

    async def _probe(self) -> tuple[bool, Manifest | None]:
        store = self.new_write_store()
        try:
            return await read_committed(store)
        finally:
            await store.aclose()

    def sync_writer(self, *, overwrite: bool = False, mode: str | None = None) -> CommittingWriter:
        """A writer that commits the dataset when its ``with`` block exits cleanly.

        ``mode="append"`` adds its shards to the committed version (see ``parallel_write``).
        """
        return CommittingWriter(self.parallel_write(overwrite=overwrite, mode=mode))

    def exists(self) -> bool:
        """Whether a committed dataset is at the URL."""
        return run_blocking(self._probe())[0]


#: Bound on the serialized ``notes`` of a storage: facts about the data, not data.
MAX_NOTES_BYTES = 1 << 20


def _checked_notes(notes: Mapping[str, Any] | None) -> dict[str, Any]:
    if notes is None:
        return {}
    if not isinstance(notes, Mapping) or not all(isinstance(k, str) for k in notes):
        raise TypeError(f"notes must be a mapping with str keys, got {type(notes).__name__}")
    try:
        size = len(json.dumps(dict(notes)))
    except (TypeError, ValueError) as error:
        raise TypeError(f"notes must be JSON-serializable: {error}") from error
    if size > MAX_NOTES_BYTES:
        raise ValueError(f"notes are {size} bytes serialized, more than {MAX_NOTES_BYTES}")
    return dict(notes)
