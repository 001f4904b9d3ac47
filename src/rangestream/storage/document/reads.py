"""The opened version of a document storage: where documents lie, and how they are read.

A document whose offsets the reader does not hold costs two rounds: the inner chunk of
``payload_offsets`` holding them (one small request), then its bytes; one whose offsets
it holds (``offset_chunks``), one round. Both rounds coalesce across the documents of one
``read_many``. The index of a document's offsets needs no coarse index: document ``j`` is
rows ``j`` and ``j + 1``, whose chunks are arithmetic (the second one is the next chunk
for the last document of a chunk, fetched in the same request since the two are
adjacent). ``read_keys`` reads only the bytes of some keys where the format can say
where they are.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, OutOfRangeError, UnknownFieldError
from rangestream.layout.executors import BlockCopier, Program
from rangestream.layout.pieces import RowRead
from rangestream.storage.core.opening import OpenedStorage
from rangestream.storage.document.offset_chunks import OffsetChunks
from rangestream.types import DocumentStorageFormat

_INT64 = np.dtype("<i8")
#: Cached chunks are keyed ``(shard position << _PART_SHIFT) + chunk`` (an int hashes faster
#: than a tuple): chunks of one shard number far fewer than 2**44.
_PART_SHIFT = 44


class OpenedDocuments(OpenedStorage):
    """Read programs of a document storage; shared by its sync and async readers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.document_bounds = self.bounds("payload_offsets", minus=1)
        self.num_documents = int(self.document_bounds[-1])
        storage: Any = self.storage
        self.format: DocumentStorageFormat[Any, Any] = storage.reading_format(self.manifest)
        self.offset_rows = self.manifest.arrays["payload_offsets"].chunk_rows
        self.offsets = OffsetChunks(storage.offsets_cache_bytes, self.offset_rows)
        self._mapped_reads: _MappedReads | bool | None = None  # made on first use

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

    # -- the mapped path -------------------------------------------------------------------
    def read_mapped(
        self, indexes: Any, keys: Sequence[str] | None = None, inline_bytes: int | None = None
    ) -> list[Any] | None:
        """``read_many`` of a local dataset straight from its mapped blocks, or ``None``
        when the read program must serve it (see ``_MappedReads``). ``inline_bytes``
        bounds the bytes copied (an async caller's loop is not held up by a large batch)."""
        reads = self._mapped_reads
        if reads is None:
            reads = self._mapped_reads = _MappedReads.make(self) or False
        if reads is False:
            return None
        assert isinstance(reads, _MappedReads)
        return reads.read(indexes, keys, inline_bytes)

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


