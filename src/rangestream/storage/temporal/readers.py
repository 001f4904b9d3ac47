"""The sync and async readers of a temporal storage: the two faces of its opened version.

``TemporalArrayStorage`` describes a dataset; reading it goes through these readers, which
hold the version opened in their process (``storage.core.opening``) and ask its record index
(``storage.temporal.index``) and window programs (``storage.temporal.read``). The storage's
own ``read_window`` and index questions are those of a default sync reader. The sync
reader's single-window path copies out of a mapped block without building a program
(``OpenedTemporal.window_in_block``); the async one does the same inline or, for a large
window, in a worker thread so the loop is not stalled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rangestream.arguments import integer, positive_integer
from rangestream.errors import OutOfRangeError
from rangestream.io.local import INLINE_READ_BYTES
from rangestream.storage.core.readers import AsyncReader, SyncReader
from rangestream.storage.temporal.frame_counts import FrameCounts

__all__ = ["AsyncTemporalReader", "TemporalReader", "aread_window", "concurrency"]


def concurrency(max_concurrency: int | None, max_concurrent_reads: int | None) -> int | None:
    """One bound from the two names callers use (``max_concurrent_reads`` is LitData's)."""
    if max_concurrency is not None and max_concurrent_reads is not None:
        raise TypeError("give max_concurrency or max_concurrent_reads, not both")
    value = max_concurrency if max_concurrency is not None else max_concurrent_reads
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_concurrent_reads must be an integer >= 1, got {value!r}")
    return value


class _TemporalFacts:
    """What both readers answer from the opened version alone, without a read."""

    opened: Any

    @property
    def frame_counts(self) -> FrameCounts:
        return self.opened.frame_counts  # type: ignore[no-any-return]

    @property
    def fields(self) -> list[str]:
        return self.opened.schema.field_names  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self.opened.index)


#: Records read per step when iterating whole records.
_ITERATION_RECORDS = 64


