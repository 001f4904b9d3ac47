"""``DocumentStorage``: one variable-size encoded blob per document.

Per shard: ``payload_heap`` (the concatenated encoded documents, uint8) and
``payload_offsets`` (int64, one more than documents: document ``i`` is heap bytes
``[offsets[i], offsets[i+1])``). A document whose offsets the reader does not hold costs two
rounds: the inner chunk of ``payload_offsets`` holding them (one small request), then its
bytes; one whose offsets it holds, one round. Both rounds coalesce across the documents of
one ``read_many``.

Offsets are read by range on demand, one inner chunk (128 documents with the default 1 KiB
chunks) at a time, never a shard's whole array, and kept in bounded memory
(``offsets_cache_bytes``) in a compact form: each chunk's first offset and the others
relative to it as 32-bit integers, about 5 bytes per document with the bookkeeping, so the
default 64 MiB holds the offsets of about 12 million documents. The index of a document's
offsets needs no coarse index: document ``j`` is rows ``j`` and ``j + 1``, whose chunks are
arithmetic (the second one is the next chunk for the last document of a chunk, fetched in
the same request since the two are adjacent).
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import (
    CorruptDataError,
    InvalidRecordError,
    OutOfRangeError,
    SchemaMismatchError,
    UnknownFieldError,
)
from rangestream.formats.described import check_given_format, format_from_schema, format_schema
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import Program
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.layout.pieces import RowRead
from rangestream.storage.base import Storage
from rangestream.storage.opening import OpenedStorage
from rangestream.storage.options import LayoutOptions
from rangestream.storage.readers import AsyncReader, SyncReader
from rangestream.storage.writing import ShardEncoder
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


#: Slots of the offsets cache are allocated this many at a time, as chunks arrive.
_SLOTS_PER_PAGE = 1024
#: Python bytes per cached chunk besides its values (its key, dict entry, list slot).
_SLOT_BOOKKEEPING = 160
_UINT32_SPAN = 1 << 32
#: Cached chunks are keyed ``(shard position << _PART_SHIFT) + chunk`` (an int hashes faster
#: than a tuple): chunks of one shard number far fewer than 2**44.
_PART_SHIFT = 44


class OffsetChunks:
    """Inner chunks of documents' offsets, of any shards, within a byte budget.

    A chunk of ``chunk_rows`` offsets is kept as its first offset and the rest relative to
    it (uint32), in slots allocated page by page as chunks arrive (so an idle reader holds
    nothing); when all slots are used, a CLOCK sweep reuses the slot of a chunk not looked
    up since the last sweep. Chunks whose offsets span 4 GiB or more, or decrease (damage,
    reported by the read), are not kept.

    Parameters
    ----------
    max_bytes
        Bound on the memory of the slots and their bookkeeping.
    chunk_rows
        Offsets per chunk (the rows of one inner chunk of ``payload_offsets``).
    """

    def __init__(self, max_bytes: int, chunk_rows: int) -> None:
        self.chunk_rows = chunk_rows
        self.slot_nbytes = 8 + 4 * chunk_rows + 1 + _SLOT_BOOKKEEPING
        self.capacity = max(0, max_bytes) // self.slot_nbytes
        self._slots: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._bases: list[np.ndarray] = []
        self._relative: list[np.ndarray] = []
        self._referenced = bytearray()
        self._hand = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        """Bytes of the slots allocated so far (values, reference bits)."""
        return (
            sum(a.nbytes for a in self._bases)
            + sum(a.nbytes for a in self._relative)
            + (len(self._referenced))
        )

    def value(self, key: Hashable, row: int) -> int | None:
        """Offset ``row`` of chunk ``key`` if the chunk is kept, else ``None``."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        self._referenced[slot] = 1
        page, at = divmod(slot, _SLOTS_PER_PAGE)
        return int(self._bases[page][at]) + int(self._relative[page][at, row])

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def put(self, key: Hashable, offsets: np.ndarray) -> None:
        """Keep ``offsets`` (at most ``chunk_rows`` int64 values) as chunk ``key``."""
        if not self.capacity or key in self._slots or not len(offsets):
            return
        base = int(offsets[0])
        relative = offsets - base
        if int(relative[-1]) >= _UINT32_SPAN or (
            len(relative) > 1 and (np.diff(relative) < 0).any()
        ):
            return
        slot = self._free_slot()
        self._slots[key] = slot
        self._keys[slot] = key
        self._referenced[slot] = 0
        page, at = divmod(slot, _SLOTS_PER_PAGE)
        self._bases[page][at] = base
        self._relative[page][at, : len(relative)] = relative

    def _free_slot(self) -> int:
        used = len(self._keys)
        if used < self.capacity:
            if used % _SLOTS_PER_PAGE == 0:
                slots = min(_SLOTS_PER_PAGE, self.capacity - used)
                self._bases.append(np.zeros(slots, dtype=np.int64))
                self._relative.append(np.zeros((slots, self.chunk_rows), dtype=np.uint32))
                self._referenced.extend(bytes(slots))
            self._keys.append(None)
            return used
        referenced, hand = self._referenced, self._hand
        while referenced[hand]:  # CLOCK: a second chance for chunks looked up since
            referenced[hand] = 0
            hand = (hand + 1) % used
        self._hand = (hand + 1) % used
        del self._slots[self._keys[hand]]
        return hand


