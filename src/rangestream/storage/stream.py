"""``StreamStorage``: fixed-size elements (tokens, or structured rows of aligned fields).

Per shard: ``stream`` (the elements) and ``record_ends`` (cumulative element count at the
end of each record). A read of ``[global_index, global_index + length)`` over the
concatenation of shards (in shard order) is one range request per shard and block touched,
copied straight into the window's array.
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import (
    CorruptDataError,
    InvalidRecordError,
    OutOfRangeError,
    SchemaMismatchError,
)
from rangestream.formats.described import check_given_format, format_from_schema, format_schema
from rangestream.io.local import INLINE_READ_BYTES
from rangestream.layout.block import ArrayLayout
from rangestream.layout.caches import ArrayCache
from rangestream.layout.dtypes import (
    check_plain_dtype,
    dtype_from_json,
    dtype_to_json,
    little_endian,
)
from rangestream.layout.executors import Program
from rangestream.layout.manifest import ROOT_KEY, Manifest
from rangestream.layout.pieces import Output, RowRead, StoredArray
from rangestream.storage.base import Storage
from rangestream.storage.opening import OpenedStorage
from rangestream.storage.readers import AsyncReader, SyncReader
from rangestream.storage.writing import ShardEncoder
from rangestream.types import StreamStorageFormat

__all__ = ["StreamStorage", "check_stream_format"]

_INT64 = np.dtype("<i8")
_MAX_SEGMENT_ARRAYS = 4096
#: Default bytes of per-shard record ends a reader keeps (8 bytes per record).
DEFAULT_RECORD_ENDS_CACHE_BYTES = 64 * 1024 * 1024
#: One window's elements, its per-shard segment lengths and shard ids (``unpack``'s input).
Elements = tuple[np.ndarray, np.ndarray, np.ndarray]


class _StreamShardEncoder(ShardEncoder):
    def __init__(self, storage_format: StreamStorageFormat[Any, Any, Any]) -> None:
        self.format = storage_format
        self.dtype = np.dtype(storage_format.stream_dtype)

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        stream = self.format.pack(data)
        check_stream_array(stream, self.dtype, type(self.format).__name__)
        end = lengths["stream"] + len(stream)
        return {"stream": stream, "record_ends": np.asarray([end], dtype=_INT64)}


def check_stream_array(stream: Any, dtype: np.dtype[Any], who: str) -> None:
    if not isinstance(stream, np.ndarray):
        raise InvalidRecordError(
            f"{who}.pack must return a numpy array, got {type(stream).__name__}"
        )
    if stream.ndim != 1:
        raise InvalidRecordError(f"{who}.pack returned shape {stream.shape}; streams are 1-D")
    if stream.dtype != dtype:
        raise InvalidRecordError(
            f"{who}.pack returned dtype {stream.dtype}, the format's stream_dtype is {dtype}"
        )


def check_stream_format(storage_format: Any, methods: Sequence[str]) -> np.dtype[Any]:
    """The format's ``stream_dtype``, once the format is checked to have what a kind needs."""
    dtype = getattr(storage_format, "stream_dtype", None)
    if not isinstance(dtype, np.dtype):
        raise TypeError(
            f"storage_format must have a numpy stream_dtype, got {type(storage_format).__name__}"
        )
    for method in methods:
        if not callable(getattr(storage_format, method, None)):
            raise TypeError(
                f"storage_format must have a {method} method, got {type(storage_format).__name__}"
            )
    check_plain_dtype(dtype, "stream_dtype")
    return dtype


def _joined(program: Program[Any], extra: list[RowRead]) -> Program[Any]:
    """``program``, with ``extra`` reads added to its first round (none added to the count
    of rounds); their results stay on the reads."""
    try:
        step = next(program)
    except StopIteration as stop:
        if extra:
            yield extra
        return stop.value
    results = yield [*step, *extra]
    while True:
        try:
            step = program.send(results[: len(step)])
        except StopIteration as stop:
            return stop.value
        results = yield step


def _record_starts(plan: list[tuple[int, int, int]], found: dict[int, np.ndarray]) -> np.ndarray:
    """Window-relative starts of the records a window's segments overlap: where the record
    holding its first element began (``<= 0``), then every start inside it, increasing."""
    starts: list[int] = []
    at = 0
    for part, low, high in plan:
        ends = found[part]
        first = int(ends.searchsorted(low, side="right"))
        last = int(ends.searchsorted(high, side="left"))
        starts.append(at if at else (int(ends[first - 1]) if first else 0) - low)
        starts.extend(end - low + at for end in ends[first:last].tolist())
        at += high - low
    if not starts:
        return np.zeros(1, np.int64)
    # empty records repeat an end; sorted already, so only neighbours can be equal
    unique = [starts[0], *(b for a, b in pairwise(starts) if b != a)]
    return np.asarray(unique, dtype=np.int64)


