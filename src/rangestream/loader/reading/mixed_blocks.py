"""The mixed block-shuffle strategy: each source's runs read ahead, positions in order.

The plan (:mod:`rangestream.loader.mixing.block_plan`) gives a reader its global intervals
and, per source, the segments of its region of that source's draws. Each source's region is
walked buffer by buffer and read run by run (one ``read_many`` per run) through its own
read-ahead (:mod:`rangestream.loader.reading.read_ahead`), and each global position takes
the next window of its source; a reader holds one buffer per source (``K_s`` runs) plus
each source's read-ahead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from rangestream.errors import StateError
from rangestream.loader.mixing.block_plan import MixedPlan, Segment, mixed_block_plan
from rangestream.loader.mixing.mixed_source import MixedReader, MixedSource
from rangestream.loader.orders.phases import phase_layout
from rangestream.loader.orders.worker_plan import RunRead
from rangestream.loader.reading.batches import ReadSpec, Start, Steps, raise_no_batch
from rangestream.loader.reading.blocks import needed_windows
from rangestream.loader.reading.read_ahead import Feed, ReadAhead, ReadEdge, ReadUnit
from rangestream.loader.sources.protocol import SampleSource

__all__ = ["MixedBlockShuffled", "plan_reader"]


def plan_reader(spec: ReadSpec, reader: Any, start: Start) -> MixedPlan:
    """This reader's mixed block plan (the sources' block shuffles chosen on first use)."""
    source = cast(MixedSource, spec.source)
    num_samples = spec.check_count(source.num_samples(reader))
    shuffles = source.block_shuffle(num_samples, spec.world_size * start.num_workers)
    position = start.phases
    assert position is not None
    layout, _ = phase_layout(num_samples, position)
    if position.consumed_samples == 0 and layout.num_steps == 0:
        raise_no_batch(spec, num_samples)
    return mixed_block_plan(
        source.order,
        shuffles,
        num_samples,
        position,
        epoch=start.epoch,
        rank=spec.rank,
        worker_id=start.worker_id,
    )


_CHUNK = 4096  # global positions whose sources are computed together


class _SourceRuns:
    """One source's windows in the reader's order, read run by run ahead of their use."""

    def __init__(
        self,
        segments: Iterator[Segment],
        edge: ReadEdge,
        source: SampleSource,
        reader: Any,
        epoch: int,
        budget: int,
    ) -> None:
        self._feed: Feed[Segment, RunRead] = Feed(segments, lambda segment: segment[1])

        def units() -> Iterator[ReadUnit[RunRead]]:
            for run in self._feed.reads():
                windows = np.asarray(run.request_windows, dtype=np.int64)
                yield ReadUnit(run, list(source.requests(reader, windows, epoch)))

        def read(requests: list[Any]) -> Any:
            return edge.read(source, reader, requests)

        self.ahead: ReadAhead[RunRead] = edge.read_ahead(units(), read, budget)
        self._windows: list[int] = []
        self._next = 0
        self._have: dict[int, Any] = {}

    def take(self) -> Any:
        """The source's next window's sample."""
        while self._next >= len(self._windows):
            segment = self._feed.next_group()
            if segment is None:
                raise StateError("a mixture source ran out of windows before its region ended")
            self._windows = segment[0].tolist()
            self._next, self._have = 0, {}
        window = self._windows[self._next]
        while window not in self._have:
            taken = self.ahead.take()
            if taken is None:
                raise StateError("a mixture source's reads ended before its region did")
            self._have.update(needed_windows(*taken))
        self._next += 1
        return self._have[window]


def _steps(order: Any, plan: MixedPlan, runs: list[_SourceRuns], epoch: int, skip: int) -> Steps:
    """``(step, samples)``: the reader's positions in order, each its source's next window."""
    size, first_step = plan.batch_size, int(plan.steps[0]) if plan.steps.size else 0
    batch: list[Any] = []
    taken = 0
    for low, high in plan.intervals:
        for chunk in range(low, high, _CHUNK):
            sources, _ = order.draws(np.arange(chunk, min(high, chunk + _CHUNK)), epoch)
            for number in sources.tolist():
                batch.append(runs[number].take())
                if len(batch) == size:
                    step = first_step + taken * plan.workers
                    taken += 1
                    if taken > skip:
                        yield step, batch
                    batch = []


class MixedBlockShuffled:
    """The strategy of block-shuffled mixtures (:attr:`EpochPlanning.MIXED_BLOCKS`)."""

    phased = True

    def default_prefetch(self, source: SampleSource, batch_size: int) -> int:
        """Two runs of the source with the longest runs."""
        runs = cast(MixedSource, source).run_windows
        return 2 * max((run or 1 for run in runs), default=1)

    def choose_parameters(
        self, source: SampleSource, count: Callable[[], int], readers: int
    ) -> None:
        cast(MixedSource, source).block_shuffle(count(), readers)

    def steps(self, spec: ReadSpec, reader: Any, start: Start, edge: ReadEdge) -> Steps:
        plan = plan_reader(spec, reader, start)
        source = cast(MixedSource, spec.source)
        mixed: MixedReader = reader
        runs = [
            _SourceRuns(
                segments,
                edge,
                source.sources[number],
                mixed.readers[number],
                start.epoch,
                spec.prefetch or 2 * (source.run_windows[number] or 1),
            )
            for number, segments in enumerate(plan.segments)
        ]
        for one in runs:
            one.ahead.fill()  # every source starts reading now
        return _steps(source.order, plan, runs, start.epoch, start.done)

    def head_stretch(
        self,
        spec: ReadSpec,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any] | None],
        start: Start,
    ) -> Iterator[Any] | None:
        return None  # its regions depend on the workers
