"""``TemporalRecords``: whole temporal records as a sequence, and seeded splits of them.

A ``TemporalArrayStorage`` is read by window; training code that wants whole records (a
LitData user's ``tracks[12]``, iterating the dataset, an ordered or shuffled record loader)
or a train/test split of the records uses this dataset. It keeps the temporal API
(``read_window``, ``aread_window``, ``frame_counts``) with record numbers of its own:
record ``i`` of a split is record ``records[i]`` of the storage, so a split reads windows
exactly as the whole dataset does.

``train_test_split(dataset, splits=[0.8, 0.2], seed=...)`` draws the splits (LitData's
signature): disjoint sets of records, each in the storage's order, the same for equal
seeds in any process. ``torch.utils.data.random_split`` returns torch ``Subset`` objects,
which cannot carry the temporal API; ``TemporalRecords.from_subset(subset)`` turns one into
a ``TemporalRecords`` with the same records.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rangestream.dataset.indexing import positions
from rangestream.dataset.readers import AsyncDatasetReader, DatasetReader
from rangestream.errors import OutOfRangeError

__all__ = [
    "AsyncTemporalRecordReader",
    "TemporalRecordReader",
    "TemporalRecords",
    "train_test_split",
]


def _temporal_storage(storage: Any) -> Any:
    if getattr(storage, "kind", None) != "temporal" or not hasattr(storage, "read_window"):
        raise TypeError(
            f"TemporalRecords needs a TemporalArrayStorage, got {type(storage).__name__}"
        )
    return storage


class TemporalRecords:
    """Whole records of a ``TemporalArrayStorage``, or of a subset of its records.

    Parameters
    ----------
    storage
        The temporal storage (a cheap, picklable description: hand it to workers).
    records
        The storage's record numbers this dataset holds, in its order (default: all).
        Each record appears at most once.
    fields
        Fields each record returns (default: all).
    """

    #: The loader's kind (``StatefulDataLoader.from_storage``): whole records by index.
    kind = "temporal_records"

    def __init__(
        self,
        storage: Any,
        records: npt.ArrayLike | None = None,
        *,
        fields: Sequence[str] | None = None,
    ) -> None:
        self.storage = _temporal_storage(storage)
        if isinstance(fields, (str, bytes)):
            raise TypeError(f"fields must be a list of field names, got the string {fields!r}")
        self.fields = None if fields is None else [str(name) for name in fields]
        self.records: np.ndarray | None = None
        if records is not None:
            ids = np.asarray(records)
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise TypeError(f"records must be a 1-D sequence of integers, got {ids!r}")
            ids = ids.astype(np.int64)
            if ids.size and int(ids.min()) < 0:
                raise OutOfRangeError(f"record {int(ids.min())} is negative")
            if np.unique(ids).size != ids.size:
                raise ValueError("records lists a record more than once")
            ids.flags.writeable = False
            self.records = ids

    @classmethod
    def from_subset(cls, subset: Any) -> TemporalRecords:
        """The records of a ``torch.utils.data.Subset`` (what ``random_split`` returns) of
        a ``TemporalRecords`` or a ``TemporalArrayStorage``, with the temporal API."""
        parent, indices = subset.dataset, np.asarray(subset.indices, dtype=np.int64)
        if isinstance(parent, TemporalRecords):
            return parent.subset(indices)
        return cls(parent, indices)

    def __repr__(self) -> str:
        held = "all records" if self.records is None else f"{len(self.records)} records"
        return f"TemporalRecords({self.storage!r}, {held})"

    # -- records ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.storage) if self.records is None else len(self.records)

    def record_id(self, index: Any) -> int:
        """The storage's record number of this dataset's record ``index`` (negative
        indexes count from the end)."""
        (position,), _many = positions(index, len(self))
        return position if self.records is None else int(self.records[position])

    def ids(self, indexes: Sequence[int], count: int | None = None) -> list[int]:
        """The storage's record numbers of this dataset's records ``indexes`` (``count``:
        this dataset's length, if the caller knows it without opening the storage)."""
        count = len(self) if count is None else count
        checked = [positions(int(i), count)[0][0] for i in indexes]
        if self.records is None:
            return checked
        return self.records[np.asarray(checked, dtype=np.int64)].tolist()  # type: ignore[no-any-return]

    def subset(self, indexes: npt.ArrayLike) -> TemporalRecords:
        """The records at ``indexes`` of this dataset, as a dataset of their own."""
        chosen = np.asarray(indexes, dtype=np.int64).reshape(-1)
        return TemporalRecords(self.storage, self.ids(chosen.tolist()), fields=self.fields)

    def with_fields(self, fields: Sequence[str] | None) -> TemporalRecords:
        """These records, returning ``fields`` (all when ``None``)."""
        return TemporalRecords(self.storage, self.records, fields=fields)

    @property
    def frame_counts(self) -> Any:
        """Frames of each record of this dataset: the storage's lazy array-like for the
        whole dataset, a read-only ``int64`` array for a subset (read once)."""
        counts = self.storage.frame_counts
        if self.records is None:
            return counts
        found = getattr(self, "_frame_counts", None)
        if found is None:
            found = self._frame_counts = counts[self.records]
        return found

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_frame_counts", None)  # read again where needed, not pickled to workers
        return state

    def __getitem__(self, key: int | slice) -> Any:
        """A whole record (``dict`` of field arrays), or a list of them for a slice."""
        indexes, many = positions(key, len(self))
        results = self.storage.read_records(self.ids(indexes), self.fields)
        return results if many else results[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for low in range(0, len(self), _ITERATION_RECORDS):
            batch = range(low, min(len(self), low + _ITERATION_RECORDS))
            yield from self.storage.read_records(self.ids(batch), self.fields)

    # -- windows ----------------------------------------------------------------------------
    def read_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """``TemporalArrayStorage.read_window`` of this dataset's record ``record``."""
        return self.storage.read_window(  # type: ignore[no-any-return]
            self.record_id(record), start, frames, fields, **options
        )

    async def aread_window(
        self,
        record: int,
        start: int,
        frames: int,
        fields: Sequence[str] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """``TemporalArrayStorage.aread_window`` of this dataset's record ``record``."""
        return await self.storage.aread_window(  # type: ignore[no-any-return]
            self.record_id(record), start, frames, fields, **options
        )

    # -- readers (the loader's protocol) -------------------------------------------------------
    @property
    def is_local(self) -> bool:
        """Whether the storage is on local disk (a loader then reads synchronously)."""
        return bool(getattr(self.storage, "is_local", False))

    def sync_reader(self) -> TemporalRecordReader:
        return TemporalRecordReader(self)

    def async_reader(self) -> AsyncTemporalRecordReader:
        return AsyncTemporalRecordReader(self)


#: Records read together when iterating.
_ITERATION_RECORDS = 64


class _RecordCount:
    """``len(reader)``: the dataset's records, without opening through another reader."""

    dataset: TemporalRecords
    storage_reader: Any

    def __len__(self) -> int:
        """Records of the dataset (the reader's own count of the storage, if it holds all)."""
        records = self.dataset.records
        return len(self.storage_reader) if records is None else len(records)


class TemporalRecordReader(_RecordCount, DatasetReader):
    """``reader[i]``, ``reader[a:b]``, ``reader.read_many(indexes)``: whole records."""

    def __getitem__(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = self.read_many(indexes)
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[dict[str, Any]]:
        """Records at ``indexes`` (any order): their index entries in one round if any is
        not cached, then one round of coalesced ranges (adjacent records of a shard: one
        request per field group)."""
        dataset = self.dataset
        return self.storage_reader.read_records(  # type: ignore[no-any-return]
            dataset.ids(indexes, len(self)), dataset.fields
        )


class AsyncTemporalRecordReader(_RecordCount, AsyncDatasetReader):
    """``await reader[i]``, ``await reader.read_many(indexes)``: whole records."""

    async def _get(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = await self.read_many(indexes)
        return results if many else results[0]

    def __getitem__(self, key: int | slice) -> Any:
        return self._get(key)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[dict[str, Any]]:
        dataset = self.dataset
        return await self.storage_reader.read_records(  # type: ignore[no-any-return]
            dataset.ids(indexes, len(self)), dataset.fields, max_concurrency=max_concurrency
        )


def train_test_split(
    dataset: Any, splits: Sequence[float], seed: int = 42
) -> list[TemporalRecords]:
    """Disjoint random subsets of a temporal dataset's records, one per fraction.

    Parameters
    ----------
    dataset
        A ``TemporalArrayStorage`` or ``TemporalRecords`` (a split of a split works).
    splits
        Fractions of the records, each in ``(0, 1]``, summing to at most 1: split ``k``
        holds ``floor(splits[k] * len(dataset))`` records, and records left over belong to
        none (as in LitData).
    seed
        Equal seeds draw equal splits, in any process.

    Returns
    -------
    list of TemporalRecords
        Each keeps the temporal API with its own record numbers and ``frame_counts``;
        its records are in the parent's order. No record is in two splits.
    """
    parent = dataset if isinstance(dataset, TemporalRecords) else TemporalRecords(dataset)
    if isinstance(splits, (str, bytes)) or not isinstance(splits, Sequence) or not splits:
        raise ValueError(f"splits must be a non-empty list of fractions, got {splits!r}")
    fractions = []
    for value in splits:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"splits must be fractions in (0, 1], got {value!r}")
        if not 0 < value <= 1 or not math.isfinite(value):
            raise ValueError(f"splits must be fractions in (0, 1], got {value!r}")
        fractions.append(float(value))
    if sum(fractions) > 1 + 1e-9:
        raise ValueError(f"splits must sum to at most 1, got {sum(fractions)} for {splits!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    count = len(parent)
    sizes = [math.floor(fraction * count + 1e-9) for fraction in fractions]
    order = np.random.default_rng(int(seed)).permutation(count)
    out, low = [], 0
    for size in sizes:
        chosen = np.sort(order[low : low + size])
        out.append(parent.subset(chosen))
        low += size
    return out
