"""Reading frame windows: which groups a ``fields`` argument needs, and the window program.

A window of some fields of one record is one :class:`~rangestream.layout.pieces.RowRead`
per field group involved, whose outputs are the fields' new arrays (a field's bytes within
the group's row); the executors do the rest (one range request per group and block fetched,
or one copy per field out of a mapped block), after a step reading the record's index
entry when it is not cached. On a mapped local dataset a window of a cached record inside
one block per group skips the program: ``OpenedTemporal.window_in_block``. Whole records
are the same reads for all their frames, many records in one step (``records``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rangestream.layout.executors import BlockCopier, Program
from rangestream.layout.pieces import Output, RowRead, StoredArray
from rangestream.storage.core.opening import OpenedStorage
from rangestream.storage.temporal.frame_counts import FrameCounts
from rangestream.storage.temporal.index import RecordIndex
from rangestream.storage.temporal.mapped_windows import WindowReader, make_window_reader
from rangestream.storage.temporal.selection import Selection, as_written, select

__all__ = ["OpenedTemporal", "Selection", "as_written"]

_MAX_CACHED_SELECTIONS = 64


class OpenedTemporal(OpenedStorage):
    """A temporal dataset's opened version: its record index and window programs."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.index: RecordIndex = args[-1]
        self.schema = self.index.schema
        #: Every record's frames, read by range when asked for (``FrameCounts``).
        self.frame_counts = FrameCounts(self.index, self.run_sync, self.storage)
        groups = self.schema.groups
        #: ``arrays[part][group number]``: each group's array in each shard.
        self.arrays: list[list[StoredArray]] = [
            [self.array(shard, group.array) for group in groups] for shard in self.shard_ids
        ]
        self._selections: dict[tuple[str, ...] | None, Selection] = {}
        self._window_readers: dict[tuple[tuple[str, ...] | None, int], WindowReader] = {}
        #: Per group: the mapped executor's copier of its arrays (``None``: not mapped).
        self.copiers = [self._copier(number) for number in range(len(groups))]

    def _copier(self, number: int) -> BlockCopier | None:
        """The mapped executor's copier of group ``number``'s arrays, if blocks are mapped."""
        if self.mapped is None:
            return None
        return self.mapped.block_copier([arrays[number] for arrays in self.arrays])

    def selection(self, fields: Sequence[str] | None) -> Selection:
        """The selection of ``fields``, checked and made once per distinct argument."""
        key = None if fields is None else tuple(fields)
        found = self._selections.get(key)
        if found is None:
            found = select(self.schema, fields)
            if len(self._selections) >= _MAX_CACHED_SELECTIONS:
                self._selections.clear()
            self._selections[key] = found
        return found

    def _outputs(
        self, selection: Selection, frames: int
    ) -> tuple[dict[str, np.ndarray], list[tuple[int, tuple[Output, ...]]]]:
        result = {
            output.name: np.empty((frames, *output.shape), dtype=output.dtype)
            for output in selection.outputs
        }
        groups = [
            (number, tuple((result[o.name], o.offset, o.nbytes) for o in outputs))
            for number, outputs in selection.groups
        ]
        return result, groups

    def window(
        self, record: int, start: int, frames: int, selection: Selection
    ) -> Program[dict[str, Any]]:
        """Program reading one window (arguments checked by ``RecordIndex.check_arguments``):
        the record's index entry if it is not cached (one request), then one row read per
        selected group. The fields' arrays are made once the rows are known to exist
        (``RowRead.ready``).
        """
        index = self.index
        entry = index.cached(record)
        if entry is None:
            (entry,) = yield from index.entries([record])
        first_row, count, part = entry
        index.check_window(record, start, frames, count)
        window = _Window(self, selection, frames)
        reads = window.reads(part, first_row + start)
        if reads:
            yield reads
        return window.result()

    def records(
        self, records: Sequence[int], selection: Selection
    ) -> Program[list[dict[str, Any]]]:
        """Program reading whole records (checked indexes): their index entries in one step
        if any is not cached, then every record's group rows in one step, whose ranges the
        executor coalesces (adjacent records of a shard are one request per group)."""
        index = self.index
        entries = yield from index.entries(records)
        windows = [_Window(self, selection, count) for _first, count, _part in entries]
        reads = [
            read
            for window, (first_row, _count, part) in zip(windows, entries, strict=True)
            for read in window.reads(part, first_row)
        ]
        if reads:
            yield reads
        return [window.result() for window in windows]

    def window_in_block(
        self, record: Any, start: Any, frames: Any, fields: Sequence[str] | None
    ) -> dict[str, Any] | None:
        """One window copied out of mapped blocks, or ``None`` (take ``window``).

        The hot path of local windows (``mapped_windows``): only plain ints inside a record
        whose index entry is cached, a ``fields`` argument seen before, and every group's
        rows inside one block that is mapped; anything else, and every error, takes the
        checked program.
        """
        if type(frames) is not int:
            return None
        key = (None if fields is None else tuple(fields), frames)
        reader = self._window_readers.get(key)
        if reader is None:
            selection = self._selections.get(key[0])
            if selection is None:
                return None  # not checked yet: the program checks it, then it is seen
            if len(self._window_readers) >= _MAX_CACHED_SELECTIONS:
                self._window_readers.clear()
            reader = self._window_readers[key] = make_window_reader(self, selection, frames)
        return reader(record, start)


class _Window:
    """One window's (or record's) outputs, made on the first group read that is ready."""

    __slots__ = ("frames", "made", "opened", "selection")

    def __init__(self, opened: OpenedTemporal, selection: Selection, frames: int) -> None:
        self.opened = opened
        self.selection = selection
        self.frames = frames
        self.made: tuple[dict[str, np.ndarray], list[tuple[int, tuple[Output, ...]]]] | None = None

    def _outputs_of(self, position: int) -> Callable[[RowRead], tuple[Output, ...]]:
        def make(_read: RowRead) -> tuple[Output, ...]:
            if self.made is None:
                self.made = self.opened._outputs(self.selection, self.frames)
            return self.made[1][position][1]

        return make

    def reads(self, part: int, first: int) -> list[RowRead]:
        arrays = self.opened.arrays[part]
        return [
            RowRead(arrays[number], first, first + self.frames, make=self._outputs_of(position))
            for position, (number, _outputs) in enumerate(self.selection.groups)
        ]

    def result(self) -> dict[str, Any]:
        made = self.made
        result = made[0] if made is not None else self.opened._outputs(self.selection,
                                                                       self.frames)[0]  # fmt: skip
        if self.selection.torch:
            return as_written(result, self.selection.torch)
        return result
