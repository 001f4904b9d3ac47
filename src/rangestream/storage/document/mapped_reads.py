"""``read_many`` of a local mapped document dataset in one pass, without the read program.

Why: a batch of 16 mapped documents through the read program cost 254-305 us against raw
memmap's 36-41 (issue 30): per document a ``searchsorted``, two lookups of kept offsets, a
``Piece``, an ``fstat``, a coalesced range built only to be counted, ``tobytes`` and a
fresh array. A first pass here (one buffer for the batch, copied piece by piece through
the token path's copier) still cost 2.5x raw memmap: per document an output tuple, a slice,
a closure call and a ``memoryview``. Now each document is one compiled call,
``layout.copy.copy_bytes``, which checks its inner chunks' flags and copies its bytes once,
under the mapped copier's fault guard, straight into the ``bytes`` the format decodes:
the very type the read program hands ``unpack``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import UnknownFieldError
from rangestream.layout import copy as row_copy
from rangestream.layout.checksums import check_mapped
from rangestream.storage.document.offset_chunks import PART_SHIFT

if TYPE_CHECKING:
    from rangestream.io.mapped import MappedFile

__all__ = ["MappedReads", "checked_keys", "select_keys"]

#: Block keys are ``block_base + (shard position << _BLOCK_SHIFT) + block``
#: (``MappedExecutor.block_copier``, ``OpenedStorage.array``).
_BLOCK_SHIFT = 40


class MappedReads:
    """The read program's documents and counts for a batch, from mapped blocks.

    Served when every document is in range (given as ``int``s or an integer array) and
    lies within at most two blocks. Offsets come from the kept chunks; chunks not kept are
    read first by the mapped executor, as the program's offsets round
    (``_cold_offsets``). The heap requests are counted as the program counts
    them: its ranges of whole inner chunks, coalesced per block (``coalesce``), once every
    document is copied, or when a checksum fails (the program had fetched them then).
    Inner chunks are verified once per process, as every mapped read verifies them
    (``check_mapped``, with checksums on); a block truncated since it was mapped is caught
    by the copier's guard. Anything else (offsets to read, damage, a block not mapped or
    short) returns ``None`` with nothing counted, and the program serves the batch and names
    what is wrong.
    """

    def __init__(self, opened: Any) -> None:
        # ``opened`` is a ``reads.OpenedDocuments`` (not imported: reads imports this module)
        mapped = opened.mapped
        assert mapped is not None
        self.opened = opened
        self.mapped = mapped
        self.arrays = opened.arrays_of("payload_heap")
        layout = self.arrays.layout
        self.block_rows = layout.block_rows
        self.chunk_rows = layout.chunk_rows
        self.stored = layout.stored_chunk_nbytes
        self.base = self.arrays[0].block_base
        self.verify = mapped.verify
        self.holder = mapped._entries  # the process's mapped blocks, read on the hot path
        self.bound_list = opened.bound_list
        self.heap_lengths = np.asarray(opened.manifest.lengths["payload_heap"]).tolist()
        self.shards = np.asarray(opened.shard_ids, dtype=np.int64).tolist()
        reader = opened.reader
        self.gap, self.max_bytes = reader.coalesce_gap, reader.max_coalesced_bytes
        self.counter = reader.counter.of("payload_heap")
        self.copy_bytes = row_copy.copy_bytes  # bound once: tests switch it before opening

    @classmethod
    def make(cls, opened: Any) -> MappedReads | None:
        """The mapped reads of ``opened``, or ``None`` when its heap blocks hold chunk
        indexes (not dense) or no offsets are kept (every batch reads offsets first)."""
        mapped = opened.mapped
        if mapped is None or not opened.offsets.capacity:
            return None
        if not opened.manifest.arrays["payload_heap"].dense_chunks:
            return None
        return cls(opened)

    def read(
        self, indexes: Any, keys: Sequence[str] | None, inline_bytes: int | None = None
    ) -> list[Any] | None:
        """The documents ``indexes`` (or ``keys`` of each), or ``None`` for the program.

        ``inline_bytes`` bounds the bytes copied (an async caller's loop is not held up by a
        large batch). Python ints throughout: for the tens of documents of a batch, a numpy
        call costs more than the loop it would replace."""
        opened = self.opened
        storage_format: Any = opened.format
        largest = None  # records larger than this need the program's header round
        if keys is not None:
            keys = checked_keys(keys, storage_format)
            if not keys:
                return None
            largest = _largest_whole(opened, storage_format, keys)
        if isinstance(indexes, np.ndarray):
            if indexes.ndim != 1 or indexes.dtype.kind not in "iu":
                return None
            indexes = indexes.tolist()
        elif type(indexes) is not list:
            return None  # other sequences: the program checks them
        if not indexes:
            return None
        count, bounds = opened.num_documents, self.bound_list
        parts, chunk_keys, rows = [], [], []
        for index in indexes:
            if type(index) is not int:
                if not isinstance(index, np.integer):
                    return None  # bools and others: the program names them
                index = int(index)  # numpy integers, as the program takes them
            if index < 0:
                index += count
            if not 0 <= index < count:
                return None  # the program names the index out of range
            part = bisect_right(bounds, index) - 1
            parts.append(part)
            chunk_keys.append(part << PART_SHIFT)
            rows.append(index - bounds[part])
        values = opened.offsets.pairs(chunk_keys, rows)
        if values is None:
            values = self._cold_offsets(parts, rows)
            if values is None:
                return None  # offsets the mapped blocks cannot give: the program's round
        if inline_bytes is not None and sum(values[1::2]) - sum(values[::2]) > inline_bytes:
            return None  # an async caller's large batch: the program copies it on a thread
        encoded = self._copies(parts, values, largest)
        if encoded is None:
            return None
        shards = self.shards
        if keys is None:
            unpack = storage_format.unpack
            return [unpack(data, shards[part]) for part, data in zip(parts, encoded, strict=True)]
        return [
            select_keys(storage_format, data, shards[part], keys)
            for part, data in zip(parts, encoded, strict=True)
        ]

    def _cold_offsets(self, parts: list[int], rows: list[int]) -> list[int] | None:
        """The documents' offsets (flat pairs) when some chunks are not kept: the program's
        offsets round (``offset_reads``, the same reads) run by the mapped executor, which
        counts and verifies them as the program's own step would; the chunks read are then
        kept. ``None``, nothing counted, when the executor cannot serve the round, or when
        keeping the chunks could evict one (the cache has fewer free slots than chunks to
        read): the program then reads the batch."""
        opened = self.opened
        offsets, per = opened.offsets, opened.offset_rows
        wanted: dict[int, set[int]] = {}
        for part, row in zip(parts, rows, strict=True):
            key = part << PART_SHIFT
            for chunk in (row // per, (row + 1) // per):
                if key + chunk not in offsets:
                    wanted.setdefault(part, set()).add(chunk)
        if sum(len(chunks) for chunks in wanted.values()) > offsets.free_slots:
            return None
        reads = opened.offset_reads(wanted)
        kept = len(offsets)
        if self.mapped.execute([read for _, _, read in reads]) is None:
            return None  # a block not mapped or short: the program reads and names it
        fetched = opened.fetched_offsets(reads)
        values = []
        for part, row in zip(parts, rows, strict=True):
            values.append(opened.offset(fetched, part, row))
            values.append(opened.offset(fetched, part, row + 1))
        for (part, chunk), chunk_values in fetched.items():
            offsets.put((part << PART_SHIFT) + chunk, chunk_values)
        if len(offsets) < kept + len(fetched):  # damaged chunks are not kept: the program
            # would read them again, so its error is raised here, with the same counts
            for number, (part, row) in enumerate(zip(parts, rows, strict=True)):
                opened.check_span(part, row, values[2 * number], values[2 * number + 1])
        return values

    def _copies(
        self, parts: list[int], values: list[int], largest: int | None
    ) -> list[bytes] | None:
        """Each document's bytes (``values`` holds its start and end), counted as the
        program's coalesced heap requests; or ``None`` with nothing counted when offsets are
        damaged, a record needs the program's header round (larger than ``largest``), a
        document spans more than two blocks, or a block is not mapped, short, or cut since
        it was mapped. One loop: locating, the spans to count and the copy of each."""
        entries = self.holder.value
        files = None if entries is None else entries.files
        heap_lengths, block_rows = self.heap_lengths, self.block_rows
        chunk, stored = self.chunk_rows, self.stored
        base, copy_bytes, verify = self.base, self.copy_bytes, self.verify
        out: list[bytes] = []
        # (block key, first byte, end byte) of each piece's whole inner chunks: counted
        spans: list[tuple[int, int, int]] = []
        append, span = out.append, spans.append
        pairs = iter(values)
        try:
            for part, start, end in zip(parts, pairs, pairs, strict=True):
                if not 0 <= start <= end <= heap_lengths[part]:
                    return None  # damaged offsets: the program names the document
                rows = end - start
                if not rows:
                    append(b"")
                    continue
                if largest is not None and rows > largest:
                    return None  # header and fields of a large record: the program's rounds
                block, row = divmod(start, block_rows)
                key = (part << _BLOCK_SHIFT) + block
                if row + rows <= block_rows:
                    span((key, row // chunk * stored, ((row + rows - 1) // chunk + 1) * stored))
                    mapped = None if files is None else files.get(base + key)
                    if mapped is not None:
                        got = copy_bytes(mapped.data, row, rows, chunk, stored, 1,
                                         mapped.verified if verify else None,
                                         mapped.live_size)  # fmt: skip
                        if type(got) is bytes:
                            append(got)
                            continue
                    got = self._piece(part, block, row, rows)
                elif row + rows <= 2 * block_rows:  # over two blocks: their pieces joined
                    head_rows = block_rows - row
                    span((key, row // chunk * stored, ((block_rows - 1) // chunk + 1) * stored))
                    span((key + 1, 0, ((rows - head_rows - 1) // chunk + 1) * stored))
                    head = self._piece(part, block, row, head_rows)
                    tail = None if head is None else self._piece(part, block + 1, 0,
                                                                 rows - head_rows)  # fmt: skip
                    got = None if head is None or tail is None else head + tail
                else:
                    return None  # over more than two blocks: the program probes such reads
                if got is None:
                    return None
                append(got)
        except Exception:
            # the read happened, then failed (a checksum): counted as the program counts it
            self._count(self._spans(parts, values))
            raise
        self._count(spans)
        return out

    def _spans(self, parts: list[int], values: list[int]) -> list[tuple[int, int, int]]:
        """The spans ``_copies`` counts, of every document (its offsets checked)."""
        block_rows, chunk, stored = self.block_rows, self.chunk_rows, self.stored
        spans = []
        for number, part in enumerate(parts):
            row = values[2 * number]
            end = values[2 * number + 1]
            while row < end:
                block = row // block_rows
                at = block * block_rows
                stop = min(end, at + block_rows)
                spans.append(((part << _BLOCK_SHIFT) + block, (row - at) // chunk * stored,
                              ((stop - 1 - at) // chunk + 1) * stored))  # fmt: skip
                row = stop
        return spans

    def _piece(self, part: int, block: int, row: int, rows: int) -> bytes | None:
        """Rows ``[row, row + rows)`` of heap block ``block`` of shard position ``part``,
        mapping the block and verifying its inner chunks as needed, else ``None``."""
        chunk, stored = self.chunk_rows, self.stored
        first, end = row // chunk, (row + rows - 1) // chunk + 1
        array = self.arrays[part]
        mapped = self.mapped.mapping(array, block, end)
        if mapped is None:
            return None
        flags = mapped.verified if self.verify else None
        got = self.copy_bytes(mapped.data, row, rows, chunk, stored, 1, flags, mapped.live_size)
        if got == 1:  # a chunk read for the first time: checked once, then trusted
            assert flags is not None
            if mapped.live_size() < end * stored:  # the check reads the chunks: no fault
                got = 3
            else:
                store = self.mapped.store
                check_mapped(
                    mapped.data, flags, stored, first, end,
                    lambda: f"{store.describe(array.block_key(block))} bytes "
                    f"[{first * stored}, {end * stored})",
                )  # fmt: skip
                got = self.copy_bytes(mapped.data, row, rows, chunk, stored, 1, flags,
                                      mapped.live_size)  # fmt: skip
        if type(got) is bytes:
            return got
        if got == 3:
            self._forget(self.base + (part << _BLOCK_SHIFT) + block, mapped)
        return None

    def _forget(self, key: int, mapped: MappedFile) -> None:
        """Drop ``mapped`` (cut since it was mapped): mapped again at its size when next used."""
        entries = self.holder.value
        if entries is not None and entries.files.get(key) is mapped:
            entries.files.pop(key, None)

    def _count(self, spans: list[tuple[int, int, int]]) -> None:
        requests, nbytes = _coalesced(spans, self.gap, self.max_bytes)
        counter = self.counter
        counter[0] += requests
        counter[1] += nbytes


def _largest_whole(opened: Any, storage_format: Any, keys: list[str]) -> int | None:
    """Records larger than this need the program's header round for ``keys`` (a format
    that reads fields apart), else ``None`` (every record is read whole)."""
    header_nbytes = getattr(storage_format, "header_nbytes", None)
    names = getattr(storage_format, "names", None)
    if (
        isinstance(header_nbytes, int)
        and callable(getattr(storage_format, "field_spans", None))
        and callable(getattr(storage_format, "decode_field", None))
        and not (names is not None and set(keys) >= set(names))
    ):
        return max(opened.storage.whole_record_bytes, header_nbytes)  # type: ignore[attr-defined]
    return None


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


def checked_keys(keys: Any, storage_format: Any) -> list[str]:
    """``keys`` as a list of distinct field names of the format, or a clear error."""
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


def select_keys(storage_format: Any, data: bytes, shard: int, keys: list[str]) -> dict[str, Any]:
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
