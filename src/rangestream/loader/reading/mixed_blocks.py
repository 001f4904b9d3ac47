"""Reading a block-shuffled mixture: each source's runs read ahead, positions taken in order.

The plan (:mod:`rangestream.loader.mixing.block_plan`) gives a reader its global intervals
and, per source, the segments of its region of that source's draws. Each source's region is
walked buffer by buffer and read run by run (one ``read_many`` per run), and each global
position takes the next window of its source; a reader holds one buffer per source (``K_s``
runs) plus each source's read-ahead.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import StateError
from rangestream.loader.mixing.block_plan import MixedPlan, Segment, mixed_block_plan
from rangestream.loader.orders.phases import phase_layout
from rangestream.loader.orders.worker_plan import RunRead
from rangestream.loader.reading.blocks import needed_windows
from rangestream.loader.reading.sequential import raise_no_batch
from rangestream.loader.reading.tasks import BatchIterator, emit_batches

if TYPE_CHECKING:
    from rangestream.loader.iterable import BatchIterableDataset, Start
    from rangestream.loader.mixing.mixed_source import MixedSource

__all__ = ["MixedBlockIterator", "generate_mixed_block_sync", "plan_reader"]


def plan_reader(dataset: BatchIterableDataset, reader: Any, start: Start) -> MixedPlan:
    """This reader's mixed block plan (the sources' block shuffles chosen on first use)."""
    source: MixedSource = dataset.source  # type: ignore[assignment]
    options = dataset.options
    num_samples = dataset.check_num_samples(source.num_samples(reader))
    readers = options.world_size * start.num_workers  # type: ignore[operator]
    shuffles = source.block_shuffle(num_samples, readers)
    position = start.phases
    assert position is not None
    layout, _ = phase_layout(num_samples, position)
    if position.consumed_samples == 0 and layout.num_steps == 0:
        raise_no_batch(dataset, num_samples)
    return mixed_block_plan(
        source.order,
        shuffles,
        num_samples,
        position,
        epoch=start.epoch,
        rank=options.rank,  # type: ignore[arg-type]
        worker_id=start.worker_id,
    )


_CHUNK = 4096  # global positions whose sources are computed together


class _Now:
    """A read made when its result is asked for (the sync path's stand-in for a future)."""

    def __init__(self, read: Callable[[], list[Any]]) -> None:
        self._read = read

    def result(self) -> list[Any]:
        return self._read()


class _SourceRuns:
    """One source's windows in the reader's order, read run by run ahead of their use."""

    def __init__(
        self, segments: Iterator[Segment], submit: Callable[[RunRead], Any], budget: int
    ) -> None:
        self._segments = segments
        self._submit = submit
        self._budget = budget
        self._ahead: deque[Segment] = deque()
        self._unsent: deque[RunRead] = deque()
        self._pending: deque[tuple[RunRead, int, Any]] = deque()
        self._in_flight = 0
        self._windows: list[int] = []
        self._next = 0
        self._have: dict[int, Any] = {}

    def _pull(self) -> bool:
        segment = next(self._segments, None)
        if segment is None:
            return False
        self._ahead.append(segment)
        self._unsent.extend(segment[1])
        return True

    def fill(self) -> None:
        while self._unsent or self._pull():
            read = self._unsent[0]
            count = len(read.request_windows)
            if self._pending and self._in_flight + count > self._budget:
                return
            self._unsent.popleft()
            self._pending.append((read, count, self._submit(read)))
            self._in_flight += count

    def take(self) -> Any:
        """The source's next window's sample."""
        while self._next >= len(self._windows):
            if not self._ahead and not self._pull():
                raise StateError("a mixture source ran out of windows before its region ended")
            self._windows = self._ahead.popleft()[0].tolist()
            self._next, self._have = 0, {}
        window = self._windows[self._next]
        while window not in self._have:
            self.fill()
            read, count, handle = self._pending.popleft()
            samples = handle.result()
            self._in_flight -= count
            self._have.update(needed_windows(read, samples))
            self.fill()
        self._next += 1
        return self._have[window]


def _steps(
    dataset: BatchIterableDataset, plan: MixedPlan, runs: list[_SourceRuns], epoch: int, skip: int
) -> Iterator[tuple[int, list[Any]]]:
    """``(step, samples)``: the reader's positions in order, each its source's next window."""
    order = dataset.source.order  # type: ignore[attr-defined]
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


def _runs(
    dataset: BatchIterableDataset, reader: Any, plan: MixedPlan, epoch: int,
    read: Callable[[int, list[Any]], Any],
) -> list[_SourceRuns]:  # fmt: skip
    source: MixedSource = dataset.source  # type: ignore[assignment]
    runs = []
    for number, segments in enumerate(plan.segments):
        child, child_reader = source.sources[number], reader.readers[number]
        budget = dataset.options.prefetch or 2 * (source.run_windows[number] or 1)

        def submit(run: RunRead, number: int = number, child: Any = child,
                   child_reader: Any = child_reader) -> Any:  # fmt: skip
            windows = np.asarray(run.request_windows, dtype=np.int64)
            return read(number, list(child.requests(child_reader, windows, epoch)))

        runs.append(_SourceRuns(segments, submit, budget))
    return runs


def generate_mixed_block_sync(
    dataset: BatchIterableDataset, reader: Any, start: Start
) -> Iterator[Any]:
    """The reader's batches of a block-shuffled mixture, read run by run (local disk)."""
    plan = plan_reader(dataset, reader, start)
    source: MixedSource = dataset.source  # type: ignore[assignment]

    def read(number: int, requests: list[Any]) -> _Now:
        child, child_reader = source.sources[number], reader.readers[number]
        return _Now(lambda: child.read_many_sync(child_reader, requests))

    runs = _runs(dataset, reader, plan, start.epoch, read)
    yield from emit_batches(dataset, _steps(dataset, plan, runs, start.epoch, start.done))


class MixedBlockIterator(BatchIterator):
    """Batches of a block-shuffled mixture whose run reads run ahead on the I/O loop."""

    def __init__(self, dataset: BatchIterableDataset, start: Start) -> None:
        super().__init__(dataset)
        self._start = start
        self._steps: Iterator[tuple[int, list[Any]]] | None = None
        self._started: concurrent.futures.Future[Any] | None = self.tasks.submit(self._open())

    async def _open(self) -> tuple[Any, MixedPlan]:
        reader = await self._dataset.async_reader(self.tasks)
        return reader, plan_reader(self._dataset, reader, self._start)

    def _next_step(self) -> tuple[int, list[Any]] | None:
        dataset = self._dataset
        if self._started is not None:
            reader, plan = self._started.result()
            self._started = None
            source: MixedSource = dataset.source  # type: ignore[assignment]

            def read(number: int, requests: list[Any]) -> Any:
                child = source.sources[number]
                return self.tasks.submit(child.read_many(reader.readers[number], requests))

            runs = _runs(dataset, reader, plan, self._start.epoch, read)
            for one in runs:
                one.fill()  # every source starts reading now
            self._steps = _steps(dataset, plan, runs, self._start.epoch, self._start.done)
        assert self._steps is not None
        return next(self._steps, None)
