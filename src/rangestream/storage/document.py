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
from rangestream.errors import CorruptDataError, InvalidRecordError, OutOfRangeError
from rangestream.layout.block import ArrayLayout
from rangestream.layout.executors import Program
from rangestream.layout.manifest import Manifest
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
        self.format: DocumentStorageFormat[Any, Any] = storage.storage_format
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

    def read_encoded(self, indexes: Sequence[int]) -> Program[list[tuple[int, bytes]]]:
        """``(shard, encoded bytes)`` of each document.

        Round 1, only for documents whose offsets are not kept: the inner chunks of
        ``payload_offsets`` holding them (adjacent chunks of a shard in one read). Round 2:
        the documents' bytes. The chunks read are kept (``OffsetChunks``) after the
        offsets of this read are taken from them.
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
        heap_reads = []
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
            heap_reads.append(self._rows(shard, "payload_heap", start, end))
        if heap_reads:
            yield heap_reads
        return [
            (self.shard_ids[part], read.target.reshape(-1).tobytes())
            for (part, _), read in zip(located, heap_reads, strict=True)
        ]

    def _offset(self, fetched: dict[tuple[int, int], np.ndarray], part: int, row: int) -> int:
        """Offset ``row`` of shard position ``part``: from this read's chunks, else kept."""
        chunk, at = divmod(row, self.offset_rows)
        values = fetched.get((part, chunk))
        if values is not None:
            return int(values[at])
        value = self.offsets.value((part << _PART_SHIFT) + chunk, at)
        assert value is not None, "a chunk kept at the start of the read is kept still"
        return value

    def read_many(self, indexes: Sequence[int]) -> Program[list[Any]]:
        encoded = yield from self.read_encoded(indexes)
        return [self.format.unpack(data, shard) for shard, data in encoded]

    def read(self, index: int) -> Program[Any]:
        (document,) = yield from self.read_many([index])
        return document


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


class DocumentStorage(Storage):
    """Variable-size documents in shards, addressed by a global index in shard order.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``DocumentStorageFormat`` (e.g. ``DocumentPickleFormat``: trusted data only).
    offsets_cache_bytes
        Bytes of document offsets each reader keeps (``OffsetChunks``: about 5 bytes per
        document). A document whose offsets are kept costs one round of requests (its
        bytes) instead of two.
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
        storage_format: DocumentStorageFormat[Any, Any],
        *,
        offsets_cache_bytes: int = DEFAULT_OFFSETS_CACHE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.offsets_cache_bytes = offsets_cache_bytes
        if not callable(getattr(storage_format, "pack", None)) or not callable(
            getattr(storage_format, "unpack", None)
        ):
            raise TypeError(
                f"storage_format must have pack and unpack, got {type(storage_format).__name__}"
            )
        self.storage_format = storage_format

    def _array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "payload_heap": self._layout(_UINT8),
            "payload_offsets": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 1024)),
        }

    def _schema(self) -> dict[str, Any]:
        return {"payload_encoding": payload_encoding(self.storage_format)}

    def _check_schema(self, manifest: Manifest) -> None:
        from rangestream.errors import SchemaMismatchError

        if set(manifest.arrays) != {"payload_heap", "payload_offsets"}:
            raise SchemaMismatchError(f"{self.url} does not hold a document dataset's arrays")
        stored = manifest.schema.get("payload_encoding")
        named = getattr(self.storage_format, "payload_encoding", None)
        if isinstance(stored, str) and isinstance(named, str) and stored != named:
            raise SchemaMismatchError(
                f"{self.url} stores payloads encoded as {stored!r}, but the format "
                f"{type(self.storage_format).__name__} reads {named!r}"
            )

    def _shard_encoder(self) -> ShardEncoder:
        return _DocumentShardEncoder(self.storage_format)


class _DocumentFacts:
    opened: Any

    @property
    def num_shards(self) -> int:
        return int(self.opened.num_shards)

    @property
    def num_documents(self) -> int:
        return int(self.opened.num_documents)

    def __len__(self) -> int:
        return self.num_documents

    def length(self, shard: int) -> int:
        """Documents in ``shard``."""
        return max(0, int(self.opened.shard_length("payload_offsets", int(shard))) - 1)


class DocumentStorageReader(_DocumentFacts, SyncReader):
    """Sync reads of a document storage."""

    def read(self, index: int) -> Any:
        return self._run(self.opened.read(index))

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        return self._run(self.opened.read_many(indexes))


class AsyncDocumentStorageReader(_DocumentFacts, AsyncReader):
    """Async reads of a document storage."""

    async def read(self, index: int, *, max_concurrency: int | None = None) -> Any:
        opened = await self._opened()
        return await opened.run(opened.read(index), max_concurrency=max_concurrency)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._opened()
        return await opened.run(opened.read_many(indexes), max_concurrency=max_concurrency)


DocumentStorage.sync_reader_class = DocumentStorageReader
DocumentStorage.async_reader_class = AsyncDocumentStorageReader
