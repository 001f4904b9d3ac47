"""``StreamDataset``: fixed-length windows over the concatenation of a stream's shards.

Window ``i`` starts at element ``i * stride`` and holds ``sequence_length`` elements, or
one more with ``next_token=True`` (the input and its shifted target, as Megatron does).
Windows may span records and shards; the storage assembles them. With ``boundaries=True``
each window also says where the records it packs begin (``cu_seqlens``, ``position_ids``),
so training can keep attention inside each document (flash-attention's varlen kernels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from rangestream.arguments import positive_integer
from rangestream.dataset.indexing import positions
from rangestream.errors import OutOfRangeError
from rangestream.io.stats import IOStats


class StreamDataset:
    """Windows of a ``StreamStorage`` (or ``StreamWithMetaStorage``).

    Parameters
    ----------
    storage
        The stream storage to read.
    sequence_length
        Elements per window.
    stride
        Elements between window starts; defaults to ``sequence_length`` (no overlap).
    next_token
        Add one element to every window for next-token targets.
    boundaries
        Give every window its record boundaries: a window that is a mapping gains
        ``"cu_seqlens"`` (int32 offsets ``[0, ..., sequence_length]`` of the records it
        overlaps, cut at the window's ends, as flash-attention's varlen kernels take
        them) and, unless the data stores its own, ``"position_ids"`` (int64, each
        element's position in its record, restarting at every boundary); other windows
        come as ``(window, {"cu_seqlens": ..., "position_ids": ...})``. Both describe the
        first ``sequence_length`` elements, the model's input when ``next_token`` adds
        one. Costs no request per window: a shard's record ends are read whole, in the
        same round as the first window touching it, and kept
        (``record_ends_cache_bytes`` of the storage).
    """

    def __init__(
        self,
        storage: Any,
        sequence_length: int,
        *,
        stride: int | None = None,
        next_token: bool = False,
        boundaries: bool = False,
    ) -> None:
        sequence_length = positive_integer(sequence_length, "sequence_length")
        stride = positive_integer(sequence_length if stride is None else stride, "stride")
        if not hasattr(storage, "sync_reader") or getattr(storage, "kind", None) not in {
            "stream",
            "stream_with_meta",
        }:
            raise TypeError(f"StreamDataset needs a stream storage, got {type(storage).__name__}")
        self.storage = storage
        self.sequence_length = sequence_length
        self.stride = stride
        self.next_token = next_token
        self.boundaries = bool(boundaries)

    def __repr__(self) -> str:
        bounds = ", boundaries=True" if self.boundaries else ""
        return (
            f"StreamDataset({self.storage!r}, sequence_length={self.sequence_length}, "
            f"stride={self.stride}, next_token={self.next_token}{bounds})"
        )

    @property
    def is_local(self) -> bool:
        """Whether the storage is on local disk (the loader then reads synchronously)."""
        return bool(getattr(self.storage, "is_local", False))

    @property
    def window_length(self) -> int:
        return self.sequence_length + (1 if self.next_token else 0)

    @property
    def sample_span_bytes(self) -> int:
        """Storage bytes from one window's start to the next's (windows in order are
        adjacent or overlapping, so a loader can read a run of them with one request)."""
        return self.stride * np.dtype(self.storage.stream_dtype).itemsize

    def __len__(self) -> int:
        """Windows in the dataset (opens it in this process, once, if needed)."""
        return self.num_windows(self.storage.default_opening.get_sync().total_length)

    def __bool__(self) -> bool:  # a description: a truth test must not open it
        return True

    def num_windows(self, total_length: int) -> int:
        if total_length < self.window_length:
            return 0
        return (total_length - self.window_length) // self.stride + 1

    def sync_reader(self) -> StreamWindowReader:
        if self.boundaries:
            return BoundedWindowReader(self)
        return StreamWindowReader(self)

    def async_reader(self) -> AsyncStreamWindowReader:
        if self.boundaries:
            return AsyncBoundedWindowReader(self)
        return AsyncStreamWindowReader(self)


class _Windows:
    def __init__(self, dataset: StreamDataset, storage_reader: Any) -> None:
        self.dataset = dataset
        self._storage_reader = storage_reader
        self._stride = dataset.stride
        self._length = dataset.window_length
        self._count: int | None = None

    @property
    def storage_reader(self) -> Any:
        return self._storage_reader

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes issued so far."""
        return self._storage_reader.stats  # type: ignore[no-any-return]

    def __len__(self) -> int:
        count = self._count
        if count is None:
            count = self._count = self.dataset.num_windows(self._storage_reader.total_length)
        return count

    def _positions(self, key: Any) -> tuple[list[int], bool]:
        count = len(self)
        if count == 0 and not isinstance(key, slice):
            self._no_windows()
        return positions(key, count)

    def _no_windows(self) -> None:
        total = self._storage_reader.total_length
        raise OutOfRangeError(
            f"{self.dataset.storage.url} holds {total} elements, fewer than one window of "
            f"{self._length} (sequence_length={self.dataset.sequence_length}"
            f"{', next_token' if self.dataset.next_token else ''}): the dataset has no windows"
        )

    def _requests(self, indexes: Sequence[int]) -> list[tuple[int, int]]:
        stride, length = self._stride, self._length
        return [(i * stride, length) for i in indexes]


class StreamWindowReader(_Windows):
    """``reader[i]``: window ``i``; ``reader[a:b]``: a list of windows read together."""

    def __init__(self, dataset: StreamDataset) -> None:
        super().__init__(dataset, dataset.storage.sync_reader())
        self._read = self._storage_reader.read
        self._opened = self._storage_reader.opened_holder
        self._window: Any = None  # (opened version, its window reader)

    def __enter__(self) -> StreamWindowReader:
        self._storage_reader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._storage_reader.close()

    def __getitem__(self, key: int | slice) -> Any:
        if type(key) is int:  # the hot path: one window, straight to the opened version
            count = self._count
            if count is None:
                count = len(self)
            if key < 0:
                key += count
            if 0 <= key < count:
                reader = self._window
                if reader is None or reader[0] is not self._opened.value:
                    reader = self._window_reader()
                window = reader[1](key)
                if window is not None:
                    return window
                return self._read(key * self._stride, self._length)
        indexes, many = self._positions(key)
        results = self._storage_reader.read_many(self._requests(indexes))
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        """Windows at ``indexes`` (any order), fetched in one round of requests."""
        checked = [self._positions(int(i))[0][0] for i in indexes]
        return self._storage_reader.read_many(self._requests(checked))  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_window"] = None  # the opened version's reader is per process
        return state

    def _window_reader(self) -> tuple[Any, Any]:
        """The opened version's reader of single windows of this dataset's shape."""
        opened = self._storage_reader.opened
        self._window = (opened, opened.window_reader(self._length, self._stride))
        return self._window


class AsyncStreamWindowReader(_Windows):
    """``await reader[i]``; ``await reader.read_many(indexes)``."""

    def __init__(self, dataset: StreamDataset) -> None:
        super().__init__(dataset, dataset.storage.async_reader())

    async def __aenter__(self) -> AsyncStreamWindowReader:
        await self._storage_reader.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._storage_reader.aclose()

    async def _get(self, key: int | slice, max_concurrency: int | None) -> Any:
        indexes, many = self._positions(key)
        if not many:
            start, length = self._requests(indexes)[0]
            return await self._storage_reader.read(start, length, max_concurrency=max_concurrency)
        return await self._storage_reader.read_many(
            self._requests(indexes), max_concurrency=max_concurrency
        )

    def __getitem__(self, key: int | slice) -> Any:
        return self._get(key, None)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        checked = [self._positions(int(i))[0][0] for i in indexes]
        return await self._storage_reader.read_many(  # type: ignore[no-any-return]
            self._requests(checked), max_concurrency=max_concurrency
        )


def with_boundaries(window: Any, starts: np.ndarray, length: int) -> Any:
    """``window`` with the ``cu_seqlens`` and ``position_ids`` of its first ``length``
    elements, from the window-relative ``starts`` of the records it overlaps (increasing,
    the first one at or before 0)."""
    values = starts.tolist()
    inside = [start for start in values if 0 < start < length]
    edges = [0, *inside, length]
    positions = np.empty(length, dtype=np.int64)
    for begun, (low, high) in zip([values[0], *inside], pairwise(edges), strict=True):
        positions[low:high] = np.arange(low - begun, high - begun)
    bounds = {"cu_seqlens": np.asarray(edges, dtype=np.int32), "position_ids": positions}
    if isinstance(window, Mapping):
        added = {key: value for key, value in bounds.items() if key not in window}
        return {**window, **added}
    return window, bounds


class BoundedWindowReader(StreamWindowReader):
    """``reader[i]``: window ``i`` with its record boundaries (``boundaries=True``).

    A local window inside one mapped block whose shards' record ends are cached is copied
    as without boundaries; any other takes the read program.
    """

    def __getitem__(self, key: int | slice) -> Any:
        if type(key) is int:
            count = len(self)
            index = key + count if key < 0 else key
            if 0 <= index < count:
                reader = self._window
                if reader is None or reader[0] is not self._opened.value:
                    reader = self._window_reader()
                starts = reader[0].cached_starts(index * self._stride, self._length)
                if starts is not None:
                    window = reader[1](index)
                    if window is not None:
                        return with_boundaries(window, starts, self.dataset.sequence_length)
        indexes, many = self._positions(key)
        results = self._bounded(indexes)
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        return self._bounded([self._positions(int(i))[0][0] for i in indexes])

    def _bounded(self, indexes: list[int]) -> list[Any]:
        read = self._storage_reader.read_many_with_starts(self._requests(indexes))
        length = self.dataset.sequence_length
        return [with_boundaries(window, starts, length) for window, starts in read]


class AsyncBoundedWindowReader(AsyncStreamWindowReader):
    """``await reader[i]``: window ``i`` with its record boundaries."""

    async def _get(self, key: int | slice, max_concurrency: int | None) -> Any:
        indexes, many = self._positions(key)
        results = await self._bounded(indexes, max_concurrency)
        return results if many else results[0]

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        checked = [self._positions(int(i))[0][0] for i in indexes]
        return await self._bounded(checked, max_concurrency)

    async def _bounded(self, indexes: list[int], max_concurrency: int | None) -> list[Any]:
        read = await self._storage_reader.read_many_with_starts(
            self._requests(indexes), max_concurrency=max_concurrency
        )
        length = self.dataset.sequence_length
        return [with_boundaries(window, starts, length) for window, starts in read]