class OpenedDocuments(OpenedStorage):
    """Read programs of a document storage; shared by its sync and async readers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.document_bounds = self.bounds("payload_offsets", minus=1)
        self.num_documents = int(self.document_bounds[-1])
        storage: Any = self.storage
        self.format: DocumentStorageFormat[Any, Any] = storage._reading_format(self.manifest)
        self.offset_rows = self.manifest.arrays["payload_offsets"].chunk_rows
        self.offsets = OffsetChunks(storage.offsets_cache_bytes, self.offset_rows)

    def locate(self, index: Any) -> tuple[int, int]:
        """``(shard position, index within shard)`` of a global document index.

        Negative indexes count from the end, as they do for every sequence of items in
        rangestream (documents, records, windows).
        """
        index = integer(index, "document index")
        count = self.num_documents
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise OutOfRangeError(
                f"document {index if index >= 0 else index - count} is outside the "
                f"{count} documents [0, {count})"
            )
        part = int(np.searchsorted(self.document_bounds, index, side="right")) - 1
        return part, index - int(self.document_bounds[part])

    def _rows(self, shard: int, name: str, start: int, stop: int) -> RowRead:
        return RowRead.whole(self.array(shard, name), start, stop)

    def spans(self, indexes: Sequence[int]) -> Program[list[tuple[int, int, int]]]:
        """``(shard, heap start, heap end)`` of each document, checked against the heap.

        Only for documents whose offsets are not kept, one round: the inner chunks of
        ``payload_offsets`` holding them (adjacent chunks of a shard in one read). The
        chunks read are kept (``OffsetChunks``) after the offsets of this read are taken
        from them.
        """
        rows, cache = self.offset_rows, self.offsets
        located = [self.locate(i) for i in indexes]
        pairs: list[tuple[int, int] | None] = []
        wanted: dict[int, set[int]] = {}  # shard position -> chunks to read
        for part, j in located:
            key = part << _PART_SHIFT
            start = cache.value(key + j // rows, j % rows)
            end = None if start is None else cache.value(key + (j + 1) // rows, (j + 1) % rows)
            if start is None or end is None:
                chunks = wanted.setdefault(part, set())
                for chunk in {j // rows, (j + 1) // rows}:
                    if key + chunk not in cache:
                        chunks.add(chunk)
                pairs.append(None)
            else:
                pairs.append((start, end))
        fetched: dict[tuple[int, int], np.ndarray] = {}
        if wanted:
            reads: list[tuple[int, int, RowRead]] = []
            for part, chunks in sorted(wanted.items()):
                shard = self.shard_ids[part]
                length = int(self.manifest.lengths["payload_offsets"][part])
                for first, end in _runs(sorted(chunks)):
                    read = self._rows(
                        shard, "payload_offsets", first * rows, min(end * rows, length)
                    )
                    reads.append((part, first, read))
            yield [read for _, _, read in reads]
            for part, first, read in reads:
                values = read.target.reshape(-1).view(_INT64)
                for at in range(0, len(values), rows):
                    fetched[(part, first + at // rows)] = values[at : at + rows]
            for k, (part, j) in enumerate(located):
                if pairs[k] is None:
                    pairs[k] = (
                        self._offset(fetched, part, j),
                        self._offset(fetched, part, j + 1),
                    )
            for (part, chunk), values in fetched.items():
                cache.put((part << _PART_SHIFT) + chunk, values)
        out = []
        for (part, j), pair in zip(located, pairs, strict=True):
            assert pair is not None
            start, end = pair
            shard = self.shard_ids[part]
            heap_length = int(self.manifest.lengths["payload_heap"][part])
            if not 0 <= start <= end <= heap_length:
                raise CorruptDataError(
                    f"{self.describe(self.manifest.array_key(shard, 'payload_offsets'))}: "
                    f"document {j} spans [{start}, {end}) outside the heap of {heap_length} bytes"
                )
            out.append((shard, start, end))
        return out

    def _offset(self, fetched: dict[tuple[int, int], np.ndarray], part: int, row: int) -> int:
        """Offset ``row`` of shard position ``part``: from this read's chunks, else kept."""
        chunk, at = divmod(row, self.offset_rows)
        values = fetched.get((part, chunk))
        if values is not None:
            return int(values[at])
        value = self.offsets.value((part << _PART_SHIFT) + chunk, at)
        assert value is not None, "a chunk kept at the start of the read is kept still"
        return value

    def read_encoded(self, indexes: Sequence[int]) -> Program[list[tuple[int, bytes]]]:
        """``(shard, encoded bytes)`` of each document: its span (``spans``), then one
        round of heap requests, coalesced across the documents of the batch."""
        spans = yield from self.spans(indexes)
        heap_reads = [self._rows(shard, "payload_heap", a, b) for shard, a, b in spans]
        if heap_reads:
            yield heap_reads
        return [
            (shard, read.target.reshape(-1).tobytes())
            for (shard, _, _), read in zip(spans, heap_reads, strict=True)
        ]

    def read_many(
        self, indexes: Sequence[int], keys: Sequence[str] | None = None
    ) -> Program[list[Any]]:
        if keys is not None:
            return (yield from self.read_keys(indexes, keys))
        encoded = yield from self.read_encoded(indexes)
        return [self.format.unpack(data, shard) for shard, data in encoded]

    def read(self, index: int, keys: Sequence[str] | None = None) -> Program[Any]:
        (document,) = yield from self.read_many([index], keys)
        return document

    # -- some keys of each record --------------------------------------------------------
    def read_keys(self, indexes: Sequence[int], keys: Sequence[str]) -> Program[list[Any]]:
        """Only ``keys`` of each record, reading only their bytes where the format can.

        A format with ``header_nbytes``, ``field_spans`` and ``decode_field``
        (``RecordFormat``) is read in two rounds after the spans: every record's header,
        then one range per record from its first to its last selected key's bytes. A
        record of at most ``whole_record_bytes``, or a selection of every key, is read
        whole in the first of them instead (one request beats two). Other formats read
        whole records: ``unpack_keys`` if they have it, else ``unpack`` and a selection
        of the mapping it returns. No keys read nothing: ``{}`` per record.
        """
        keys = _checked_keys(keys, self.format)
        if not keys:
            for index in indexes:
                self.locate(index)  # out-of-range indexes fail as they would with keys
            return [{} for _ in indexes]
        storage_format: Any = self.format
        header_nbytes = getattr(storage_format, "header_nbytes", None)
        partial = (
            isinstance(header_nbytes, int)
            and callable(getattr(storage_format, "field_spans", None))
            and callable(getattr(storage_format, "decode_field", None))
        )
        if not partial:
            encoded = yield from self.read_encoded(indexes)
            return [_select(storage_format, data, shard, keys) for shard, data in encoded]
        assert isinstance(header_nbytes, int)
        spans = yield from self.spans(indexes)
        names = getattr(storage_format, "names", None)
        every_key = names is not None and set(keys) >= set(names)
        small = self.storage.whole_record_bytes  # type: ignore[attr-defined]
        whole = [every_key or end - start <= max(small, header_nbytes) for _, start, end in spans]
        first = [
            self._rows(shard, "payload_heap", start, end if read_all else start + header_nbytes)
            for (shard, start, end), read_all in zip(spans, whole, strict=True)
        ]
        if first:
            yield first
        layouts: list[dict[str, tuple[int, int]] | None] = []
        second = []
        for (shard, start, end), read_all, read in zip(spans, whole, first, strict=True):
            if read_all:
                layouts.append(None)
                continue
            fields = storage_format.field_spans(read.target.reshape(-1), end - start)
            low = min(fields[key][0] for key in keys)
            high = max(fields[key][1] for key in keys)
            layouts.append(fields)
            second.append(self._rows(shard, "payload_heap", start + low, start + high))
        if second:
            yield second
        out = []
        later = iter(second)
        for (shard, _, _), fields, read in zip(spans, layouts, first, strict=True):
            if fields is None:
                data = read.target.reshape(-1).tobytes()
                out.append(_select(storage_format, data, shard, keys))
                continue
            low = min(fields[key][0] for key in keys)
            section = memoryview(next(later).target.reshape(-1))
            out.append(
                {
                    key: storage_format.decode_field(
                        key, section[fields[key][0] - low : fields[key][1] - low]
                    )
                    for key in keys
                }
            )
        return out


