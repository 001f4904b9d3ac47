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

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, OutOfRangeError
from rangestream.layout.executors import Program
from rangestream.layout.pieces import RowRead
from rangestream.storage.core.opening import OpenedStorage
from rangestream.storage.document.mapped_reads import MappedReads, checked_keys, select_keys
from rangestream.storage.document.offset_chunks import PART_SHIFT, OffsetChunks
from rangestream.types import DocumentStorageFormat

_INT64 = np.dtype("<i8")


class OpenedDocuments(OpenedStorage):
    """Read programs of a document storage; shared by its sync and async readers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.document_bounds = self.bounds("payload_offsets", minus=1)
        #: The same bounds as Python-indexable int64s (8 bytes a shard) for ``bisect``: a
        #: numpy ``searchsorted`` per document released and waited for the GIL, which under
        #: an S3 client's threads cost tens of microseconds a document (issue 30).
        self.bound_list = array("q", np.asarray(self.document_bounds, dtype=np.int64).tobytes())
        self.num_documents = int(self.document_bounds[-1])
        storage: Any = self.storage
        self.format: DocumentStorageFormat[Any, Any] = storage.reading_format(self.manifest)
        self.offset_rows = self.manifest.arrays["payload_offsets"].chunk_rows
        self.offsets = OffsetChunks(storage.offsets_cache_bytes, self.offset_rows)
        self._mapped_reads: MappedReads | bool | None = None  # made on first use

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
        bounds = self.bound_list
        part = bisect_right(bounds, index) - 1
        return part, index - bounds[part]

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
            key = part << PART_SHIFT
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
        if wanted:
            reads = self.offset_reads(wanted)
            yield [read for _, _, read in reads]
            fetched = self.fetched_offsets(reads)
            for k, (part, j) in enumerate(located):
                if pairs[k] is None:
                    pairs[k] = (
                        self.offset(fetched, part, j),
                        self.offset(fetched, part, j + 1),
                    )
            for (part, chunk), values in fetched.items():
                cache.put((part << PART_SHIFT) + chunk, values)
        out = []
        for (part, j), pair in zip(located, pairs, strict=True):
            assert pair is not None
            start, end = pair
            self.check_span(part, j, start, end)
            out.append((self.shard_ids[part], start, end))
        return out

    def check_span(self, part: int, row: int, start: int, end: int) -> None:
        """``CorruptDataError`` unless document ``row`` of shard position ``part`` spans
        ``[start, end)`` inside its heap."""
        heap_length = int(self.manifest.lengths["payload_heap"][part])
        if not 0 <= start <= end <= heap_length:
            shard = self.shard_ids[part]
            raise CorruptDataError(
                f"{self.describe(self.manifest.array_key(shard, 'payload_offsets'))}: "
                f"document {row} spans [{start}, {end}) outside the heap of {heap_length} bytes"
            )

    def offset_reads(self, wanted: dict[int, set[int]]) -> list[tuple[int, int, RowRead]]:
        """``(shard position, first chunk, read)`` of the inner chunks of ``payload_offsets``
        in ``wanted`` (shard position to chunks), adjacent chunks of a shard in one read: the
        offsets round of ``spans``, and of the mapped path (``MappedReads``)."""
        rows = self.offset_rows
        reads: list[tuple[int, int, RowRead]] = []
        for part, chunks in sorted(wanted.items()):
            shard = self.shard_ids[part]
            length = int(self.manifest.lengths["payload_offsets"][part])
            for first, end in _runs(sorted(chunks)):
                read = self._rows(shard, "payload_offsets", first * rows, min(end * rows, length))
                reads.append((part, first, read))
        return reads

    def fetched_offsets(
        self, reads: list[tuple[int, int, RowRead]]
    ) -> dict[tuple[int, int], np.ndarray]:
        """The chunks ``offset_reads`` read, once done, by ``(shard position, chunk)``."""
        rows = self.offset_rows
        fetched: dict[tuple[int, int], np.ndarray] = {}
        for part, first, read in reads:
            values = read.target.reshape(-1).view(_INT64)
            for at in range(0, len(values), rows):
                fetched[(part, first + at // rows)] = values[at : at + rows]
        return fetched

    def offset(self, fetched: dict[tuple[int, int], np.ndarray], part: int, row: int) -> int:
        """Offset ``row`` of shard position ``part``: from this read's chunks, else kept."""
        chunk, at = divmod(row, self.offset_rows)
        values = fetched.get((part, chunk))
        if values is not None:
            return int(values[at])
        value = self.offsets.value((part << PART_SHIFT) + chunk, at)
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
        when the read program must serve it (see ``MappedReads``). ``inline_bytes``
        bounds the bytes copied (an async caller's loop is not held up by a large batch)."""
        reads = self._mapped_reads
        if reads is None:
            reads = self._mapped_reads = MappedReads.make(self) or False
        if reads is False:
            return None
        assert isinstance(reads, MappedReads)
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
        keys = checked_keys(keys, self.format)
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
            return [select_keys(storage_format, data, shard, keys) for shard, data in encoded]
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
                out.append(select_keys(storage_format, data, shard, keys))
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


def _runs(chunks: list[int]) -> list[tuple[int, int]]:
    """Sorted chunk numbers as ``[first, end)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for chunk in chunks:
        if runs and runs[-1][1] == chunk:
            runs[-1] = (runs[-1][0], chunk + 1)
        else:
            runs.append((chunk, chunk + 1))
    return runs