def _no_window(index: int) -> None:
    return None  # no mapped blocks: every window takes the program


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


class OpenedStream(OpenedStorage):
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
        self.format: Any = self.storage._reading_format(self.manifest)
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
            if len(segments) == 1:
                windows.append((window, *self.segment_arrays(length, segments[0][0])))
            else:
                lengths = np.asarray([high - low for _, low, high in segments], dtype=np.int64)
                shards = np.asarray([self.shard_ids[p] for p, _, _ in segments], dtype=np.int64)
                windows.append((window, lengths, shards))
        return reads, windows

    def read_many_elements(self, requests: Sequence[tuple[int, int]]) -> Program[list[Elements]]:
        """Elements, segment lengths and segment shards of several reads, in one round."""
        reads, windows = self.window_reads(requests)
        if reads:
            yield reads
        return [(window.array(), lengths, shards) for window, lengths, shards in windows]

    def read_many(self, requests: Sequence[tuple[int, int]]) -> Program[list[Any]]:
        windows = yield from self.read_many_elements(requests)
        unpack = self.unpack
        return [unpack(*window) for window in windows]

    def read(self, global_index: int, length: int) -> Program[Any]:
        (window,) = yield from self.read_many_elements([(global_index, length)])
        return self.unpack(*window)

    # -- records: one append call each, found through record_ends -----------------------
    def locate_record(self, index: Any) -> tuple[int, int]:
        """``(shard position, record within the shard)`` of a global record index.

        Negative indexes count from the end, as for every sequence of items.
        """
        index = integer(index, "record index")
        count = self.num_records
        position = index + count if index < 0 else index
        if not 0 <= position < count:
            raise OutOfRangeError(
                f"record {index} is outside the {count} records [0, {count}) of {self.storage.url}"
            )
        bounds = self._record_bounds
        if bounds is None:  # a list of ints bisects faster than numpy
            bounds = self._record_bounds = self.record_bounds.tolist()
        part = bisect.bisect_right(bounds, position) - 1
        return part, position - bounds[part]

    @property
    def record_bounds(self) -> np.ndarray:
        """Cumulative records per shard position (made on first use)."""
        if self._record_starts is None:
            self._record_starts = self.bounds("record_ends")
        return self._record_starts

    def _cacheable_ends(self, part: int) -> bool:
        rows = self.shard_length("record_ends", self.shard_ids[part])
        return 8 * rows <= self.record_ends.max_bytes

    def _whole_ends(self, part: int) -> RowRead:
        shard = self.shard_ids[part]
        return RowRead.whole(
            self.array(shard, "record_ends"), 0, self.shard_length("record_ends", shard), _INT64
        )

    def _checked_ends(self, part: int, ends: np.ndarray) -> np.ndarray:
        """A shard's record ends once checked (non-decreasing, ending at its length)."""
        shard = self.shard_ids[part]
        length = self.shard_length("stream", shard)
        if len(ends) and (int(ends[0]) < 0 or int(ends[-1]) != length or (np.diff(ends) < 0).any()):
            raise CorruptDataError(
                f"{self.describe(self.manifest.array_key(shard, 'record_ends'))}: record ends "
                f"are not non-decreasing from >= 0 to the shard's {length} elements"
            )
        ends.flags.writeable = False
        self.record_ends.put(shard, ends)
        return ends

    def record_ranges(self, indexes: Sequence[int]) -> Program[list[tuple[int, int]]]:
        """``(global start, length)`` of each record, in one round at most.

        A shard's record ends are read whole on its first touch and kept within
        ``record_ends_cache_bytes``; a shard over that budget reads each record's pair.
        """
        located = [self.locate_record(i) for i in indexes]
        found: dict[int, np.ndarray] = {}
        loads: dict[int, RowRead] = {}
        pairs: dict[int, RowRead] = {}
        for number, (part, j) in enumerate(located):
            shard = self.shard_ids[part]
            cached = self.record_ends.get(shard)
            if cached is not None:
                found[part] = cached
            elif self._cacheable_ends(part):
                if part not in loads:
                    loads[part] = self._whole_ends(part)
            else:
                array = self.array(shard, "record_ends")
                pairs[number] = RowRead.whole(array, max(j - 1, 0), j + 1, _INT64)
        step = [*loads.values(), *pairs.values()]
        if step:
            yield step
        for part, read in loads.items():
            found[part] = self._checked_ends(part, read.target)
        out = []
        for number, (part, j) in enumerate(located):
            if part in found:
                ends = found[part]
                start, end = (int(ends[j - 1]) if j else 0), int(ends[j])
            else:
                values = pairs[number].target
                start, end = (int(values[0]), int(values[1])) if j else (0, int(values[0]))
            if not 0 <= start <= end <= self.shard_length("stream", self.shard_ids[part]):
                raise CorruptDataError(
                    f"{self.describe(self.manifest.array_key(self.shard_ids[part], 'record_ends'))}"
                    f": record {j} spans [{start}, {end}), outside the shard's stream"
                )
            out.append((int(self.stream_bounds[part]) + start, end - start))
        return out

    def read_records(self, indexes: Sequence[int]) -> Program[list[Any]]:
        """Whole records (sample ``i`` of an SFT set, as Megatron's ``IndexedDataset[i]``):
        their ranges (one round unless the shards' record ends are cached), then the
        window reads of those ranges."""
        ranges = yield from self.record_ranges(indexes)
        return (yield from self.read_many(ranges))

    def read_many_with_starts(
        self, requests: Sequence[tuple[int, int]]
    ) -> Program[list[tuple[Any, np.ndarray]]]:
        """Windows, each with the starts of the records it overlaps (window-relative).

        ``starts[0] <= 0`` is where the record holding the window's first element began;
        the others are the positions inside the window where a record begins (every shard
        boundary is one). The record ends of shards not yet cached are read whole in the
        same round as the windows' first reads, so a window costs no extra request once
        its shards are known and no extra round ever.
        """
        plans = [self.segments(*self.check_range(start, length)) for start, length in requests]
        parts = sorted({part for plan in plans for part, _, _ in plan})
        found: dict[int, np.ndarray] = {}
        loads: dict[int, RowRead] = {}
        for part in parts:
            cached = self.record_ends.get(self.shard_ids[part])
            if cached is not None:
                found[part] = cached
            elif self._cacheable_ends(part):
                loads[part] = self._whole_ends(part)
            else:
                shard = self.shard_ids[part]
                raise OutOfRangeError(
                    f"shard {shard} of {self.storage.url} has "
                    f"{self.shard_length('record_ends', shard)} records, more record ends "
                    f"than record_ends_cache_bytes={self.record_ends.max_bytes} holds; "
                    "windows with boundaries need a shard's ends in memory: raise it"
                )
        windows = yield from _joined(self.read_many(requests), list(loads.values()))
        for part, read in loads.items():
            found[part] = self._checked_ends(part, read.target)
        return [
            (window, _record_starts(plan, found))
            for plan, window in zip(plans, windows, strict=True)
        ]

    def cached_starts(self, global_index: int, length: int) -> np.ndarray | None:
        """The record starts of a window whose shards' record ends are cached, or ``None``
        (then ``read_many_with_starts`` reads them)."""
        plan = self.segments(global_index, length)
        found = {}
        for part, _, _ in plan:
            ends = self.record_ends.get(self.shard_ids[part])
            if ends is None:
                return None
            found[part] = ends
        return _record_starts(plan, found)

    def read_in_block(self, global_index: Any, length: Any) -> Any:
        """One window copied straight out of a mapped block, or ``None`` (take ``read``).

        The hot path of local random windows: only plain ints, inside one shard and one
        block of a mapped dataset; anything else, and every error, takes the program.
        """
        if type(global_index) is not int or type(length) is not int or length <= 0:
            return None
        return self.window_reader(length, 1)(global_index)

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
            return _no_window  # not mapped, or never inside one block
        bounds, dtype, itemsize = self._bounds, self.dtype, self.itemsize
        last = bounds[-1] - length
        unpack, empty, bisect_right = self.unpack, np.empty, bisect.bisect_right
        segment_arrays = self.segment_arrays
        # unpack's segment arrays by shard position, made as shards are first read
        segments: dict[int, tuple[np.ndarray, np.ndarray]] = {}

        def read(index: int) -> Any:
            start = index * stride
            if start < 0 or start > last:
                return None
            part = bisect_right(bounds, start) - 1  # (bisect skips empty shards)
            if start > bounds[part + 1] - length:
                return None  # spans shards
            out = empty(length, dtype)
            if not copy(part, start - bounds[part], length, ((out, 0, itemsize),)):
                return None
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