def _checked_keys(keys: Any, storage_format: Any) -> list[str]:
    if isinstance(keys, str) or not all(isinstance(key, str) for key in keys):
        raise TypeError(f"keys must be a list of field names, got {keys!r:.200}")
    keys = list(keys)
    if len(set(keys)) != len(keys):
        raise ValueError(f"keys repeat: {keys}")
    names = getattr(storage_format, "names", None)
    if names is not None:
        unknown = [key for key in keys if key not in names]
        if unknown:
            raise UnknownFieldError(
                f"no field(s) {unknown} in the records; fields are {list(names)}"
            )
    return keys


def _select(storage_format: Any, data: bytes, shard: int, keys: list[str]) -> dict[str, Any]:
    """``keys`` of a whole encoded record."""
    unpack_keys = getattr(storage_format, "unpack_keys", None)
    if callable(unpack_keys):
        return dict(unpack_keys(data, keys))
    document = storage_format.unpack(data, shard)
    if not isinstance(document, Mapping):
        raise TypeError(
            f"keys select fields of mappings; {type(storage_format).__name__} decodes "
            f"documents as {type(document).__name__}"
        )
    missing = [key for key in keys if key not in document]
    if missing:
        raise UnknownFieldError(f"no key(s) {missing} in the document; it has {list(document)}")
    return {key: document[key] for key in keys}


