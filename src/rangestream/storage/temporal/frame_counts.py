"""``FrameCounts``: every record's frame count as a lazy array, so no one reads N up front.

``TemporalArrayStorage.frame_counts`` is what users of LitData's temporal datasets index
like an array; at 10^8 records the whole array is 800 MB to read, so it reads the record
index by range as it is indexed (``storage.temporal.frame_index``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rangestream.layout.executors import Program
from rangestream.storage.temporal.frame_index import BULK_RECORDS
from rangestream.storage.temporal.index import RecordIndex

__all__ = ["FrameCounts"]


class FrameCounts:
    """Every record's frame count, as a lazy read-only ``int64`` array-like.

    ``counts[i]``, ``counts[a:b]``, ``counts[array]``, ``len``, iteration and
    ``np.asarray(counts)`` read the record index by range as they need it: nothing of the
    dataset's size is read until asked for. Reading all of it (``np.asarray``,
    ``tolist``, iteration to the end) costs 16 bytes per record read.
    """

    dtype = np.dtype(np.int64)
    ndim = 1

    def __init__(
        self, index: RecordIndex, run: Callable[[Program[Any]], Any], storage: Any
    ) -> None:
        self._opened_index: RecordIndex | None = index
        self._opened_run: Callable[[Program[Any]], Any] | None = run
        #: The storage these counts are of: what a pickled copy opens again.
        self.storage = storage

    @classmethod
    def of_storage(cls, storage: Any) -> FrameCounts:
        """The counts of ``storage``, opened on first use in this process (unpickling)."""
        counts = cls.__new__(cls)
        counts._opened_index = counts._opened_run = None
        counts.storage = storage
        return counts

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrameCounts.of_storage, (self.storage,))

    def _open(self) -> None:
        opened = self.storage.frame_counts  # the storage's own reader's counts
        self._opened_index, self._opened_run = opened._index, opened._run

    @property
    def _index(self) -> RecordIndex:
        if self._opened_index is None:
            self._open()
        return self._opened_index  # type: ignore[return-value]

    @property
    def _run(self) -> Callable[[Program[Any]], Any]:
        if self._opened_run is None:
            self._open()
        return self._opened_run  # type: ignore[return-value]

    def __repr__(self) -> str:
        if self._opened_index is None:
            return f"FrameCounts({self.storage!r}, not opened in this process)"
        return f"FrameCounts({self._index.count} records)"

    def __len__(self) -> int:
        return self._index.count

    @property
    def shape(self) -> tuple[int]:
        return (self._index.count,)

    @property
    def size(self) -> int:
        return self._index.count

    def __getitem__(self, key: Any) -> Any:
        index = self._index
        if isinstance(key, slice):
            low, high, step = key.indices(index.count)
            if step == 1:
                return self._frozen(self._run(index.frames.counts(low, max(low, high))))
            return self[np.arange(low, high, step, dtype=np.int64)]
        if isinstance(key, (list, tuple, np.ndarray)):
            records = np.asarray(key)
            if records.dtype == np.bool_:
                if records.shape != (index.count,):
                    raise IndexError(
                        f"boolean index of shape {records.shape} does not match "
                        f"{index.count} records"
                    )
                records = np.flatnonzero(records)
            elif records.dtype.kind not in "iu":
                raise TypeError(f"records must be integers, got dtype {records.dtype}")
            records = records.astype(np.int64)
            records = np.where(records < 0, records + index.count, records)
            return self._frozen(self._run(index.frames.counts_of(records)))
        record = index.check_record(key)
        ((_first, frames, _part),) = self._run(index.entries([record]))
        return frames

    @staticmethod
    def _frozen(array: np.ndarray) -> np.ndarray:
        array.flags.writeable = False
        return array

    def __iter__(self) -> Iterator[int]:
        for low in range(0, self._index.count, BULK_RECORDS):
            high = min(self._index.count, low + BULK_RECORDS)
            yield from self._run(self._index.frames.counts(low, high)).tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        counts = self[:]
        return counts if dtype is None else counts.astype(dtype, copy=False)

    def tolist(self) -> list[int]:
        return self[:].tolist()  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> Any:
        return np.asarray(self) == other

    __hash__ = None  # type: ignore[assignment]
