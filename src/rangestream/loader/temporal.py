"""Random frame windows of temporal records, resumable by a counter.

Temporal records (``TemporalArrayStorage``) have different frame counts; training reads
fixed-length windows of ``frames`` frames from records that have at least that many. The
reference adapter draws them with ``np.random`` inside ``__getitem__``, which makes the
sequence depend on worker seeding and impossible to resume exactly. Here sample ``i`` of
epoch ``e`` is a pure function of ``(seed, e, i)`` (:func:`keyed_hash`), so the epoch is a
sequence like any other: it is split across ranks and workers by :class:`EpochPlan`, and
resuming means nothing more than restarting the counter at ``consumed_samples``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from rangestream.arguments import positive_integer
from rangestream.errors import LoaderConfigError
from rangestream.loader.permutation import keyed_hash

__all__ = ["TemporalStorage", "TemporalWindowSource", "WindowSampler"]

Sampling = Literal["record", "window"]
_RECORD_STREAM = 1
_START_STREAM = 2


class TemporalStorage(Protocol):
    """What the loader needs from a temporal storage (``TemporalArrayStorage``)."""

    @property
    def frame_counts(self) -> np.ndarray: ...

    async def aread_window(
        self, record: int, start: int, frames: int, fields: Sequence[str] | None = None
    ) -> Any: ...


def _check_sampling(sampling: object) -> None:
    if sampling not in ("record", "window"):
        raise LoaderConfigError(f"sampling must be 'record' or 'window', got {sampling!r}")


class WindowSampler:
    """Draw ``(record, start)`` windows of ``frames`` frames from counters.

    Parameters
    ----------
    frame_counts : array_like of int
        Frames of every record.
    frames : int
        Window length in frames; records with fewer frames are never drawn.
    sampling : {"record", "window"}, default "record"
        ``"record"``: every eligible record is equally likely, then a uniform start within
        it (the reference adapter's policy). ``"window"``: every valid ``(record, start)``
        pair is equally likely, so long records are drawn in proportion to their windows.
    """

    def __init__(
        self, frame_counts: npt.ArrayLike, frames: int, *, sampling: Sampling = "record"
    ) -> None:
        frames = positive_integer(frames, "frames", error=LoaderConfigError)
        _check_sampling(sampling)
        counts = np.asarray(frame_counts, dtype=np.int64).reshape(-1)
        self.frames = int(frames)
        self.sampling: Sampling = sampling
        self.eligible = np.flatnonzero(counts >= self.frames)
        if self.eligible.size == 0:
            longest = int(counts.max()) if counts.size else 0
            raise LoaderConfigError(
                f"no record has {self.frames} frames (records: {counts.size}, longest: "
                f"{longest} frames); choose a shorter window"
            )
        self._spans = (counts[self.eligible] - self.frames + 1).astype(np.uint64)
        self._span_ends = np.cumsum(self._spans, dtype=np.uint64)

    @property
    def num_eligible(self) -> int:
        """Records with at least ``frames`` frames."""
        return int(self.eligible.size)

    @property
    def num_windows(self) -> int:
        """Distinct ``(record, start)`` windows."""
        return int(self._span_ends[-1])

    def draw(
        self, counters: npt.ArrayLike, *, seed: int, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Windows for sample counters of one epoch.

        Parameters
        ----------
        counters : array_like of int
            Sample numbers within the epoch (non-negative).
        seed, epoch : int
            Select the random stream; equal inputs give equal windows in any process.

        Returns
        -------
        records, starts : numpy.ndarray
            ``int64`` arrays shaped like ``counters``.
        """
        first = keyed_hash(counters, seed, epoch, _RECORD_STREAM)
        if self.sampling == "record":
            chosen = (first % np.uint64(self.eligible.size)).astype(np.int64)
            second = keyed_hash(counters, seed, epoch, _START_STREAM)
            starts = second % self._spans[chosen]
        else:
            target = first % self._span_ends[-1]
            chosen = np.searchsorted(self._span_ends, target, side="right").astype(np.int64)
            starts = target - (self._span_ends[chosen] - self._spans[chosen])
        return self.eligible[chosen], starts.astype(np.int64)


class TemporalWindowSource:
    """Random frame windows of temporal records, as a :class:`SampleSource`.

    Parameters
    ----------
    storage : TemporalStorage
        Picklable storage with ``frame_counts`` and ``aread_window``; its first use in a
        worker happens in that worker (the loader only calls it there).
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
    """

    def __init__(
        self,
        storage: TemporalStorage,
        frames: int,
        *,
        fields: Sequence[str] | None = None,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        sampling: Sampling = "record",
    ) -> None:
        self.storage = storage
        self.frames = positive_integer(frames, "frames", error=LoaderConfigError)
        _check_sampling(sampling)
        self.fields = None if fields is None else [str(field) for field in fields]
        self.seed = int(seed)
        self.samples_per_epoch = (
            None
            if samples_per_epoch is None
            else positive_integer(samples_per_epoch, "samples_per_epoch", error=LoaderConfigError)
        )
        self.sampling: Sampling = sampling
        self._sampler: WindowSampler | None = None

    def __repr__(self) -> str:
        return f"TemporalWindowSource({self.storage!r}, frames={self.frames}, seed={self.seed})"

    def __getstate__(self) -> dict[str, Any]:
        # The sampler holds per-record arrays; workers rebuild it from their own storage.
        state = self.__dict__.copy()
        state["_sampler"] = None
        return state

    def identity(self) -> dict[str, Any]:
        return {
            "kind": "temporal",
            "seed": self.seed,
            "frames": self.frames,
            "sampling": self.sampling,
            "samples_per_epoch": self.samples_per_epoch,
        }

    def _window_sampler(self, storage: TemporalStorage) -> WindowSampler:
        if self._sampler is None:
            self._sampler = WindowSampler(storage.frame_counts, self.frames, sampling=self.sampling)
        return self._sampler

    def count(self) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        return self._window_sampler(self.storage).num_eligible

    def num_samples(self, reader: TemporalStorage) -> int:
        sampler = self._window_sampler(reader)
        return (
            self.samples_per_epoch if self.samples_per_epoch is not None else sampler.num_eligible
        )

    def requests(
        self, reader: TemporalStorage, indices: np.ndarray, epoch: int
    ) -> Sequence[tuple[int, int]]:
        records, starts = self._window_sampler(reader).draw(indices, seed=self.seed, epoch=epoch)
        return list(zip(records.tolist(), starts.tolist(), strict=True))

    def open_sync(self) -> AbstractContextManager[Any] | None:
        if getattr(self.storage, "is_local", False) and hasattr(self.storage, "read_window"):
            return contextlib.nullcontext(self.storage)
        return None

    def open_async(self) -> AbstractAsyncContextManager[TemporalStorage]:
        return contextlib.nullcontext(self.storage)

    def read_many_sync(self, reader: Any, requests: list[tuple[int, int]]) -> list[Any]:
        if self.fields is None:
            return [reader.read_window(record, start, self.frames) for record, start in requests]
        return [
            reader.read_window(record, start, self.frames, self.fields)
            for record, start in requests
        ]

    async def read_many(
        self, reader: TemporalStorage, requests: list[tuple[int, int]]
    ) -> list[Any]:
        if self.fields is None:
            reads = [reader.aread_window(record, start, self.frames) for record, start in requests]
        else:
            reads = [
                reader.aread_window(record, start, self.frames, self.fields)
                for record, start in requests
            ]
        return list(await asyncio.gather(*reads))

    def sample_span_bytes(self) -> int | None:
        return None

    def reads_per_batch(self) -> int:
        return 1

    def preload(self) -> None:
        preload = getattr(self.storage, "preload_readers", None)
        if callable(preload):
            preload()
