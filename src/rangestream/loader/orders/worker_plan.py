"""What a DataLoader worker reads, grouped how, and where each window goes.

Both epoch orders (the per-window shuffle and the block shuffle) answer through these
objects: a :class:`WorkerPlan` of :class:`ReadGroup` s, each a list of :class:`RunRead` s
(one ``read_many`` call each) and the (step, slot) of every window read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rangestream.errors import StateError
from rangestream.loader.orders.geometry import check_count
from rangestream.loader.orders.permutation import Permutation
from rangestream.loader.orders.phases import EpochPosition, check_worker
from rangestream.loader.orders.sequence_plan import EpochPlan

__all__ = ["SPAN_MIN_FILL", "ReadGroup", "RunRead", "WindowShuffle", "WorkerPlan", "check_worker"]

SPAN_MIN_FILL = 1 / 16
"""Smallest share of a partial run's span that is needed for the span to be read whole
(:attr:`RunRead.request_windows`): at most 16x the needed bytes of that run."""


@dataclass(frozen=True)
class RunRead:
    """Windows read together from one run (one ``read_many`` call).

    ``start`` and ``stop`` bound the run (``[start, stop)`` window indices); ``windows``
    are the ones needed, sorted and distinct: all of the run (:attr:`whole`) except where a
    region boundary cuts a buffer. Read :attr:`request_windows` with one ``read_many``.
    ``first_use`` is the index in the
    group's ``windows`` of the first window that needs this read: a group's reads are
    listed by it, so a worker that issues them in order can hand out each step as soon as
    the reads up to that step's windows have arrived.
    """

    start: int
    stop: int
    windows: np.ndarray
    first_use: int = 0

    @property
    def whole(self) -> bool:
        """Whether every window of the run is needed."""
        return len(self.windows) == self.stop - self.start

    @property
    def span(self) -> range:
        """From the first needed window to the last, gaps included: one range request per
        block it touches, at most one run's bytes."""
        return range(int(self.windows[0]), int(self.windows[-1]) + 1)

    @property
    def request_windows(self) -> range | np.ndarray:
        """What to read: the :attr:`span` unless the needed windows fill less than
        :data:`SPAN_MIN_FILL` of it, then the needed windows alone.

        A partial run's needed windows are a random subset of it: read apart, every gap
        wider than the range reader's coalescing gap costs a request, and a range request
        costs the server about as much as a few MiB of transfer (``docs/design.md``). A
        sparse subset (a reader whose region is a sliver of a buffer) is read window by
        window instead, as the per-window shuffle reads, so bytes stay bounded.
        """
        span = self.span
        if len(self.windows) >= len(span) * SPAN_MIN_FILL:
            return span
        return self.windows


@dataclass(frozen=True)
class ReadGroup:
    """Reads a worker makes together, and where their windows go.

    ``windows[k]`` fills slot ``slots[k]`` of this rank's step ``steps[k]``; ``windows`` is
    in emission order (steps ascending). ``reads`` cover exactly the distinct windows of
    ``windows``. A batch may take windows from two consecutive groups. ``buffer`` is the
    block shuffle's buffer (``None`` for the per-window orders).
    """

    reads: tuple[RunRead, ...]
    windows: np.ndarray
    steps: np.ndarray
    slots: np.ndarray
    buffer: int | None = None


