"""Records of a stream found through its ``record_ends``: whole records, window starts.

Kept apart from the window reads (``stream.windows``) because a window reader never needs
them: they are what ``read_record``, ``read_records`` and windows with record boundaries
add, with the per-shard cache of record ends those lookups share.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, OutOfRangeError
from rangestream.layout.executors import Program
from rangestream.layout.pieces import RowRead
from rangestream.storage.core.opening import OpenedStorage

if TYPE_CHECKING:
    from rangestream.layout.caches import ArrayCache

_INT64 = np.dtype("<i8")


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


class StreamRecords(OpenedStorage):
    """The record lookups of an opened stream (``OpenedStream`` is made of them)."""

    if TYPE_CHECKING:  # set or defined by ``OpenedStream``
        num_records: int
        record_ends: ArrayCache
        stream_bounds: np.ndarray
        _record_starts: np.ndarray | None
        _record_bounds: list[int] | None

        def check_range(self, global_index: Any, length: Any) -> tuple[int, int]: ...
        def segments(self, global_index: int, length: int) -> list[tuple[int, int, int]]: ...
        def read_many(self, requests: Sequence[tuple[int, int]]) -> Program[list[Any]]: ...

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
