"""``DocumentStorage``: one variable-size encoded blob per document.

Per shard: ``payload_heap`` (the concatenated encoded documents, uint8) and
``payload_offsets`` (int64, one more than documents: document ``i`` is heap bytes
``[offsets[i], offsets[i+1])``). This module holds what a document storage is (its
arrays, payload encoding and format) and its two readers; documents are read by
``document.reads``, their offsets kept by ``offset_chunks``.
"""

from __future__ import annotations

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
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.storage.core.base import Storage
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.core.options import LayoutOptions
from rangestream.storage.core.readers import AsyncReader, StorageFacts, SyncReader
from rangestream.storage.document.reads import OpenedDocuments
from rangestream.types import DocumentStorageFormat

_INT64 = np.dtype("<i8")
_UINT8 = np.dtype("u1")


def payload_rows(payload: Any, who: str) -> np.ndarray:
    """A payload as uint8 rows, or a clear error if it is not bytes-like."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise InvalidRecordError(
            f"{who} must produce bytes, bytearray or memoryview, got {type(payload).__name__}"
        )
    return np.frombuffer(payload, dtype=np.uint8).copy()


def payload_encoding(storage_format: Any) -> str:
    """How a format encodes payloads, as the schema records it for readers of the store.

    The format's ``payload_encoding`` (``"pickle"`` for ``DocumentPickleFormat``), else
    ``python:<module>.<class>`` of the format: a name, if not a specification.
    """
    named = getattr(storage_format, "payload_encoding", None)
    if isinstance(named, str) and named:
        return named
    cls = type(storage_format)
    return f"python:{cls.__module__}.{cls.__qualname__}"


#: Encodings recorded under other names by earlier versions, and their names now.
_LEGACY_ENCODINGS = {"python:rangestream.formats.records.RecordFormat": "records"}


def _encoding(value: Any) -> Any:
    return _LEGACY_ENCODINGS.get(value, value) if isinstance(value, str) else value


def _check_document_format(storage_format: Any) -> None:
    if not callable(getattr(storage_format, "pack", None)) or not callable(
        getattr(storage_format, "unpack", None)
    ):
        raise TypeError(
            f"storage_format must have pack and unpack, got {type(storage_format).__name__}"
        )


class _DocumentShardEncoder(ShardEncoder):
    def __init__(self, storage_format: DocumentStorageFormat[Any, Any]) -> None:
        self.format = storage_format

    def initial_rows(self) -> Mapping[str, np.ndarray]:
        return {"payload_offsets": np.zeros(1, dtype=_INT64)}

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        rows = payload_rows(self.format.pack(data), f"{type(self.format).__name__}.pack")
        end = lengths["payload_heap"] + len(rows)
        return {"payload_heap": rows, "payload_offsets": np.asarray([end], dtype=_INT64)}


#: Default bytes of document offsets a reader keeps (about 5 bytes per document).
DEFAULT_OFFSETS_CACHE_BYTES = 64 * 1024 * 1024
#: Inner chunks of ``payload_heap`` in new writes. A document read fetches the chunks it
#: touches, so about one chunk more than its bytes: 1.5x a 1 KiB document with 512-byte
#: chunks (2x with 1 KiB), for a chunk index of 3% of a full block.
DEFAULT_DOCUMENT_CHUNK_BYTES = 512
#: Records up to this size are read whole when keys are selected: over object storage one
#: request of 64 KiB costs less time than a header request and a field request in turn.
DEFAULT_WHOLE_RECORD_BYTES = 64 * 1024


class DocumentStorage(Storage):
    """Variable-size documents in shards, addressed by a global index in shard order.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``DocumentStorageFormat`` (``RecordFormat``, ``DocumentPickleFormat``: trusted
        data only, or your own); needed to write. Readers may omit it when the dataset
        records its format (``RecordFormat`` is recorded with its fields):
        ``DocumentStorage(url)``. Pickled documents are never unpickled on the word of
        stored metadata: pass ``DocumentPickleFormat()`` to read them.
    offsets_cache_bytes
        Bytes of document offsets each reader keeps (``OffsetChunks``: about 5 bytes per
        document). A document whose offsets are kept costs one round of requests (its
        bytes) instead of two.
    whole_record_bytes
        ``read(i, keys=[...])`` reads records up to this size whole; larger ones as their
        header, then the selected keys' bytes (formats that can, as ``RecordFormat``).
    **options
        See ``Storage``. ``chunk_bytes`` of the heap defaults to
        ``DEFAULT_DOCUMENT_CHUNK_BYTES`` (512): a read fetches whole inner chunks.
    """

    kind = "document"
    opened_class = OpenedDocuments
    default_layout = LayoutOptions(chunk_bytes=DEFAULT_DOCUMENT_CHUNK_BYTES)

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_format: DocumentStorageFormat[Any, Any] | None = None,
        *,
        offsets_cache_bytes: int = DEFAULT_OFFSETS_CACHE_BYTES,
        whole_record_bytes: int = DEFAULT_WHOLE_RECORD_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.offsets_cache_bytes = integer(offsets_cache_bytes, "offsets_cache_bytes", minimum=0)
        self.whole_record_bytes = integer(whole_record_bytes, "whole_record_bytes", minimum=0)
        if storage_format is not None:
            _check_document_format(storage_format)
        self.storage_format = storage_format

    def array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "payload_heap": self._layout(_UINT8),
            "payload_offsets": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 1024)),
        }

    def kind_schema(self) -> dict[str, Any]:
        storage_format = self._writing_format()
        schema: dict[str, Any] = {"payload_encoding": payload_encoding(storage_format)}
        described = format_schema(storage_format)
        if described is not None:
            schema["format"] = described
        return schema

    def reading_format(self, manifest: Manifest) -> Any:
        """The given format once checked against the store, else the one it records."""
        where = f"{self.url}/{ROOT_KEY}"
        stored = _encoding(manifest.schema.get("payload_encoding"))
        recorded = manifest.schema.get("format")
        storage_format = self.storage_format
        if storage_format is not None:
            named = _encoding(getattr(storage_format, "payload_encoding", None))
            if isinstance(stored, str) and isinstance(named, str) and stored != named:
                raise SchemaMismatchError(
                    f"{self.url} stores payloads encoded as {stored!r}, but the format "
                    f"{type(storage_format).__name__} reads {named!r}"
                )
            check_given_format(storage_format, recorded, where)
            return storage_format
        if recorded is not None:
            storage_format = format_from_schema(recorded, where)
            try:
                _check_document_format(storage_format)
            except TypeError as error:
                raise SchemaMismatchError(f"{where}: the recorded format {error}") from error
            return storage_format
        if stored == "pickle":
            raise SchemaMismatchError(
                f"{self.url} holds pickled documents; unpickling runs code chosen by whoever "
                "wrote them, so it is never chosen from stored metadata: pass "
                "DocumentPickleFormat() if you trust this data"
            )
        what = f" ({stored})" if isinstance(stored, str) else ""
        raise SchemaMismatchError(
            f"{self.url} does not record its format{what}: it was written with a format that "
            "has no schema(), or before formats were recorded; pass the format it was "
            "written with, DocumentStorage(url, storage_format)"
        )

    def check_schema(self, manifest: Manifest) -> None:
        if set(manifest.arrays) != {"payload_heap", "payload_offsets"}:
            raise SchemaMismatchError(f"{self.url} does not hold a document dataset's arrays")
        self.reading_format(manifest)

    def shard_encoder(self) -> ShardEncoder:
        return _DocumentShardEncoder(self._writing_format())


class _DocumentFacts(StorageFacts):
    """What both readers of a document storage say about it."""

    def num_records(self, shard: int | None = None) -> int:
        """Documents (one per ``append``) in ``shard``, or in all shards (``None``): the
        name every storage kind's readers give this count."""
        if shard is None:
            return int(self.opened.num_documents)
        return max(0, int(self.opened.shard_length("payload_offsets", int(shard))) - 1)

    @property
    def num_documents(self) -> int:
        """Documents over all shards (``num_records()``, ``len(reader)``)."""
        return int(self.opened.num_documents)

    def __len__(self) -> int:
        return self.num_documents

    def length(self, shard: int) -> int:
        """Documents in ``shard`` (``num_records(shard)``)."""
        return self.num_records(shard)