class WorkerPlan:
    """The remaining reads and steps of one DataLoader worker of one rank.

    Made by :meth:`BlockShuffle.worker_plan` or :meth:`WindowShuffle.worker_plan`;
    :meth:`groups` is lazy, so memory stays at one group whatever the epoch's size.
    """

    def __init__(
        self,
        *,
        steps: np.ndarray,
        batch_size: int,
        groups: Iterator[ReadGroup],
        num_steps: int,
    ) -> None:
        self.steps = steps
        self.batch_size = batch_size
        self.num_steps = num_steps
        self._groups = groups

    def groups(self) -> Iterator[ReadGroup]:
        """Read groups in the order the worker needs them (single use)."""
        return self._groups

    def batches(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(step, windows)`` for each remaining step of this worker, in order."""
        size = self.batch_size
        pending: dict[int, np.ndarray] = {}
        filled: dict[int, int] = {}
        order = iter(self.steps.tolist())
        next_step = next(order, None)
        for group in self._groups:
            for step, slot, window in zip(
                group.steps.tolist(), group.slots.tolist(), group.windows.tolist(), strict=True
            ):
                batch = pending.setdefault(step, np.empty(size, dtype=np.int64))
                batch[slot] = window
                filled[step] = filled.get(step, 0) + 1
            while next_step is not None and filled.get(next_step) == size:
                del filled[next_step]
                yield next_step, pending.pop(next_step)
                next_step = next(order, None)
        if next_step is not None or pending:
            raise StateError(f"plan ended before step {next_step} was complete")


# -- the per-window orders: today's shuffle and storage order ---------------------------------


@dataclass(frozen=True)
class WindowShuffle:
    """Today's orders through the plan interface: a global per-window shuffle, or none.

    The epoch is one world-independent sequence (see :mod:`rangestream.loader.orders.sequence_plan`)
    and the position is ``consumed_samples`` alone, so phases change nothing but that count.
    Each shuffled window is its own read (one range request each, unless two windows of a
    step happen to be neighbours); in storage order a worker's run of steps is one read.

    Parameters
    ----------
    num_windows : int
        Windows in the dataset.
    seed : int
        Shuffle seed.
    shuffle : bool, default True
        ``False`` keeps storage order.
    """

    num_windows: int
    seed: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        check_count("WindowShuffle", "num_windows", self.num_windows, 0)

    def worker_plan(
        self,
        epoch: int,
        position: EpochPosition,
        *,
        rank: int,
        worker_id: int,
        stretch_steps: int = 1,
    ) -> WorkerPlan:
        """The remaining steps of ``worker_id`` of ``rank`` under ``position``'s phase.

        ``stretch_steps`` consecutive steps are built by one worker in turn (see
        :meth:`EpochPlan.worker_stretches`); with more than one, the consumer re-sorts batches.
        """
        phase = position.phase
        check_worker(rank, phase.world_size, worker_id, phase.num_workers)
        plan = EpochPlan(
            num_samples=self.num_windows,
            batch_size=phase.batch_size,
            world_size=phase.world_size,
            rank=rank,
            drop_last=phase.drop_last,
            consumed_samples=position.consumed_samples,
        )
        runs = list(plan.worker_stretches(worker_id, phase.num_workers, stretch_steps))
        steps = (
            np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in runs])
            if runs
            else np.zeros(0, dtype=np.int64)
        )
        permutation = (
            Permutation(self.num_windows, self.seed, epoch)
            if self.shuffle and self.num_windows
            else None
        )

        def groups() -> Iterator[ReadGroup]:
            size = phase.batch_size
            for run in runs:
                stretch_steps_array = np.arange(run.start, run.stop, dtype=np.int64)
                indices = plan.sequence_indices(stretch_steps_array).reshape(-1)
                windows = indices if permutation is None else permutation(indices)
                distinct, first_use = np.unique(windows, return_index=True)
                if permutation is None:  # contiguous pieces of storage order
                    cuts = np.flatnonzero(np.diff(distinct) != 1) + 1
                    reads = [
                        RunRead(int(p[0]), int(p[-1]) + 1, p, int(first.min()))
                        for p, first in zip(
                            np.split(distinct, cuts), np.split(first_use, cuts), strict=True
                        )
                    ]
                else:  # every window its own read
                    reads = [
                        RunRead(w, w + 1, np.array([w]), first)
                        for w, first in zip(distinct.tolist(), first_use.tolist(), strict=True)
                    ]
                yield ReadGroup(
                    reads=tuple(sorted(reads, key=lambda read: read.first_use)),
                    windows=windows,
                    steps=np.repeat(stretch_steps_array, size),
                    slots=np.tile(np.arange(size, dtype=np.int64), len(run)),
                )

        return WorkerPlan(
            steps=steps, batch_size=phase.batch_size, groups=groups(), num_steps=plan.num_steps
        )
