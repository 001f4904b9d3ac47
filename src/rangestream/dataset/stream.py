"""``StreamDataset``: fixed-length windows over the concatenation of a stream's shards.

Window ``i`` starts at element ``i * stride`` and holds ``sequence_length`` elements, or
one more with ``next_token=True`` (the input and its shifted target, as Megatron does).
Windows may span records and shards; the storage assembles them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rangestream.dataset.indexing import positions
from rangestream.io.range_reader import IOStats


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
    """

    def __init__(
        self,
        storage: Any,
        sequence_length: int,
        *,
        stride: int | None = None,
        next_token: bool = False,
    ) -> None:
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, int):
            raise TypeError(f"sequence_length must be an int, got {sequence_length!r}")
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
        stride = sequence_length if stride is None else stride
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be a positive int, got {stride!r}")
        if not hasattr(storage, "sync_reader") or getattr(storage, "kind", None) not in {
            "stream",
            "stream_with_meta",
        }:
            raise TypeError(f"StreamDataset needs a stream storage, got {type(storage).__name__}")
        self.storage = storage
        self.sequence_length = sequence_length
        self.stride = stride
        self.next_token = next_token

    def __repr__(self) -> str:
        return (
            f"StreamDataset({self.storage!r}, sequence_length={self.sequence_length}, "
            f"stride={self.stride}, next_token={self.next_token})"
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
        return self.stride * np.dtype(self.storage.storage_format.stream_dtype).itemsize

    def num_windows(self, total_length: int) -> int:
        if total_length < self.window_length:
            return 0
        return (total_length - self.window_length) // self.stride + 1

    def sync_reader(self) -> StreamWindowReader:
        return StreamWindowReader(self)

    def async_reader(self) -> AsyncStreamWindowReader:
        return AsyncStreamWindowReader(self)


class _Windows:
    def __init__(self, dataset: StreamDataset, storage_reader: Any) -> None:
        self.dataset = dataset
        self._storage_reader = storage_reader

    @property
    def storage_reader(self) -> Any:
        return self._storage_reader

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes issued so far."""
        return self._storage_reader.stats

    def __len__(self) -> int:
        return self.dataset.num_windows(self._storage_reader.total_length)

    def _requests(self, indexes: Sequence[int]) -> list[tuple[int, int]]:
        length = self.dataset.window_length
        return [(i * self.dataset.stride, length) for i in indexes]


class StreamWindowReader(_Windows):
    """``reader[i]``: window ``i``; ``reader[a:b]``: a list of windows read together."""

    def __init__(self, dataset: StreamDataset) -> None:
        super().__init__(dataset, dataset.storage.sync_reader())

    def __enter__(self) -> StreamWindowReader:
        self._storage_reader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._storage_reader.close()

    def __getitem__(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = self._storage_reader.read_many(self._requests(indexes))
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        """Windows at ``indexes`` (any order), fetched in one round of requests."""
        checked = [positions(int(i), len(self))[0][0] for i in indexes]
        return self._storage_reader.read_many(self._requests(checked))


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
        indexes, many = positions(key, len(self))
        results = await self._storage_reader.read_many(
            self._requests(indexes), max_concurrency=max_concurrency
        )
        return results if many else results[0]

    def __getitem__(self, key: int | slice) -> Any:
        return self._get(key, None)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        checked = [positions(int(i), len(self))[0][0] for i in indexes]
        return await self._storage_reader.read_many(
            self._requests(checked), max_concurrency=max_concurrency
        )
