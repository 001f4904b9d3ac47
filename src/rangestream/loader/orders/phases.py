"""The phases of an epoch: settings of ranks, batch size and workers, and steps taken.

The block shuffle cuts what remains of an epoch by the setting it is played with; a resume
with another setting starts a new phase over what remains. :class:`EpochPosition` lists
the phases, five integers each, so it is saved as plain data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.orders.geometry import check_count

__all__ = [
    "EpochPosition",
    "Phase",
    "PhaseLayout",
    "check_worker",
    "first_phase_cuts",
    "phase_layout",
    "reader_region",
]


@dataclass(frozen=True)
class Phase:
    """Steps taken in an epoch with one setting of ranks, batch size and workers.

    Parameters
    ----------
    world_size, batch_size, num_workers : int
        The setting (``num_workers`` counts DataLoader workers per rank; 0 means 1).
    drop_last : bool
        End-of-epoch policy of this phase.
    steps : int, default 0
        Steps every rank took in this phase.
    """

    world_size: int
    batch_size: int
    num_workers: int
    drop_last: bool
    steps: int = 0

    def __post_init__(self) -> None:
        check_count("Phase", "world_size", self.world_size, 1)
        check_count("Phase", "batch_size", self.batch_size, 1)
        check_count("Phase", "num_workers", self.num_workers, 0)
        check_count("Phase", "steps", self.steps, 0)
        object.__setattr__(self, "num_workers", max(1, int(self.num_workers)))
        object.__setattr__(self, "drop_last", bool(self.drop_last))

    @property
    def global_batch_size(self) -> int:
        """Windows one step consumes over all ranks."""
        return self.world_size * self.batch_size

    def same_setting(self, other: Phase) -> bool:
        """Whether ``other`` continues this phase (everything equal but the steps)."""
        return (self.world_size, self.batch_size, self.num_workers, self.drop_last) == (
            other.world_size,
            other.batch_size,
            other.num_workers,
            other.drop_last,
        )


@dataclass(frozen=True)
class EpochPosition:
    """Where an epoch stands: the phases played so far, the last one current.

    Plain integers throughout (:meth:`state_dict`), so it is saved in any checkpoint.
    ``consumed_samples`` (the loader's counter) is the sum over phases of steps times the
    global batch size.
    """

    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise StateError("EpochPosition needs at least one phase")
        object.__setattr__(self, "phases", tuple(self.phases))

    @classmethod
    def start(
        cls, *, world_size: int, batch_size: int, num_workers: int, drop_last: bool = True
    ) -> EpochPosition:
        """The start of an epoch played with one setting."""
        return cls((Phase(world_size, batch_size, num_workers, drop_last),))

    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self.phases[-1]

    @property
    def consumed_samples(self) -> int:
        """Windows consumed by all ranks together (padding included)."""
        return sum(phase.steps * phase.global_batch_size for phase in self.phases)

    def advance(self, steps: int = 1) -> EpochPosition:
        """The position after ``steps`` more steps of the current phase."""
        steps = check_count("EpochPosition", "steps", steps, 0)
        last = self.phase
        moved = Phase(last.world_size, last.batch_size, last.num_workers, last.drop_last,
                      last.steps + steps)  # fmt: skip
        return EpochPosition((*self.phases[:-1], moved))

    def resume(
        self, *, world_size: int, batch_size: int, num_workers: int, drop_last: bool
    ) -> EpochPosition:
        """The position to continue from with a (possibly) new setting.

        The same setting continues the current phase, so the order is the one an
        uninterrupted run would have seen. Another setting starts a new phase over what
        remains; a current phase without steps is simply replaced.
        """
        wanted = Phase(world_size, batch_size, num_workers, drop_last)
        if wanted.same_setting(self.phase):
            return self
        if self.phase.steps == 0:
            return EpochPosition((*self.phases[:-1], wanted))
        return EpochPosition((*self.phases, wanted))

    def state_dict(self) -> dict[str, list[list[int]]]:
        """``{"phases": [[world_size, batch_size, num_workers, drop_last, steps], ...]}``."""
        return {
            "phases": [
                [p.world_size, p.batch_size, p.num_workers, int(p.drop_last), p.steps]
                for p in self.phases
            ]
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> EpochPosition:
        """Inverse of :meth:`state_dict`."""
        try:
            rows = state["phases"]
            phases = tuple(
                Phase(int(w), int(b), int(nw), bool(int(drop)), int(steps))
                for w, b, nw, drop, steps in rows
            )
        except (KeyError, TypeError, ValueError) as error:
            raise StateError(f"malformed EpochPosition state {state!r}: {error}") from error
        return cls(phases)


def check_worker(rank: int, world_size: int, worker_id: int, num_workers: int) -> None:
    if not 0 <= rank < world_size:
        raise LoaderConfigError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
    if not 0 <= worker_id < num_workers:
        raise LoaderConfigError(
            f"worker_id must lie in [0, num_workers={num_workers}), got {worker_id!r}"
        )


class PhaseLayout:
    """One phase's cut of the remaining order ``V`` into rank and worker regions."""

    def __init__(self, n: int, starts: np.ndarray, stops: np.ndarray, phase: Phase) -> None:
        self.n = n
        self.starts, self.stops = starts, stops
        lengths = stops - starts
        self.cumulative = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.remaining = int(self.cumulative[-1])
        self.phase = phase
        size = phase.global_batch_size
        if self.remaining == 0:
            self.num_steps = 0
        elif phase.drop_last:
            self.num_steps = self.remaining // size
        else:
            self.num_steps = -(-self.remaining // size)
        workers = phase.num_workers
        self.worker_steps = [(self.num_steps - w + workers - 1) // workers for w in range(workers)]
        self.worker_offsets = np.concatenate([[0], np.cumsum(self.worker_steps)]).tolist()

    def region(self, rank: int, worker: int) -> tuple[int, int]:
        """``V`` positions ``[start, stop)`` of a reader's region (may pass ``remaining``)."""
        b = self.phase.batch_size
        base = rank * self.num_steps * b
        return (
            base + b * self.worker_offsets[worker],
            base + b * self.worker_offsets[worker + 1],
        )

    def consumed(self, worker: int, steps: int) -> int:
        """Windows of its region a worker consumed in the first ``steps`` steps."""
        workers = self.phase.num_workers
        return (steps - worker + workers - 1) // workers * self.phase.batch_size

    def order_positions(self, v_start: int, v_stop: int) -> Iterator[tuple[int, int]]:
        """``Q`` intervals of ``V`` positions ``[v_start, v_stop)``, padding wrapped."""
        v = v_start
        while v < v_stop:
            if v < self.remaining:
                part = int(np.searchsorted(self.cumulative, v, side="right")) - 1
                end = min(v_stop, int(self.cumulative[part + 1]))
                q = int(self.starts[part]) + v - int(self.cumulative[part])
                yield q, q + end - v
            else:  # padding: the start of the epoch's order again
                q = (v - self.remaining) % self.n
                end = min(v_stop, v + self.n - q)
                yield q, q + end - v
            v = end

    def remaining_after(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """``Q`` intervals that remain after ``steps`` steps of every rank, sorted, merged."""
        if steps > self.num_steps:
            raise StateError(
                f"phase {self.phase} took {steps} steps but has only {self.num_steps} over "
                f"{self.remaining} remaining windows"
            )
        pieces: list[tuple[int, int]] = []
        phase = self.phase
        for rank in range(phase.world_size):
            for worker in range(phase.num_workers):
                start, stop = self.region(rank, worker)
                start += self.consumed(worker, steps)
                pieces.extend(self.order_positions(start, min(stop, self.remaining)))
        tail = self.num_steps * phase.global_batch_size
        if tail < self.remaining:
            pieces.extend(self.order_positions(tail, self.remaining))
        pieces = sorted(piece for piece in pieces if piece[1] > piece[0])
        merged: list[list[int]] = []
        for low, high in pieces:
            if merged and merged[-1][1] == low:
                merged[-1][1] = high
            else:
                merged.append([low, high])
        array = np.asarray(merged, dtype=np.int64).reshape(-1, 2)
        return array[:, 0].copy(), array[:, 1].copy()


def phase_layout(
    num_windows: int, position: EpochPosition, *, owner: str = "the epoch"
) -> tuple[PhaseLayout, int]:
    """The current phase's cut of an epoch of ``num_windows`` positions into rank and
    worker regions (earlier phases replayed), and the steps it took."""
    starts = np.array([0], dtype=np.int64)
    stops = np.array([num_windows], dtype=np.int64)
    if num_windows == 0:
        starts = stops = np.zeros(0, dtype=np.int64)
    for phase in position.phases[:-1]:
        layout = PhaseLayout(num_windows, starts, stops, phase)
        starts, stops = layout.remaining_after(phase.steps)
    layout = PhaseLayout(num_windows, starts, stops, position.phase)
    if position.phase.steps > layout.num_steps:
        raise StateError(
            f"{position.phase} took more steps than its {layout.num_steps} for "
            f"{layout.remaining} remaining positions of {owner}"
        )
    return layout, position.phase.steps


def first_phase_cuts(num_windows: int, position: EpochPosition) -> tuple[int, ...]:
    """Where the epoch's first phase cuts its order into reader regions (the ``drop_last``
    tail's start included), as sorted positions in ``[0, num_windows]``.

    The block shuffle cuts its buffers there (:class:`~rangestream.loader.orders.
    block_shuffle.BlockShuffle`), so in the phase most epochs are played in whole, no
    reader reads a run another reader reads too. Later phases keep that order (it is the
    epoch's), so only their own new cuts can fall inside a buffer.
    """
    phase = position.phases[0]
    if num_windows == 0:
        return (0,)
    layout = PhaseLayout(
        num_windows, np.array([0], dtype=np.int64), np.array([num_windows], dtype=np.int64),
        replace(phase, steps=0),
    )  # fmt: skip
    cuts = {0, num_windows, min(num_windows, layout.num_steps * phase.global_batch_size)}
    for rank in range(phase.world_size):
        for worker in range(phase.num_workers):
            cuts.add(min(num_windows, layout.region(rank, worker)[0]))
    return tuple(sorted(cuts))


def reader_region(
    num_windows: int, position: EpochPosition, *, rank: int, worker_id: int
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """A reader's remaining steps and the intervals of the order it walks, in order.

    Steps are numbered from the first remaining one, as the loader counts them; worker
    ``w`` builds steps ``w, w + NW, ...``; the ``k``-th position of the intervals fills slot
    ``k % B`` of step ``steps[0] + (k // B) * NW``. Intervals past the remaining positions
    wrap around to the start of the order (padding).
    """
    phase = position.phase
    check_worker(rank, phase.world_size, worker_id, phase.num_workers)
    layout, done = phase_layout(num_windows, position)
    workers = phase.num_workers
    steps = np.arange(worker_id, layout.num_steps - done, workers, dtype=np.int64)
    region = (worker_id + done) % workers
    start, stop = layout.region(rank, region)
    start += layout.consumed(region, done)
    if num_windows == 0 or start >= stop:
        return steps, []
    return steps, list(layout.order_positions(start, stop))