class StreamStorage(Storage):
    """Fixed-size stream elements in shards, read as windows over their concatenation.

    Parameters
    ----------
    url
        Where the dataset lives (local path, ``s3://``, ``memory://``, any fsspec URL).
    storage_format
        A ``StreamStorageFormat`` (e.g. ``StreamNumpyFormat``) defining ``stream_dtype``,
        ``pack`` and ``unpack``; needed to write. Readers may omit it when the dataset
        records its format (formats with a ``schema()``, as ``StreamNumpyFormat``, are
        recorded by every write): ``StreamStorage(url)``. A format given to read is
        checked against the stored dtype and format.
    record_ends_cache_bytes
        Bytes of per-shard record ends each reader keeps: ``read_record`` and windows with
        record boundaries read a shard's ends whole on its first touch, then need no
        request for them.
    **options
        See ``Storage`` (storage_options, read and layout options).
    """

    kind = "stream"
    opened_class = OpenedStream
    #: The methods the format must have.
    format_methods: tuple[str, ...] = ("pack", "unpack")

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_format: StreamStorageFormat[Any, Any, Any] | None = None,
        *,
        record_ends_cache_bytes: int = DEFAULT_RECORD_ENDS_CACHE_BYTES,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        if storage_format is not None:
            check_stream_format(storage_format, self.format_methods)
        self.storage_format = storage_format
        self.record_ends_cache_bytes = integer(
            record_ends_cache_bytes, "record_ends_cache_bytes", minimum=0
        )

    @property
    def stream_dtype(self) -> np.dtype[Any]:
        """The dtype of one element: the format's, or the stored one (which opens the
        dataset in this process, once, when no format was given)."""
        if self.storage_format is not None:
            return np.dtype(self.storage_format.stream_dtype)
        return self._default_opening.get_sync().dtype  # type: ignore[attr-defined, no-any-return]

    def _writing_format(self) -> Any:
        if self.storage_format is None:
            raise TypeError(
                f"{type(self).__name__}({self.url!r}) was made without a format: it reads "
                "what the dataset records, but writing needs the storage_format"
            )
        return self.storage_format

    def _array_layouts(self) -> dict[str, ArrayLayout]:
        return {
            "stream": self._layout(self._writing_format().stream_dtype),
            "record_ends": self._layout(_INT64, chunk_bytes=max(self.chunk_bytes, 8192)),
        }

    def _schema(self) -> dict[str, Any]:
        storage_format = self._writing_format()
        schema = {"stream_dtype": dtype_to_json(little_endian(storage_format.stream_dtype))}
        described = format_schema(storage_format)
        if described is not None:
            schema["format"] = described
        return schema

    def _stored_dtype(self, manifest: Manifest) -> np.dtype[Any]:
        return dtype_from_json(manifest.schema.get("stream_dtype"), "stored stream_dtype")

    def _reading_format(self, manifest: Manifest) -> Any:
        """The given format once checked against the store, else the one it records."""
        stored = self._stored_dtype(manifest)
        where = f"{self.url}/{ROOT_KEY}"
        storage_format = self.storage_format
        if storage_format is not None:
            # stored little-endian: a big-endian format is the same format
            if little_endian(stored) != little_endian(storage_format.stream_dtype):
                raise SchemaMismatchError(
                    f"{self.url} stores stream_dtype {stored}, but the format has "
                    f"{storage_format.stream_dtype}"
                )
            check_given_format(storage_format, manifest.schema.get("format"), where)
            return storage_format
        recorded = manifest.schema.get("format")
        if recorded is None:
            raise SchemaMismatchError(
                f"{self.url} does not record its format (it was written with a format "
                "that has no schema(), or before formats were recorded): pass the format "
                f"it was written with, {type(self).__name__}(url, storage_format)"
            )
        storage_format = format_from_schema(recorded, where, stored)
        try:
            dtype = check_stream_format(storage_format, self.format_methods)
        except TypeError as error:
            raise SchemaMismatchError(
                f"{where}: the recorded format {recorded.get('format')!r} cannot read a "
                f"{self.kind} dataset ({error})"
            ) from error
        if little_endian(dtype) != little_endian(stored):
            raise SchemaMismatchError(
                f"{where}: the recorded format reads {dtype}, the store has {stored}"
            )
        return storage_format

    def _check_schema(self, manifest: Manifest) -> None:
        if set(manifest.arrays) != {"stream", "record_ends"}:
            raise SchemaMismatchError(f"{self.url} does not hold a stream dataset's arrays")
        self._reading_format(manifest)

    def _shard_encoder(self) -> ShardEncoder:
        return _StreamShardEncoder(self._writing_format())


