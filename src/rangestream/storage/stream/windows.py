"""The opened version of a stream storage: where windows lie, and how they are read.

A read of ``[global_index, global_index + length)`` over the concatenation of shards (in
shard order) is one range request per shard and block touched, copied straight into the
window's array; ``window_reader`` is the hot path of local random windows, a copy out of
a mapped block with every constant bound once per window shape.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rangestream.errors import OutOfRangeError
from rangestream.layout.caches import ArrayCache
from rangestream.layout.executors import Program
from rangestream.layout.pieces import Output, RowRead, StoredArray
from rangestream.storage.stream.records import StreamRecords

_MAX_SEGMENT_ARRAYS = 4096
#: One window's elements, its per-shard segment lengths and shard ids (``unpack``'s input).
Elements = tuple[np.ndarray, np.ndarray, np.ndarray]


def no_window(index: int) -> None:
    return None  # no mapped blocks: every window takes the program


#: Fewer windows than this are read one by one (a run's set-up costs about as much).
_MIN_RUN_WINDOWS = 4


def run_of(requests: Sequence[tuple[int, int]]) -> tuple[int, int, int, int] | None:
    """``(first, stride, length, count)`` when ``requests`` are windows of one length at a
    constant stride no longer than the length (adjacent or overlapping), else ``None``."""
    count = len(requests)
    if count < _MIN_RUN_WINDOWS:
        return None
    first, length = requests[0]
    second = requests[1][0]
    if type(first) is not int or type(second) is not int or type(length) is not int:
        return None
    stride = second - first
    if not 0 < stride <= length:
        return None
    at = first
    for start, size in requests:
        if start != at or size != length:
            return None
        at += stride
    return first, stride, length, count


def _rows(elements: np.ndarray, count: int, stride: int, length: int) -> np.ndarray:
    """``count`` rows of ``length`` elements ``stride`` apart in ``elements``: views when
    they do not overlap, else copied apart (a row never aliases its neighbour)."""
    if stride >= length:
        return np.lib.stride_tricks.as_strided(
            elements, shape=(count, length), strides=(stride * elements.itemsize, elements.itemsize)
        )
    # copied as bytes: a structured dtype's own strided copy goes field by field
    item = elements.itemsize
    raw = elements.view(np.uint8)
    rows = np.lib.stride_tricks.as_strided(
        raw, shape=(count, length * item), strides=(stride * item, 1), writeable=False
    )
    return rows.copy().view(elements.dtype)


class _Window:
    """One window's array, made by the first of its segments' reads that is ready."""

    __slots__ = ("dtype", "length", "out")

    def __init__(self, length: int, dtype: np.dtype[Any]) -> None:
        self.length = length
        self.dtype = dtype
        self.out: np.ndarray | None = None

    def array(self) -> np.ndarray:
        out = self.out
        if out is None:
            out = self.out = np.empty(self.length, dtype=self.dtype)
        return out

    def part(self, at: int) -> Callable[[RowRead], tuple[Output, ...]]:
        """The ``make`` of the segment read landing at element ``at`` of the window."""

        def make(read: RowRead) -> tuple[Output, ...]:
            out = self.array()
            target = out if read.rows == self.length else out[at : at + read.rows]
            return ((target, 0, self.dtype.itemsize),)

        return make


class OpenedStream(StreamRecords):
    """A stream storage's opened version: where windows lie, and how they are read."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        bounds = self.bounds("stream")
        self.stream_bounds = bounds
        self.total_length = int(bounds[-1])
        self.num_records = int(self.manifest.totals["record_ends"])
        # made by the first record lookup: readers of windows never need them
        self._record_starts: np.ndarray | None = None
        self._record_bounds: list[int] | None = None
        self._bounds: list[int] = bounds.tolist()  # bisect on ints beats numpy here
        self.dtype = self.manifest.arrays["stream"].dtype
        self.itemsize = self.dtype.itemsize
        self.format: Any = self.storage.reading_format(self.manifest)
        self.unpack = self.format.unpack
        self._streams = self.arrays_of("stream")  # made per shard when first read
        self._segment_arrays: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._window_readers: dict[tuple[int, int], Callable[[int], Any]] = {}
        self.record_ends = ArrayCache(self.storage.record_ends_cache_bytes)  # type: ignore[attr-defined]

    # -- where a window lies --------------------------------------------------------------
    def check_range(self, global_index: Any, length: Any) -> tuple[int, int]:
        global_index, length = int(global_index), int(length)
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        if global_index < 0 or global_index + length > self.total_length:
            raise OutOfRangeError(
                f"elements [{global_index}, {global_index + length}) are outside the stream "
                f"of {self.total_length} elements"
            )
        return global_index, length

    def segments(self, global_index: int, length: int) -> list[tuple[int, int, int]]:
        """``(shard position, local start, local stop)`` of a global range, in order."""
        bounds = self._bounds
        stop = global_index + length
        position = global_index
        part = bisect.bisect_right(bounds, position) - 1
        out = []
        while position < stop:
            while bounds[part + 1] <= position:  # skip empty shards
                part += 1
            part_stop = min(stop, bounds[part + 1])
            out.append((part, position - bounds[part], part_stop - bounds[part]))
            position = part_stop
            part += 1
        return out

    def stream_array(self, part: int) -> StoredArray:
        return self._streams[part]

    # -- reading -----------------------------------------------------------------------------
    def window_reads(
        self, requests: Sequence[tuple[int, int]]
    ) -> tuple[list[RowRead], list[tuple[_Window, np.ndarray, np.ndarray]]]:
        """The row reads of several windows, and each window with its segment arrays.

        A window's array is made when its rows are known to exist (``RowRead.ready``): a
        length from damaged metadata fails on a small request, not on its allocation.
        """
        reads: list[RowRead] = []
        windows: list[tuple[_Window, np.ndarray, np.ndarray]] = []
        for request in requests:
            start, length = self.check_range(*request)
            window = _Window(length, self.dtype)
            segments = self.segments(start, length)
            at = 0
            for part, low, high in segments:
                reads.append(RowRead(self._streams[part], low, high, make=window.part(at)))
                at += high - low
            windows.append((window, *self._segment_arrays_of(segments, length)))
        return reads, windows

    def _segment_arrays_of(
        self, segments: list[tuple[int, int, int]], length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if len(segments) == 1:
            return self.segment_arrays(length, segments[0][0])
        lengths = np.asarray([high - low for _, low, high in segments], dtype=np.int64)
        shards = np.asarray([self.shard_ids[p] for p, _, _ in segments], dtype=np.int64)
        return lengths, shards

    def read_many_elements(self, requests: Sequence[tuple[int, int]]) -> Program[list[Elements]]:
        """Elements, segment lengths and segment shards of several reads, in one round."""
        run = run_of(requests)
        if run is not None:
            return (yield from self.read_run_elements(*run))
        reads, windows = self.window_reads(requests)
        if reads:
            yield reads
        return [(window.array(), lengths, shards) for window, lengths, shards in windows]

    def read_run_elements(
        self, first: int, stride: int, length: int, count: int
    ) -> Program[list[Elements]]:
        """``count`` windows of ``length`` elements, ``stride`` apart from ``first`` on,
        read as the one range that holds them all.

        A block-shuffle run (hundreds of windows) or a sequential batch: read window by
        window, each one cost a row read, its pieces, a checksum and a copy of its own in
        Python, ~30 us a window, more than fetching its bytes. Here the span is one read
        and the windows are rows cut out of it by strides; overlapping windows (the
        next-token target) are copied apart so that no window aliases its neighbour.
        """
        span = (count - 1) * stride + length
        self.check_range(first, span)
        ((elements, span_lengths, _),) = yield from self.read_many_elements([(first, span)])
        rows = _rows(elements, count, stride, length)
        if len(span_lengths) == 1:  # one shard holds the span: its windows share arrays
            lengths, shards = self.segment_arrays(length, self._part_of(first))
            return [(row, lengths, shards) for row in rows]
        return [
            (row, *self._segment_arrays_of(self.segments(first + i * stride, length), length))
            for i, row in enumerate(rows)
        ]

    def _part_of(self, position: int) -> int:
        return bisect.bisect_right(self._bounds, position) - 1

    def read_many(self, requests: Sequence[tuple[int, int]]) -> Program[list[Any]]:
        windows = yield from self.read_many_elements(requests)
        unpack = self.unpack
        return [unpack(*window) for window in windows]

    def read(self, global_index: int, length: int) -> Program[Any]:
        (window,) = yield from self.read_many_elements([(global_index, length)])
        return self.unpack(*window)

    def read_in_block(self, global_index: Any, length: Any) -> Any:
        """One window copied straight out of a mapped block, or ``None`` (take ``read``).

        The hot path of local random windows: only plain ints, inside one shard and one
        block of a mapped dataset; anything else, and every error, takes the program.
        """
        if type(global_index) is not int or type(length) is not int or length <= 0:
            return None
        read = self._window_readers.get((length, 1)) or self.window_reader(length, 1)
        return read(global_index)

    def window_reader(self, length: int, stride: int) -> Callable[[int], Any]:
        """``read(i)``: window ``i`` (elements ``[i * stride, i * stride + length)``) copied
        out of a mapped block, or ``None`` where the program must read it (out of range,
        across shards or blocks, not mapped).

        Made once per window shape, with every constant bound: it runs for every local
        random window, where a few attribute loads and a call are a tenth of the time.
        """
        found = self._window_readers.get((length, stride))
        if found is not None:
            return found
        copy = None if self.mapped is None else self.mapped.block_copier(self._streams)
        if copy is None or length > self.manifest.arrays["stream"].block_rows:
            return no_window  # not mapped, or never inside one block
        bounds, dtype, itemsize = self._bounds, self.dtype, self.itemsize
        last = bounds[-1] - length
        unpack, empty, bisect_right = self.unpack, np.empty, bisect.bisect_right
        segment_arrays = self.segment_arrays
        # unpack's segment arrays by shard position, made as shards are first read
        segments: dict[int, tuple[np.ndarray, np.ndarray]] = {}

        lone = getattr(self.format, "lone_field", None)
        plain = lone() if callable(lone) else None
        # a token stream: one plain array of the field's dtype, no structured view
        name, out_dtype = plain if plain is not None else (None, dtype)

        def read(index: int) -> Any:
            start = index * stride
            if start < 0 or start > last:
                return None
            part = bisect_right(bounds, start) - 1  # (bisect skips empty shards)
            if start > bounds[part + 1] - length:
                return None  # spans shards
            out = empty(length, out_dtype)
            if not copy(part, start - bounds[part], length, ((out, 0, itemsize),)):
                return None
            if name is not None:
                return {name: out}
            segment = segments.get(part)
            if segment is None:
                if len(segments) >= _MAX_SEGMENT_ARRAYS:
                    segments.clear()
                segment = segments[part] = segment_arrays(length, part)
            lengths, shards = segment
            return unpack(out, lengths, shards)

        if len(self._window_readers) >= 64:
            self._window_readers.clear()
        self._window_readers[(length, stride)] = read
        return read

    def segment_arrays(self, length: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        """``unpack``'s segment lengths and shard ids of a one-segment read (read-only
        arrays, made once per length and shard: windows mostly share one length)."""
        found = self._segment_arrays.get((length, part))
        if found is None:
            if len(self._segment_arrays) >= _MAX_SEGMENT_ARRAYS:
                self._segment_arrays.clear()
            lengths = np.array([length], dtype=np.int64)
            shards = np.array([self.shard_ids[part]], dtype=np.int64)
            lengths.flags.writeable = shards.flags.writeable = False
            found = self._segment_arrays[(length, part)] = (lengths, shards)
        return found