class DocumentStorageReader(_DocumentFacts, SyncReader):
    """Sync reads of a document storage."""

    def read(self, index: int, keys: Sequence[str] | None = None) -> Any:
        """Document ``index`` (negative counts from the end), or only ``keys`` of a record.

        With ``keys`` (AstrAI's ``fetch_record(index, keys)``), a ``RecordFormat`` record
        larger than ``whole_record_bytes`` costs its header and one range covering the
        keys, not the whole record; other formats decode the whole document and return
        the keys of the mapping it is.
        """
        opened = self.opened
        if opened.mapped is not None and type(index) is int:
            got = opened.read_mapped([index], keys)
            if got is not None:
                return got[0]
        return self._run(opened.read(index, keys))

    def read_many(self, indexes: Sequence[int], keys: Sequence[str] | None = None) -> list[Any]:
        """Several documents (or ``keys`` of each), every round shared and coalesced; on
        a local dataset, straight from its mapped blocks (``OpenedDocuments.read_mapped``)."""
        opened = self.opened
        if opened.mapped is not None:
            got = opened.read_mapped(indexes, keys)
            if got is not None:
                return got
        return self._run(opened.read_many(list(indexes), keys))


class AsyncDocumentStorageReader(_DocumentFacts, AsyncReader):
    """Async reads of a document storage."""

    async def read(
        self,
        index: int,
        keys: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
    ) -> Any:
        opened = await self._opened()
        if opened.mapped is not None and type(index) is int:
            got = opened.read_mapped([index], keys, INLINE_READ_BYTES)  # copies: no I/O to await
            if got is not None:
                return got[0]
        return await opened.run(opened.read(index, keys), max_concurrency=max_concurrency)

    async def read_many(
        self,
        indexes: Sequence[int],
        keys: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
    ) -> list[Any]:
        opened = await self._opened()
        if opened.mapped is not None:
            got = opened.read_mapped(indexes, keys, INLINE_READ_BYTES)  # copies: no I/O to await
            if got is not None:
                return got
        program = opened.read_many(list(indexes), keys)
        return await opened.run(program, max_concurrency=max_concurrency)


DocumentStorage.sync_reader_class = DocumentStorageReader
DocumentStorage.async_reader_class = AsyncDocumentStorageReader