class TemporalReader(_TemporalFacts, SyncReader):
    """Sync windows and records of a temporal storage."""

    def __getitem__(self, record: int) -> dict[str, Any]:
        """The whole record: every field, all frames (negative indexes count from the end)."""
        opened = self.opened
        record = opened.index.check_record(record)
        (result,) = opened.run_sync(opened.records([record], opened.selection(None)))
        return result  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        count = len(self)
        for low in range(0, count, _ITERATION_RECORDS):
            yield from self.read_records(range(low, min(count, low + _ITERATION_RECORDS)))

    def read_records(
        self, records: Sequence[int], fields: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """Whole records (negative indexes count from the end), read together: their index
        entries in one round if any is missing, then one round of coalesced ranges."""
        opened = self.opened
        checked = [opened.index.check_record(record) for record in records]
        selection = opened.selection(fields)
        if not checked:
            return []
        return opened.run_sync(opened.records(checked, selection))  # type: ignore[no-any-return]

    @property
    def total_frames(self) -> int:
        """Frames of all records together."""
        opened = self.opened
        return int(opened.run_sync(opened.index.frames.frame_starts())[-1])

    def locate_frames(self, positions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """The record holding each global frame number, and the frame's number within it.

        Global frames number the frames of record 0, then record 1, and so on
        (``[0, total_frames)``). This is what a sampler needs to draw windows uniformly
        over all frames of a dataset of any size: it reads the cumulative index
        (``index/frame_starts``, 8 bytes per inner chunk of the record index) once, then
        the record index chunk holding each position (cached), never every record.

        Returns
        -------
        records, starts : numpy.ndarray
            ``int64`` arrays shaped like ``positions``.
        """
        opened = self.opened
        return opened.run_sync(opened.index.frames.locate_frames(np.asarray(positions)))  # type: ignore[no-any-return]

    def frame_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(frames, records)``: every distinct frame count, ascending, and how many
        records have it, read once from ``index/frame_histogram``."""
        opened = self.opened
        return opened.run_sync(opened.index.frames.histogram())  # type: ignore[no-any-return]

    def count_windows(self, frames: int) -> tuple[int, int]:
        """``(records, windows)``: records with at least ``frames`` frames, and distinct
        ``(record, start)`` windows of ``frames`` frames, from the histogram."""
        return _count_windows(self.frame_histogram(), frames)

    @property
    def index_in_memory(self) -> bool:
        """Whether the whole record index fits in the index cache (``index_cache_bytes``):
        read once, then every index question is answered from memory."""
        return bool(self.opened.index.whole_fits)

    def frame_counts_of(self, records: npt.ArrayLike) -> np.ndarray:
        """Frames of the records ``records`` (an integer array, any order): the index
        chunks holding them are read (and cached) as for windows, nothing else."""
        opened = self.opened
        return opened.run_sync(opened.index.frames.counts_of(_record_array(records)))  # type: ignore[no-any-return]

    def frame_counts_between(self, low: int, high: int) -> np.ndarray:
        """Frames of records ``[low, high)``, read in bounded pieces (16 bytes a record)."""
        opened = self.opened
        low, high = _record_span(low, high, len(opened.index))
        return opened.run_sync(opened.index.frames.counts(low, high))  # type: ignore[no-any-return]

    def read_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
        max_concurrent_reads: int | None = None,
    ) -> dict[str, Any]:
        """See ``TemporalArrayStorage.read_window``."""
        opened = self._opening.opened.value or self._opening.get_sync()
        if max_concurrency is None and max_concurrent_reads is None:
            window = opened.window_in_block(record, start, frames, fields)
            if window is not None:
                return window  # type: ignore[no-any-return]
            return self.program_window(record, start, frames, fields, None)
        bound = concurrency(max_concurrency, max_concurrent_reads)
        return self.program_window(record, start, frames, fields, bound)

    def program_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None,
        bound: int | None,
    ) -> dict[str, Any]:
        """The window read by its checked program (no mapped shortcut tried): what
        ``read_window`` does once the mapped path has declined it."""
        opened = self._opening.opened.value or self._opening.get_sync()
        record, start, frames = opened.index.check_arguments(record, start, frames)
        # no shortcut for ``fields=[]``: the window's bounds are checked like any other's
        program = opened.window(record, start, frames, opened.selection(fields))
        return opened.run_sync(program, max_concurrency=bound)  # type: ignore[no-any-return]


class AsyncTemporalReader(_TemporalFacts, AsyncReader):
    """Async windows and records of a temporal storage."""

    async def read_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
        max_concurrent_reads: int | None = None,
    ) -> dict[str, Any]:
        opened = await self._opened()
        return await aread_window(
            opened, record, start, frames, fields,
            concurrency(max_concurrency, max_concurrent_reads),
        )  # fmt: skip

    async def read_records(
        self,
        records: Sequence[int],
        fields: Sequence[str] | None = None,
        *,
        max_concurrency: int | None = None,
    ) -> list[dict[str, Any]]:
        """``TemporalReader.read_records`` on the running loop."""
        opened = await self._opened()
        checked = [opened.index.check_record(record) for record in records]
        selection = opened.selection(fields)
        if not checked:
            return []
        return await opened.run(  # type: ignore[no-any-return]
            opened.records(checked, selection), max_concurrency=max_concurrency
        )

    async def get(self, record: int) -> dict[str, Any]:
        """The whole record (``await reader.get(i)``)."""
        (result,) = await self.read_records([record])
        return result

    # -- the record index, as the sync reader's (see ``TemporalReader``) ---------------------
    async def frame_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``TemporalReader.frame_histogram`` on the running loop."""
        opened = await self._opened()
        return await opened.run(opened.index.frames.histogram())  # type: ignore[no-any-return]

    async def count_windows(self, frames: int) -> tuple[int, int]:
        """``TemporalReader.count_windows`` on the running loop."""
        return _count_windows(await self.frame_histogram(), frames)

    async def locate_frames(self, positions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``TemporalReader.locate_frames`` on the running loop."""
        opened = await self._opened()
        return await opened.run(opened.index.frames.locate_frames(np.asarray(positions)))  # type: ignore[no-any-return]

    async def frame_counts_of(self, records: npt.ArrayLike) -> np.ndarray:
        """``TemporalReader.frame_counts_of`` on the running loop."""
        opened = await self._opened()
        return await opened.run(opened.index.frames.counts_of(_record_array(records)))  # type: ignore[no-any-return]

    async def frame_counts_between(self, low: int, high: int) -> np.ndarray:
        """``TemporalReader.frame_counts_between`` on the running loop."""
        opened = await self._opened()
        low, high = _record_span(low, high, len(opened.index))
        return await opened.run(opened.index.frames.counts(low, high))  # type: ignore[no-any-return]


def _count_windows(histogram: tuple[np.ndarray, np.ndarray], frames: int) -> tuple[int, int]:
    frames = positive_integer(frames, "frames")
    values, records = histogram
    eligible = values >= frames
    return int(records[eligible].sum()), int(
        (records[eligible] * (values[eligible] - frames + 1)).sum()
    )


def _record_array(records: npt.ArrayLike) -> np.ndarray:
    array = np.asarray(records)
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"records must be integers, got dtype {array.dtype}")
    return array.astype(np.int64).reshape(-1)


def _record_span(low: int, high: int, count: int) -> tuple[int, int]:
    low, high = integer(low, "low"), integer(high, "high")
    if not 0 <= low <= high <= count:
        raise OutOfRangeError(f"records [{low}, {high}) are not within the dataset's {count}")
    return low, high


async def aread_window(
    opened: Any,
    record: Any,
    start: Any,
    frames: Any,
    fields: Sequence[str] | None,
    bound: int | None,
) -> dict[str, Any]:
    """One window on the running loop, for the storage's ``aread_window`` and the async
    reader alike: copied out of a mapped block when it lies in one (in a worker thread
    when large), else read by the window program under ``bound`` requests in flight."""
    record, start, frames = opened.index.check_arguments(record, start, frames)
    selection = opened.selection(fields)  # ``[]`` too reads the entry and checks the bounds
    if opened.mapped is not None:
        nbytes = frames * sum(output.nbytes for output in selection.outputs)
        if nbytes <= INLINE_READ_BYTES:
            window = opened.window_in_block(record, start, frames, fields)
        else:  # a copy of this size would stall the loop: in a thread
            window = await asyncio.to_thread(opened.window_in_block, record, start, frames, fields)
        if window is not None:
            return window  # type: ignore[no-any-return]
    return await opened.run(  # type: ignore[no-any-return]
        opened.window(record, start, frames, selection), max_concurrency=bound
    )