class _MappedReads:
    """``read_many`` of a local mapped dataset in one pass: the read program's result and
    counts, without its per-document work.

    Why: a batch of 16 mapped documents through the read program cost 254-305 us against
    raw memmap's 36-41 (issue 30): per document a ``searchsorted``, two lookups of kept
    offsets, a ``Piece``, an ``fstat``, a coalesced range built only to be counted,
    ``tobytes`` and a fresh array. Here the batch is located with one ``searchsorted``,
    its offsets gathered from the kept chunks at once (``OffsetChunks.gather``), and every
    document copied once, by the mapped token path's copier (``block_copier``: inner chunks
    checked once per process, as every mapped read checks them; a block truncated since it
    was mapped is caught by the copier's guard, not by an ``fstat`` per piece) into one
    buffer for the batch. Each document is decoded from its read-only slice of it (a
    ``memoryview``, which ``unpack`` takes: ``StorageBufferTypes``).

    Served only when the program would make no request but the heap round: every document
    in range (given as ``int``s or an integer array), every offsets chunk kept. The heap
    requests are counted as the program counts them: its ranges of whole inner chunks,
    coalesced per block (``coalesce``), before anything is copied (a checksum failure
    counts what was read). Anything else (offsets to read, damage, a block not mapped)
    returns ``None`` with nothing counted, and the program serves the batch and names
    what is wrong.
    """

    def __init__(self, opened: OpenedDocuments) -> None:
        self.opened = opened
        self.copy: BlockCopier | None = None
        self.scratch = [0, 0]  # the copier's own counts: the batch counts its coalesced ranges
        heap = opened.manifest.arrays["payload_heap"]
        self.block_rows = heap.block_rows
        self.chunk_rows = heap.chunk_rows
        self.stored = heap.stored_chunk_nbytes
        self.bound_list = opened.document_bounds.tolist()
        self.heap_lengths = np.asarray(opened.manifest.lengths["payload_heap"]).tolist()
        self.shards = np.asarray(opened.shard_ids, dtype=np.int64).tolist()
        reader = opened.reader
        self.gap, self.max_bytes = reader.coalesce_gap, reader.max_coalesced_bytes
        self.counter = reader.counter.of("payload_heap")

    @classmethod
    def make(cls, opened: OpenedDocuments) -> _MappedReads | None:
        mapped = opened.mapped
        if mapped is None or not opened.offsets.capacity:
            return None
        reads = cls(opened)
        reads.copy = mapped.block_copier(opened.arrays_of("payload_heap"), counter=reads.scratch)
        if reads.copy is None:  # blocks with chunk indexes: the program reads them
            return None
        return reads

    def read(
        self, indexes: Any, keys: Sequence[str] | None, inline_bytes: int | None = None
    ) -> list[Any] | None:
        # Python ints throughout: for the tens of documents of a batch, a numpy call costs
        # more than the loop it would replace; numpy gathers the kept offsets only.
        opened = self.opened
        storage_format: Any = opened.format
        largest = None  # records larger than this need the program's header round
        if keys is not None:
            keys = _checked_keys(keys, storage_format)
            if not keys:
                return None
            header_nbytes = getattr(storage_format, "header_nbytes", None)
            names = getattr(storage_format, "names", None)
            if (
                isinstance(header_nbytes, int)
                and callable(getattr(storage_format, "field_spans", None))
                and callable(getattr(storage_format, "decode_field", None))
                and not (names is not None and set(keys) >= set(names))
            ):
                largest = max(opened.storage.whole_record_bytes, header_nbytes)  # type: ignore[attr-defined]
        if isinstance(indexes, np.ndarray):
            if indexes.ndim != 1 or indexes.dtype.kind not in "iu":
                return None
            indexes = indexes.tolist()
        elif type(indexes) is not list or not all(type(index) is int for index in indexes):
            return None  # other sequences and types: the program checks them
        if not indexes:
            return None
        count, bounds, offset_rows = opened.num_documents, self.bound_list, opened.offset_rows
        parts, chunk_keys, chunk_rows = [], [], []
        for index in indexes:
            if index < 0:
                index += count
            if not 0 <= index < count:
                return None  # the program names the index out of range
            part = bisect_right(bounds, index) - 1
            row = index - bounds[part]
            key = part << _PART_SHIFT
            parts.append(part)
            chunk_keys.append(key + row // offset_rows)
            chunk_keys.append(key + (row + 1) // offset_rows)
            chunk_rows.append(row % offset_rows)
            chunk_rows.append((row + 1) % offset_rows)
        values = opened.offsets.gather(chunk_keys, chunk_rows)
        if values is None:
            return None  # offsets to read first: the program's round
        heap_lengths, block_rows = self.heap_lengths, self.block_rows
        chunk, stored = self.chunk_rows, self.stored
        pieces: list[tuple[int, int, int, int]] = []  # (part, first row, rows, buffer offset)
        spans: list[tuple[int, int, int]] = []  # (block ident, first byte, end byte)
        sizes, total = [], 0
        for number, part in enumerate(parts):
            start, end = values[2 * number], values[2 * number + 1]
            if not 0 <= start <= end <= heap_lengths[part]:
                return None  # damaged offsets: the program names the document
            size = end - start
            if largest is not None and size > largest:
                return None  # header and fields of a large record: the program's two rounds
            if size and (end - 1) // block_rows - start // block_rows > 1:
                return None  # over more than two blocks: the program probes such reads
            sizes.append(size)
            row = start
            while row < end:
                block = row // block_rows
                base = block * block_rows
                stop = min(end, base + block_rows)
                pieces.append((part, row, stop - row, total + row - start))
                spans.append(((part << 40) + block, (row - base) // chunk * stored,
                              ((stop - 1 - base) // chunk + 1) * stored))  # fmt: skip
                row = stop
            total += size
        if inline_bytes is not None and total > inline_bytes:
            return None  # an async caller's large batch: the program copies it on a thread
        requests, nbytes = _coalesced(spans, self.gap, self.max_bytes)
        buffer = np.empty(total, dtype=np.uint8)
        copy = self.copy
        assert copy is not None
        try:
            for part, row, rows, at in pieces:
                if not copy(part, row, rows, ((buffer[at : at + rows], 0, 1),)):
                    return None  # not mapped, short or cut: the program reads it
        except Exception:
            self._count(requests, nbytes)  # the program had fetched them when it failed
            raise
        self._count(requests, nbytes)
        view = memoryview(buffer).toreadonly()
        shards, out, at = self.shards, [], 0
        if keys is None:
            unpack = storage_format.unpack
            for part, size in zip(parts, sizes, strict=True):
                out.append(unpack(view[at : at + size], shards[part]))
                at += size
        else:
            for part, size in zip(parts, sizes, strict=True):
                out.append(_select(storage_format, view[at : at + size], shards[part], keys))
                at += size
        return out

    def _count(self, requests: int, nbytes: int) -> None:
        counter = self.counter
        counter[0] += requests
        counter[1] += nbytes


def _coalesced(spans: list[tuple[int, int, int]], gap: int, max_bytes: int) -> tuple[int, int]:
    """(requests, bytes) of ``spans`` coalesced as ``io.ranges.coalesce`` merges them."""
    requests = nbytes = 0
    ident = start = end = -1
    for span_ident, span_start, span_end in sorted(spans):
        if (
            span_ident == ident
            and span_start <= end + gap
            and max(end, span_end) - start <= max_bytes
        ):
            end = max(end, span_end)
            continue
        if ident >= 0:
            requests += 1
            nbytes += end - start
        ident, start, end = span_ident, span_start, span_end
    if ident >= 0:
        requests += 1
        nbytes += end - start
    return requests, nbytes


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
