"""The mixed block plan: which draws of each source a reader of a mixture reads, in runs.

Each source runs its own block shuffle
(:class:`~rangestream.loader.orders.block_shuffle.BlockShuffle`) over its draws: draw ``j`` of
source ``s`` in epoch ``e`` is, through its pass or down-sampling cycle
(:class:`~rangestream.loader.mixing.mixture.SourceDraws`), a position of one of ``s``'s block
orders. Readers (DataLoader workers of ranks) own regions of the *global* order, cut as the block
shuffle cuts one source (:func:`~rangestream.loader.orders.phases.reader_region`). The interleave's
prefix counts are monotone, so a reader's region ``[a, b)`` of global positions holds, of each
source, the contiguous draws ``[c_s(a), c_s(b))``: a region of that source's draw sequence sized by
its count of the source's samples over the reader's steps, never a fixed ``B`` per step. Pure
arithmetic: :mod:`rangestream.loader.reading.mixed_blocks` reads the plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rangestream.loader.mixing.mixed_order import MixedOrder
from rangestream.loader.mixing.mixture import SourceDraws
from rangestream.loader.orders.block_shuffle import BlockShuffle
from rangestream.loader.orders.phases import EpochPosition, reader_region
from rangestream.loader.orders.worker_plan import RunRead

__all__ = ["CYCLE_EPOCH", "MixedPlan", "Segment", "mixed_block_plan", "source_ranges"]

CYCLE_EPOCH = 2**62
"""The block order key of a source's down-sampling cycle (passes use their pass numbers)."""

Segment = tuple[np.ndarray, tuple[RunRead, ...]]


def source_ranges(
    draws: SourceDraws, epoch: int, first: int, stop: int
) -> Iterator[tuple[int, int, int]]:
    """``(order key, start, stop)``: the block-order positions of draws ``[first, stop)``.

    Whole passes read pass ``epoch * passes + j // M`` at ``j % M``; the rest reads the
    cycle at ``(j - passes * M + epoch * remainder) % M`` (as :meth:`SourceDraws.keys`), so a
    range of draws is at most a few contiguous ranges of positions.
    """
    size, passes = draws.size, draws.passes
    whole = passes * size
    cycle_start = (epoch * draws.remainder) % size
    j = first
    while j < stop:
        if j < whole:
            number, index = divmod(j, size)
            end = min(stop, (number + 1) * size)
            yield epoch * passes + number, index, index + end - j
        else:
            index = (j - whole + cycle_start) % size
            end = min(stop, j + size - index)
            yield CYCLE_EPOCH, index, index + end - j
        j = end


@dataclass
class MixedPlan:
    """A reader's remaining steps, its global intervals and each source's segments."""

    steps: np.ndarray
    batch_size: int
    workers: int
    intervals: list[tuple[int, int]]
    segments: list[Iterator[Segment]]


def mixed_block_plan(
    order: MixedOrder,
    shuffles: list[BlockShuffle],
    num_samples: int,
    position: EpochPosition,
    *,
    epoch: int,
    rank: int,
    worker_id: int,
) -> MixedPlan:
    """A reader's remaining steps of a block-shuffled mixture: its global intervals, and
    for each source the segments (buffers, run reads) of its region of that source's draws.

    ``order`` is the mixture's order, ``shuffles`` its sources' block shuffles
    (:meth:`~rangestream.loader.mixing.mixed_source.MixedSource.block_shuffle`).
    """
    steps, intervals = reader_region(num_samples, position, rank=rank, worker_id=worker_id)
    ranges: list[list[tuple[int, int]]] = [[] for _ in shuffles]
    for low, high in intervals:
        before = order.draws_before(epoch, low)
        after = order.draws_before(epoch, high)
        for number in np.flatnonzero(after > before).tolist():
            ranges[number].append((int(before[number]), int(after[number])))

    def segments(number: int, shuffle: BlockShuffle) -> Iterator[Segment]:
        draws = order.draws_per_source[number]
        for first, stop in ranges[number]:
            for key, low, high in source_ranges(draws, epoch, first, stop):
                yield from shuffle.segments(key, low, high)

    return MixedPlan(
        steps=steps,
        batch_size=position.phase.batch_size,
        workers=position.phase.num_workers,
        intervals=intervals,
        segments=[segments(number, shuffle) for number, shuffle in enumerate(shuffles)],
    )