class _StreamFacts:
    """What both readers of a stream say about it."""

    opened: Any

    @property
    def format(self) -> Any:
        """The format windows decode with: the one given, or the one the dataset records."""
        return self.opened.format

    @property
    def num_shards(self) -> int:
        """One more than the highest shard id written (unwritten shards hold nothing)."""
        return int(self.opened.num_shards)

    def num_elements(self, shard: int | None = None) -> int:
        """Elements in ``shard``, or in all shards (``None``)."""
        if shard is None:
            return int(self.opened.total_length)
        return int(self.opened.shard_length("stream", int(shard)))

    def num_records(self, shard: int | None = None) -> int:
        """Records (``append`` calls) in ``shard``, or in all shards (``None``)."""
        if shard is None:
            return int(self.opened.num_records)
        return int(self.opened.shard_length("record_ends", int(shard)))

    # the names these counts had first, kept for existing callers
    @property
    def total_length(self) -> int:
        """Elements over all shards (``num_elements()``)."""
        return int(self.opened.total_length)

    def length(self, shard: int) -> int:
        """Elements in ``shard`` (``num_elements(shard)``; 0 for a shard never written)."""
        return int(self.opened.shard_length("stream", int(shard)))


class StreamStorageReader(_StreamFacts, SyncReader):
    """Sync reads of a stream storage: ``read(global_index, length)``, ``read_many``."""

    def read(self, global_index: int, length: int) -> Any:
        """Decode elements ``[global_index, global_index + length)`` with the format."""
        opened = self._opening.opened.value or self._opening.get_sync()
        window = opened.read_in_block(global_index, length)
        if window is not None:
            return window
        return opened.run_sync(opened.read(global_index, length))

    def read_many(self, requests: Sequence[tuple[int, int]]) -> list[Any]:
        """Several ``(global_index, length)`` reads fetched together (coalesced)."""
        return self._run(self.opened.read_many(requests))

    def read_record(self, index: int) -> Any:
        """Record ``index``: the elements of one ``append`` call, decoded by the format.

        Sample ``i`` of an SFT set (Megatron's ``IndexedDataset[i]``); negative indexes
        count from the end. Costs the record's range once its shard's record ends are
        cached (read whole on the shard's first touch).
        """
        (record,) = self._run(self.opened.read_records([index]))
        return record

    def read_records(self, indexes: Sequence[int]) -> list[Any]:
        """Several records, their rounds shared and coalesced."""
        return self._run(self.opened.read_records(list(indexes)))  # type: ignore[no-any-return]

    def read_many_with_starts(
        self, requests: Sequence[tuple[int, int]]
    ) -> list[tuple[Any, np.ndarray]]:
        """Windows, each with the window-relative starts of the records it overlaps."""
        return self._run(self.opened.read_many_with_starts(requests))  # type: ignore[no-any-return]


