"""``TemporalWindowSource``: random frame windows of temporal records as a sample source.

The loader asks a source for the samples of an epoch split across ranks and workers
(``EpochPlan``) and for reads of a batch of them. A temporal sample is a counter whose
window is drawn where the batch is read (``loader.window_sampler``: a pure function of
``(seed, epoch, counter)``, so resuming restarts the counter), from the storage's record
index read by range when the storage has one, else from frame counts held in memory; the
windows are then read through the storage's sync reader (local data) or async reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

import numpy as np

from rangestream.arguments import positive_integer
from rangestream.errors import LoaderConfigError
from rangestream.loader.orders.window_sampler import (
    CountsIndex,
    Draw,
    Sampling,
    WindowSampler,
    answer,
    answer_async,
    check_sampling,
)
from rangestream.loader.sources.protocol import SampleSource, storage_commit

__all__ = ["TemporalStorage", "TemporalWindowSource"]


class TemporalStorage(Protocol):
    """What the loader needs from a temporal storage it cannot read by index.

    ``TemporalArrayStorage`` (and ``TemporalRecords`` of all its records) are read through
    their readers and record index; any other object with ``frame_counts`` (an array) and
    ``read_window`` / ``aread_window`` works too, drawing from its counts in memory.
    """

    @property
    def frame_counts(self) -> Any: ...

    async def aread_window(
        self, record: int, start: int, frames: int, fields: Sequence[str] | None = None
    ) -> Any: ...


class _Windows:
    """How one process draws and reads windows: the index it asks, the sampler, the reads."""

    def __init__(self, index: Any, sampler: WindowSampler, reader: Any, read: Callable[..., Any]):
        self.index = index
        self.sampler = sampler
        #: Proposals per round of a sync draw: several while the index is in memory (rounds
        #: of Python work cost more than entries looked up), one when each proposal may
        #: read an index chunk (a rejected candidate's chunk costs more than a round).
        self.candidates = None if getattr(index, "index_in_memory", True) else 1
        #: The storage's reader: the loader counts its requests (``loader.transport``).
        self.storage_reader = reader
        self.read = read


def _reads_by_index(storage: Any) -> Any:
    """The ``TemporalArrayStorage`` whose readers answer index questions by range, if any."""
    if getattr(storage, "kind", None) == "temporal" and hasattr(storage, "count_windows"):
        return storage
    inner = getattr(storage, "storage", None)  # TemporalRecords of all records
    if getattr(storage, "records", True) is None and hasattr(inner, "count_windows"):
        return inner
    return None


class TemporalWindowSource(SampleSource):
    """Random frame windows of temporal records, as a :class:`SampleSource`.

    Parameters
    ----------
    storage : TemporalArrayStorage or TemporalRecords or TemporalStorage
        Picklable storage; a ``TemporalArrayStorage`` (or ``TemporalRecords`` of all its
        records) is drawn from through its record index read by range, anything else
        (a split's ``TemporalRecords``) from its ``frame_counts`` in memory. Its first
        use in a worker happens in that worker.
    frames : int
        Window length in frames.
    fields : sequence of str, optional
        Fields to read; all when omitted.
    seed : int, default 0
        Sampling seed; equal on every rank.
    samples_per_epoch : int, optional
        Windows drawn per epoch (across all ranks); defaults to the number of eligible
        records.
    sampling : {"record", "window"}, default "record"
        See :class:`WindowSampler`.

    Notes
    -----
    A request is a sample's ``(epoch, counter)``; its window is drawn when its batch is
    read (on the I/O loop over object storage, where the index is read asynchronously).
    A worker keeps its reader and sampler across epochs (persistent workers re-open and
    re-read nothing).
    """

    def __init__(
        self,
        storage: Any,
        frames: int,
        *,
        fields: Sequence[str] | None = None,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        sampling: Sampling = "record",
    ) -> None:
        self.storage = storage
        self.frames = positive_integer(frames, "frames", error=LoaderConfigError)
        check_sampling(sampling)
        self.fields = None if fields is None else [str(field) for field in fields]
        self.seed = int(seed)
        self.samples_per_epoch = (
            None
            if samples_per_epoch is None
            else positive_integer(samples_per_epoch, "samples_per_epoch", error=LoaderConfigError)
        )
        self.sampling: Sampling = sampling
        self._counted: int | None = None

    def __repr__(self) -> str:
        return f"TemporalWindowSource({self.storage!r}, frames={self.frames}, seed={self.seed})"

    def identity(self) -> dict[str, Any]:
        return {
            "kind": "temporal",
            "seed": self.seed,
            "frames": self.frames,
            "sampling": self.sampling,
            "samples_per_epoch": self.samples_per_epoch,
            # draws by rejection from the record index: orders saved before differ
            "draws": "index",
        }

    def describe_data(self) -> dict[str, Any]:
        commit = storage_commit(self.storage)
        described: dict[str, Any] = {"num_samples": self.count()}
        return described if commit is None else {**described, "commit": commit}

    def _sampler(self, histogram: tuple[np.ndarray, np.ndarray]) -> WindowSampler:
        return WindowSampler(histogram, self.frames, sampling=self.sampling)

    def count(self) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        if self._counted is None:
            indexed = _reads_by_index(self.storage)
            if indexed is not None:
                histogram = indexed.frame_histogram()
            else:
                histogram = CountsIndex(self.storage.frame_counts).frame_histogram()
            self._counted = self._sampler(histogram).num_eligible
        return self._counted

    def num_samples(self, reader: _Windows) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        return reader.sampler.num_eligible

    def requests(self, reader: Any, indices: np.ndarray, epoch: int) -> Sequence[tuple[int, int]]:
        return [(epoch, counter) for counter in np.asarray(indices, dtype=np.int64).tolist()]

    # -- readers ------------------------------------------------------------------------------
    def open_sync(self) -> AbstractContextManager[_Windows] | None:
        if not getattr(self.storage, "is_local", False) or not hasattr(self.storage, "read_window"):
            return None
        return self._open_sync()

    @contextlib.contextmanager
    def _open_sync(self) -> Iterator[_Windows]:
        indexed = _reads_by_index(self.storage)
        if indexed is None:
            index = CountsIndex(self.storage.frame_counts)
            yield _Windows(index, self._sampler(index.frame_histogram()), self.storage,
                           self.storage.read_window)  # fmt: skip
            return
        with indexed.sync_reader() as reader:
            sampler = self._sampler(reader.frame_histogram())
            yield _Windows(reader, sampler, reader, reader.read_window)

    def open_async(self) -> AbstractAsyncContextManager[_Windows]:
        return self._open_async()

    @contextlib.asynccontextmanager
    async def _open_async(self) -> AsyncIterator[_Windows]:
        indexed = _reads_by_index(self.storage)
        if indexed is None:
            # a split's counts may be read through its storage's sync reader: off the loop
            storage = self.storage
            counts = await asyncio.to_thread(lambda: np.asarray(storage.frame_counts))
            index = CountsIndex(counts)
            yield _Windows(index, self._sampler(index.frame_histogram()), self.storage,
                           self.storage.aread_window)  # fmt: skip
            return
        async with indexed.async_reader() as reader:
            sampler = self._sampler(await reader.frame_histogram())
            yield _Windows(reader, sampler, reader, reader.read_window)

    # -- reads --------------------------------------------------------------------------------
    def _draws(
        self, reader: _Windows, requests: list[tuple[int, int]], candidates: int | None = None
    ) -> list[tuple[Draw, Any]]:
        """One draw per epoch among ``requests`` (a batch is one epoch's, bar a wrap)."""
        epochs = np.asarray([epoch for epoch, _ in requests], dtype=np.int64)
        counters = np.asarray([counter for _, counter in requests], dtype=np.int64)
        out = []
        for epoch in np.unique(epochs).tolist():
            places = np.flatnonzero(epochs == epoch)
            draw = reader.sampler.draws(
                counters[places], seed=self.seed, epoch=epoch, candidates=candidates
            )
            out.append((draw, places))
        return out

    def _windows(
        self, requests: list[tuple[int, int]], drawn: list[tuple[Any, Any]]
    ) -> list[tuple[int, int]]:
        windows: list[tuple[int, int]] = [(0, 0)] * len(requests)
        for (records, starts), (_draw, places) in drawn:
            for at, record, start in zip(places.tolist(), records.tolist(), starts.tolist(),
                                         strict=True):  # fmt: skip
                windows[at] = (record, start)
        return windows

    def read_many_sync(self, reader: _Windows, requests: list[tuple[int, int]]) -> list[Any]:
        draws = self._draws(reader, requests, reader.candidates)
        drawn = [(answer(draw, reader.index), (draw, places)) for draw, places in draws]
        windows = self._windows(requests, drawn)
        read, frames = reader.read, self.frames
        if self.fields is None:
            return [read(record, start, frames) for record, start in windows]
        return [read(record, start, frames, self.fields) for record, start in windows]

    async def read_many(self, reader: _Windows, requests: list[tuple[int, int]]) -> list[Any]:
        # one proposal per round: index chunks are billed requests here, rounds overlap
        # with the other batches in flight
        draws = self._draws(reader, requests, candidates=1)
        drawn = [(await answer_async(draw, reader.index), (draw, places)) for draw, places in draws]
        windows = self._windows(requests, drawn)
        read, frames = reader.read, self.frames
        if self.fields is None:
            reads = [read(record, start, frames) for record, start in windows]
        else:
            reads = [read(record, start, frames, self.fields) for record, start in windows]
        return list(await asyncio.gather(*reads))

    def sample_span_bytes(self) -> int | None:
        return None

    def reads_per_batch(self) -> int:
        return 1

    def preload(self) -> None:
        preload = getattr(self.storage, "preload_readers", None)
        if callable(preload):
            preload()