def _runs(chunks: list[int]) -> list[tuple[int, int]]:
    """Sorted chunk numbers as ``[first, end)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for chunk in chunks:
        if runs and runs[-1][1] == chunk:
            runs[-1] = (runs[-1][0], chunk + 1)
        else:
            runs.append((chunk, chunk + 1))
    return runs


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

    def _writing_format(self) -> Any:
        if self.storage_format is None:
            raise TypeError(
                f"DocumentStorage({self.url!r}) was made without a format: it reads what the "
                "dataset records, but writing needs the storage_format"
            )
        return self.storage_format

    def _array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "payload_heap": self._layout(_UINT8),
            "payload_offsets": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 1024)),
        }

    def _schema(self) -> dict[str, Any]:
        storage_format = self._writing_format()
        schema: dict[str, Any] = {"payload_encoding": payload_encoding(storage_format)}
        described = format_schema(storage_format)
        if described is not None:
            schema["format"] = described
        return schema

    def _reading_format(self, manifest: Manifest) -> Any:
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

    def _check_schema(self, manifest: Manifest) -> None:
        if set(manifest.arrays) != {"payload_heap", "payload_offsets"}:
            raise SchemaMismatchError(f"{self.url} does not hold a document dataset's arrays")
        self._reading_format(manifest)

    def _shard_encoder(self) -> ShardEncoder:
        return _DocumentShardEncoder(self._writing_format())


class _DocumentFacts:
    opened: Any

    @property
    def format(self) -> Any:
        """The format documents decode with: the one given, or the one the dataset records."""
        return self.opened.format

    @property
    def num_shards(self) -> int:
        """One more than the highest shard id written (unwritten shards hold nothing)."""
        return int(self.opened.num_shards)

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
        return self._run(self.opened.read(index, keys))

    def read_many(self, indexes: Sequence[int], keys: Sequence[str] | None = None) -> list[Any]:
        """Several documents (or ``keys`` of each), every round shared and coalesced."""
        return self._run(self.opened.read_many(list(indexes), keys))


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
        return await opened.run(opened.read(index, keys), max_concurrency=max_concurrency)

    async def read_many(
        self,
        indexes: Sequence[int],
        keys: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
    ) -> list[Any]:
        opened = await self._opened()
        program = opened.read_many(list(indexes), keys)
        return await opened.run(program, max_concurrency=max_concurrency)


DocumentStorage.sync_reader_class = DocumentStorageReader
DocumentStorage.async_reader_class = AsyncDocumentStorageReader