class AsyncStreamStorageReader(_StreamFacts, AsyncReader):
    """Async reads of a stream storage, with the sync reader's API awaited."""

    async def read(
        self, global_index: int, length: int, *, max_concurrency: int | None = None
    ) -> Any:
        opened = await self._opened()
        if type(length) is int and length * opened.itemsize <= INLINE_READ_BYTES:
            window = opened.read_in_block(global_index, length)  # a mapped copy: inline
        else:  # a copy of this size would stall the loop: in a thread
            window = await asyncio.to_thread(opened.read_in_block, global_index, length)
        if window is not None:
            return window
        return await opened.run(opened.read(global_index, length), max_concurrency=max_concurrency)

    async def read_many(
        self, requests: Sequence[tuple[int, int]], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._opened()
        return await opened.run(opened.read_many(requests), max_concurrency=max_concurrency)

    async def read_record(self, index: int, *, max_concurrency: int | None = None) -> Any:
        (record,) = await self.read_records([index], max_concurrency=max_concurrency)
        return record

    async def read_records(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        opened = await self._opened()
        program = opened.read_records(list(indexes))
        return await opened.run(program, max_concurrency=max_concurrency)  # type: ignore[no-any-return]

    async def read_many_with_starts(
        self, requests: Sequence[tuple[int, int]], *, max_concurrency: int | None = None
    ) -> list[tuple[Any, np.ndarray]]:
        opened = await self._opened()
        program = opened.read_many_with_starts(requests)
        return await opened.run(program, max_concurrency=max_concurrency)  # type: ignore[no-any-return]


StreamStorage.sync_reader_class = StreamStorageReader
StreamStorage.async_reader_class = AsyncStreamStorageReader
