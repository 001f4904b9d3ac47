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

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError
from rangestream.loader.iterable import DEFAULT_PREFETCH, BatchIterableDataset, Collate
from rangestream.loader.permutation import keyed_hash

__all__ = ["TemporalBatchDataset", "TemporalStorage", "WindowSampler"]

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
        if isinstance(frames, bool) or int(frames) != frames or frames < 1:
            raise LoaderConfigError(f"frames must be a positive integer, got {frames!r}")
        if sampling not in ("record", "window"):
            raise LoaderConfigError(f"sampling must be 'record' or 'window', got {sampling!r}")
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


class TemporalBatchDataset(BatchIterableDataset):
    """Batches of random frame windows from temporal records, resumable and sharded.

    Parameters
    ----------
    storage : TemporalStorage
        Picklable storage with ``frame_counts`` and ``aread_window``; its first use in a
        worker must happen in that worker (the loader only calls it there).
    frames : int
        Window length in frames.
    fields : sequence of str, optional
        Fields to read; all when omitted.
    batch_size : int, default 8
        Windows per batch on each rank.
    seed : int, default 0
        Sampling seed; must be equal on every rank.
    rank, world_size : int or None
        This rank and the number of ranks; ``None`` reads ``torch.distributed``.
    samples_per_epoch : int, optional
        Windows drawn per epoch (across all ranks); defaults to the number of eligible
        records.
    sampling : {"record", "window"}, default "record"
        See :class:`WindowSampler`.
    drop_last : bool, default True
        End-of-epoch policy, as for :class:`IndexedBatchDataset`.
    prefetch : int, default :data:`DEFAULT_PREFETCH`
        Window reads in flight per worker.
    collate_fn : callable, optional
        Defaults to :func:`rangestream.loader.stack_collate`.
    """

    def __init__(
        self,
        storage: TemporalStorage,
        frames: int,
        *,
        fields: Sequence[str] | None = None,
        batch_size: int = 8,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        samples_per_epoch: int | None = None,
        sampling: Sampling = "record",
        drop_last: bool = True,
        prefetch: int = DEFAULT_PREFETCH,
        collate_fn: Collate | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=prefetch,
            collate_fn=collate_fn,
        )
        if isinstance(frames, bool) or int(frames) != frames or frames < 1:
            raise LoaderConfigError(f"frames must be a positive integer, got {frames!r}")
        if sampling not in ("record", "window"):
            raise LoaderConfigError(f"sampling must be 'record' or 'window', got {sampling!r}")
        if samples_per_epoch is not None and (
            isinstance(samples_per_epoch, bool)
            or int(samples_per_epoch) != samples_per_epoch
            or samples_per_epoch < 1
        ):
            raise LoaderConfigError(
                f"samples_per_epoch must be a positive integer, got {samples_per_epoch!r}"
            )
        self.storage = storage
        self.frames = int(frames)
        self.fields = None if fields is None else [str(field) for field in fields]
        self.samples_per_epoch = None if samples_per_epoch is None else int(samples_per_epoch)
        self.sampling: Sampling = sampling
        self._sampler: WindowSampler | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The sampler holds per-record arrays; workers rebuild it from their own storage.
        state = self.__dict__.copy()
        state["_sampler"] = None
        return state

    def state_identity(self) -> dict[str, Any]:
        return {
            "kind": "temporal",
            "frames": self.frames,
            "sampling": self.sampling,
            "samples_per_epoch": self.samples_per_epoch,
        }

    def _window_sampler(self, storage: TemporalStorage) -> WindowSampler:
        if self._sampler is None:
            self._sampler = WindowSampler(storage.frame_counts, self.frames, sampling=self.sampling)
        return self._sampler

    def _open(self) -> AbstractAsyncContextManager[TemporalStorage]:
        return contextlib.nullcontext(self.storage)

    def _num_samples(self, source: TemporalStorage) -> int:
        sampler = self._window_sampler(source)
        return (
            self.samples_per_epoch if self.samples_per_epoch is not None else sampler.num_eligible
        )

    def _count_samples(self) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        return self._window_sampler(self.storage).num_eligible

    def _requests(
        self, source: TemporalStorage, indices: np.ndarray, epoch: int
    ) -> Sequence[tuple[int, int]]:
        records, starts = self._window_sampler(source).draw(indices, seed=self.seed, epoch=epoch)
        return list(zip(records.tolist(), starts.tolist(), strict=True))

    async def _read(self, source: TemporalStorage, request: tuple[int, int]) -> Any:
        record, start = request
        if self.fields is None:
            return await source.aread_window(record, start, self.frames)
        return await source.aread_window(record, start, self.frames, self.fields)

    def _storage(self) -> Any:
        return self.storage

    def _sync_open(self) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
        if getattr(self.storage, "is_local", False) and hasattr(self.storage, "read_window"):
            return lambda: contextlib.nullcontext(self.storage)
        return None

    def _read_many_sync(self, source: Any, requests: list[tuple[int, int]]) -> list[Any]:
        if self.fields is None:
            return [source.read_window(record, start, self.frames) for record, start in requests]
        return [
            source.read_window(record, start, self.frames, self.fields)
            for record, start in requests
        ]
