"""Sync stream reads on a local path, copied straight out of memory-mapped blocks.

A sync read through the generic program costs a ``pread`` into fresh ``bytes``, a crc32c
pass over every fetched chunk and a copy that drops the checksum trailers: about 18 µs for a
random 2049-token window, against under 3 µs for a numpy memmap slice of the same bytes.
Here a window is copied out of a mapped block in one call of the compiled
``chunked.copy_rows`` (or, without it, one numpy copy of the whole inner chunks), and each
inner chunk's crc32c is checked the first time this process reads it, then trusted:
committed blocks never change.
A damaged chunk is never marked verified, so every read that touches it keeps failing.

Requests and bytes are counted exactly as the ``pread`` path would have counted them (the
whole inner chunks of each window, coalesced the same way), so counters mean the same on
either path. Reads this path does not serve (a window across a block or shard boundary, an
empty one, a block missing or shorter than the layout says) return ``None`` before anything
is counted, and the caller takes the generic path, which reads them or names the damage.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import ChecksumError
from rangestream.io.local_map import LocalMapCache, MappedFile
from rangestream.io.ranges import RangeRequest, coalesce
from rangestream.io.store import LocalStore
from rangestream.layout import chunked
from rangestream.layout.block import first_bad_mapped_chunk

if TYPE_CHECKING:
    from rangestream.storage.stream import OpenedStream

__all__ = ["MappedStreamReads"]

_ARRAY = "stream"
_MAX_SEGMENT_ARRAYS = 4096
#: One window's decoded elements, its per-shard segment lengths and shard ids (the
#: arguments of ``StreamStorageFormat.unpack``).
Elements = tuple[np.ndarray, np.ndarray, np.ndarray]


class MappedStreamReads:
    """Windows of one opened local stream dataset, read from a bounded cache of mappings.

    Made per process (the opened dataset is), only for a plain ``LocalStore`` whose blocks
    store their inner chunks densely; see the module docstring.
    """

    def __init__(self, opened: OpenedStream, store: LocalStore) -> None:
        layout = opened.manifest.arrays[_ARRAY]
        self.opened = opened
        self.store = store
        self.layout = layout
        self.unpack = opened.format.unpack
        self.dtype = opened.dtype
        self.chunk_rows = layout.chunk_rows
        self.block_rows = layout.block_rows
        self.stored = layout.stored_chunk_nbytes
        self.chunks_per_block = layout.chunks_per_block
        self.chunk_nbytes = layout.chunk_nbytes
        self.itemsize = layout.row_nbytes
        self.copy_rows = chunked.copy_rows  # None without the compiled helper: numpy copies
        self.verify = opened.storage.verify_checksums
        self.gap = opened.reader.coalesce_gap
        self.max_bytes = opened.reader.max_coalesced_bytes
        self.bounds = [int(b) for b in opened.stream_bounds]
        self.ids = [int(s) for s in opened.manifest.shard_ids]
        self.keys = [opened.manifest.array_key(s, _ARRAY) for s in self.ids]
        self.maps = LocalMapCache()
        self.counter = opened.reader.mapped_tally(_ARRAY)
        self.paths: dict[tuple[int, int], tuple[str, str]] = {}
        self.segments: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def read_one(self, start: int, length: int) -> Elements | None:
        """One read (the hot path of ``reader.read``), or ``None`` for the generic path.

        Anything but plain ints inside the stream returns ``None``: the generic path checks
        and names bad arguments.
        """
        if type(start) is not int or type(length) is not int:
            return None
        bounds = self.bounds
        if length <= 0 or start < 0 or start + length > bounds[-1]:
            return None
        part = bisect.bisect_right(bounds, start) - 1
        local = start - bounds[part]
        if local + length > bounds[part + 1] - bounds[part]:
            return None  # spans shards (bisect skipped empty ones): the generic path
        block, low = divmod(local, self.block_rows)
        if low + length > self.block_rows:
            return None  # crosses a block boundary: two ranges, the generic path
        found = self._map(part, block, low, length)
        if found is None:
            return None
        key, mapped, first_chunk, end_chunk = found
        counter = self.counter  # count_mapped_reads of one range, deferred (mapped_tally)
        counter[0] += 1
        counter[1] += (end_chunk - first_chunk) * self.stored
        if self.verify and mapped.verified.find(0, first_chunk, end_chunk) >= 0:
            self._verify(key, mapped, first_chunk, end_chunk)
        data = self._copy(mapped, low, first_chunk, end_chunk, length)
        return (data, *self._segments(length, part))

    def read_many_elements(self, requests: Sequence[tuple[int, int]]) -> list[Elements] | None:
        """The elements of every ``(global_index, length)`` read, or ``None`` (generic path).

        Arguments are checked first, with the generic path's errors.
        """
        opened, bounds, block_rows = self.opened, self.bounds, self.block_rows
        located = []
        for request in requests:
            start, length = opened.check_range(*request)
            if length == 0:
                return None
            part = bisect.bisect_right(bounds, start) - 1
            local = start - bounds[part]
            if local + length > bounds[part + 1] - bounds[part]:
                return None  # spans shards: several segments, the generic path
            block, low = divmod(local, block_rows)
            if low + length > block_rows:
                return None  # crosses a block boundary: two ranges, the generic path
            found = self._map(part, block, low, length)
            if found is None:
                return None
            located.append((part, low, length, found))
        stored = self.stored
        if len(located) == 1:
            _, _, _, (_, _, first_chunk, end_chunk) = located[0]
            spent = [(_ARRAY, (end_chunk - first_chunk) * stored)]
        else:  # the pread path coalesces a read_many's ranges: count the same requests
            ranges = [
                RangeRequest(key, first_chunk * stored, end_chunk * stored)
                for _, _, _, (key, _, first_chunk, end_chunk) in located
            ]
            merged = coalesce(ranges, gap=self.gap, max_bytes=self.max_bytes)
            spent = [(_ARRAY, group.end - group.start) for group in merged]
        opened.reader.count_mapped_reads(spent)
        if self.verify:
            for _, _, _, (key, mapped, first_chunk, end_chunk) in located:
                if mapped.verified.find(0, first_chunk, end_chunk) >= 0:
                    self._verify(key, mapped, first_chunk, end_chunk)
        return [
            (self._copy(mapped, low, first, end, length), *self._segments(length, part))
            for part, low, length, (_, mapped, first, end) in located
        ]

    def _map(
        self, part: int, block: int, low: int, length: int
    ) -> tuple[str, MappedFile, int, int] | None:
        """(key, mapping, first and end inner chunk) of a read inside one block, or ``None``
        when the block is missing, unreadable or shorter than the layout says."""
        key, path = self.paths.get((part, block)) or self._block(part, block)
        maps = self.maps
        mapped = maps.get(path)  # a hit is now the most recently used
        if mapped is None:
            try:
                mapped = maps.open(path, self.chunks_per_block)
            except OSError:
                return None
        first_chunk = low // self.chunk_rows
        end_chunk = (low + length - 1) // self.chunk_rows + 1
        if end_chunk * self.stored > mapped.size:
            return None
        return key, mapped, first_chunk, end_chunk

    def _verify(self, key: str, mapped: MappedFile, first_chunk: int, end_chunk: int) -> None:
        stored = self.stored
        bad = first_bad_mapped_chunk(mapped.data, mapped.verified, stored, first_chunk, end_chunk)
        if bad is not None:
            raise ChecksumError(
                f"{self.store.describe(key)} bytes [{first_chunk * stored}, "
                f"{end_chunk * stored}): checksum mismatch in inner chunk "
                f"{bad - first_chunk} of the read"
            )

    def _segments(self, length: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        """``unpack``'s segment lengths and shard ids of a one-segment read (read-only
        arrays, made once per length and shard: windows mostly share one length)."""
        found = self.segments.get((length, part))
        if found is None:
            if len(self.segments) >= _MAX_SEGMENT_ARRAYS:
                self.segments.clear()
            lengths = np.array([length], dtype=np.int64)
            shards = np.array([self.ids[part]], dtype=np.int64)
            lengths.flags.writeable = shards.flags.writeable = False
            found = self.segments[(length, part)] = (lengths, shards)
        return found

    def _block(self, part: int, block: int) -> tuple[str, str]:
        """(key, file path) of block ``block`` of shard number ``part``, made once."""
        key = self.layout.block_key(self.keys[part], block)
        found = self.paths[(part, block)] = (key, self.store.local_path(key))
        return found

    def _chunks(self, mapped: MappedFile) -> np.ndarray:
        """A ``(chunks, chunk bytes)`` uint8 view of the block, checksums skipped.

        Copies go through bytes, whatever the stream dtype: a structured dtype's copy loop
        is about twice as slow as a plain byte copy.
        """
        found = mapped.views.get(self)
        if found is None:
            found = np.ndarray(
                (mapped.size // self.stored, self.chunk_nbytes),
                dtype=np.uint8,
                buffer=mapped.data,
                strides=(self.stored, 1),
            )
            mapped.views[self] = found
        return found

    def _copy(
        self, mapped: MappedFile, low: int, first_chunk: int, end_chunk: int, length: int
    ) -> np.ndarray:
        """Elements ``[low, low + length)`` of a block, in a new array or a view of one.

        With the compiled ``chunked.copy_rows``, exactly the elements, in one call. With
        numpy, the buffer holds the whole inner chunks the read touches, copied in one call
        (a partial chunk at each end would cost two more): at most two chunks more than the
        window, and the generic path returns views of its buffers too.
        """
        copy_rows = self.copy_rows
        if copy_rows is not None:
            itemsize = self.itemsize
            out = np.empty(length, dtype=self.dtype)
            copy_rows(mapped.data, out, low, length, self.chunk_rows, self.stored, itemsize, 0,
                      itemsize)  # fmt: skip
            return out
        chunks = mapped.views.get(self)
        if chunks is None:
            chunks = self._chunks(mapped)
        count = end_chunk - first_chunk
        chunk_rows = self.chunk_rows
        buffer = np.empty(count * chunk_rows, dtype=self.dtype)
        buffer.view(np.uint8).reshape(count, self.chunk_nbytes)[...] = chunks[first_chunk:end_chunk]
        skip = low - first_chunk * chunk_rows
        return buffer[skip : skip + length]


def mapped_stream_reads(opened: OpenedStream) -> MappedStreamReads | None:
    """The mapped path for ``opened``, where it applies: a plain ``StreamStorage`` (a
    subclass may read more than the elements) on a plain local store with dense chunks."""
    from rangestream.storage.stream import OpenedStream

    store: Any = opened.store
    if type(opened) is not OpenedStream or type(store) is not LocalStore:
        return None
    if not opened.manifest.arrays[_ARRAY].dense_chunks:
        return None
    return MappedStreamReads(opened, store)
