"""The contract between the storage lifecycle and a storage kind.

Opening, reading, writing, appending and committing (the other modules of
``storage.core``) are one machine for every kind; what differs between a stream, a
document store and temporal records is what ``StorageKind`` names: which arrays a shard
has and how a record becomes their rows, what schema is stored and checked, and what a
kind reads at open beyond the root document. The lifecycle modules take a
``StorageKind``, not the concrete ``Storage`` (``storage.core.base``), so they sit below
it: ``Storage`` builds on them and every kind (``storage.stream``, ``storage.document``,
``storage.temporal``) builds on ``Storage``.

``ShardEncoder`` is here too, since it is what a kind hands the writer for each shard.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from rangestream.io.store import ObjectStore
    from rangestream.layout.block import ArrayLayout
    from rangestream.layout.executors import Program
    from rangestream.layout.manifest import Manifest
    from rangestream.storage.core.options import LayoutOptions, ReadOptions

__all__ = ["ShardEncoder", "StorageKind"]


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


class StorageKind(Protocol):
    """What the lifecycle (opening, readers, writers, appends, the commit) asks of a kind.

    ``Storage`` implements every member; a kind overrides the ones its data needs. Each
    member says below which part of the lifecycle needs it, and why.
    """

    # -- what it is, where it is --------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The kind's name in the root document: opening refuses a dataset of another kind
        and an append refuses to extend one."""

    @property
    def url(self) -> str:
        """Where the dataset is; every error message of the lifecycle names it."""

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options, for tools that open the store their own way
        (``storage.core.zarr_view`` hands them to zarr-python)."""

    @property
    def read_options(self) -> ReadOptions:
        """How opening builds the range reader (concurrency, coalescing, retries, checksums,
        mapped local blocks)."""

    #: The layout options of new writes; an append assigns them on a copy of the kind so
    #: the appended shards are cut as the committed ones were (``storage.core.appending``).
    layout_options: LayoutOptions

    # -- stores ---------------------------------------------------------------------------------
    def new_store(self) -> ObjectStore:
        """A fresh store for reads: opening makes one per opened version (per process)."""

    def new_write_store(self) -> ObjectStore:
        """A fresh store for writers, commits, aborts and the ingest pipeline: remote calls
        retried like range reads, local ones not (local errors are not transient)."""

    # -- opening and reading --------------------------------------------------------------------
    @property
    def opened_class(self) -> Callable[..., Any]:
        """The class of this kind's opened version (an ``OpenedStorage`` subclass of
        ``storage.core.opening`` with the kind's read programs); opening makes it with
        ``(storage, store, manifest, executor, index)``."""

    def check_schema(self, manifest: Manifest) -> None:
        """Raise ``SchemaMismatchError`` if the caller's format differs from the stored one:
        at open, before an append, and when the commit of an append checks its base."""

    def open_index(self, manifest: Manifest) -> Program[Any]:
        """What opening reads after the root document (a kind's compact index, handed to
        its opened class); most kinds read nothing more."""

    def reading_format(self, manifest: Manifest) -> Any:
        """The format reads decode with: the one given, else the one the dataset records
        (used by the opened version, and by an append made without a format)."""

    # -- writing ------------------------------------------------------------------------------
    def array_layouts(self) -> dict[str, ArrayLayout]:
        """The arrays every shard of a new write has, and their layouts: the writer cuts
        blocks with them, the commit records them, an append compares them."""

    def array_attributes(self, name: str) -> dict[str, Any]:
        """Extra attributes of array ``name``'s ``zarr.json``, written when a shard closes."""

    def shard_encoder(self) -> ShardEncoder:
        """A fresh encoder for one shard of a writer: how a record becomes rows."""

    def bind_record(self, data: Any) -> StorageKind:
        """The kind that writes ``data`` and every later record of one writer.

        Kinds whose schema comes from the first record (``TemporalArrayStorage``) return a
        copy with that schema fixed; the writer takes layouts and encoders from it and
        records its schema in the writer's part.
        """

    def kind_schema(self) -> dict[str, Any]:
        """The kind's own keys of the stored schema (its format, its field groups): written
        in a part by a bound writer, and in the root by the commit."""

    # -- committing ---------------------------------------------------------------------------
    def bind_schema(self, schema: dict[str, Any], where: str) -> StorageKind:
        """The kind that commits parts whose writers recorded ``schema`` (from ``where``);
        raises ``SchemaMismatchError`` if it differs from one already bound."""

    def committed_schema(self) -> dict[str, Any]:
        """The schema the commit stores: ``kind_schema`` and the caller's ``notes``."""

    async def write_derived_index(self, store: ObjectStore, manifest: Manifest) -> None:
        """Write index arrays computed from the written shards before the commit publishes
        the root (temporal records: every record's frame end)."""

    def appending_to(self, manifest: Manifest) -> StorageKind:
        """This kind ready to append shards to ``manifest``'s version (its format taken
        from the dataset if none was given, its layout options matched to the stored
        arrays): what ``parallel_write(mode="append")`` and the ingest pipeline write with."""
