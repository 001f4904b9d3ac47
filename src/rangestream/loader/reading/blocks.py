"""Reading a block-shuffled epoch: one ``read_many`` per run, batches as reads arrive.

A worker's :class:`~rangestream.loader.orders.worker_plan.WorkerPlan` lists read groups (one per
buffer its region visits), each a list of :class:`~rangestream.loader.orders.worker_plan.RunRead` s
in the order their windows are first needed. The worker issues one ``read_many`` per
``RunRead``, in that order, keeps the windows of the group being handed out (at most one
buffer: ``K`` runs) and hands out a step as soon as the reads holding its windows have
arrived. Over a remote store reads run ahead on the process's I/O loop, at most
``prefetch`` windows requested and not yet taken (by default two runs); so a worker holds
at most ``K x run`` windows plus the prefetch. On local disk it reads run by run with the
sync reader.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.loader.orders.worker_plan import ReadGroup, RunRead, WorkerPlan
from rangestream.loader.reading.sequential import raise_no_batch
from rangestream.loader.reading.tasks import BatchIterator, emit_batches

if TYPE_CHECKING:
    from rangestream.loader.iterable import BatchIterableDataset, Start

__all__ = ["BlockIterator", "block_plan", "generate_block_sync", "needed_windows"]


def block_plan(dataset: BatchIterableDataset, reader: Any, start: Start) -> WorkerPlan:
    """The remaining reads and steps of this worker under the block shuffle."""
    options = dataset.options
    num_samples = dataset.check_num_samples(dataset.source.num_samples(reader))
    readers = options.world_size * start.num_workers  # type: ignore[operator]
    shuffle = dataset.source.block_shuffle(num_samples, readers)  # type: ignore[attr-defined]
    position = start.phases
    assert position is not None
    if position.consumed_samples == 0 and shuffle.num_steps(position) == 0:
        raise_no_batch(dataset, num_samples)
    return shuffle.worker_plan(  # type: ignore[no-any-return]
        start.epoch, position, rank=options.rank, worker_id=start.worker_id
    )


class _Feed:
    """The plan's groups, pulled ahead of the batches for the reads to run ahead."""

    def __init__(self, plan: WorkerPlan) -> None:
        self._groups = plan.groups()
        self.groups: deque[ReadGroup] = deque()
        self.reads: deque[RunRead] = deque()

    def pull(self) -> bool:
        group = next(self._groups, None)
        if group is None:
            return False
        self.groups.append(group)
        self.reads.extend(group.reads)
        return True

    def next_group(self) -> ReadGroup | None:
        if not self.groups and not self.pull():
            return None
        return self.groups.popleft()


def needed_windows(read: RunRead, samples: list[Any]) -> dict[int, Any]:
    """The needed windows of a read, by window index."""
    requested = read.request_windows
    if isinstance(requested, range):
        first = requested.start
        return {window: samples[window - first] for window in read.windows.tolist()}
    return dict(zip(requested.tolist(), samples, strict=True))


def assemble(
    plan: WorkerPlan,
    feed: _Feed,
    arrived: Iterator[tuple[RunRead, list[Any]]],
    skip: int,
    first: Callable[[], dict[int, Any]] | None = None,
) -> Iterator[tuple[int, list[Any]]]:
    """``(step, samples)`` of the worker's steps in order, each as soon as its reads arrived.

    ``arrived`` yields every read's samples in the feed's read order; the first ``skip``
    steps are dropped (built before a per-worker resume). ``first`` returns windows read
    apart for the first group (the first step's), used before any run read arrives.
    """
    size = plan.batch_size
    pending: dict[int, list[Any]] = {}
    filled: dict[int, int] = {}
    order = iter(plan.steps.tolist())
    next_step = next(order, None)
    while (group := feed.next_group()) is not None:
        have: dict[int, Any] = {}
        if first is not None:
            have, first = first(), None
        for step, slot, window in zip(
            group.steps.tolist(), group.slots.tolist(), group.windows.tolist(), strict=True
        ):
            while window not in have:
                read, samples = next(arrived)
                have.update(needed_windows(read, samples))
            batch = pending.get(step)
            if batch is None:
                batch = pending[step] = [None] * size
            batch[slot] = have[window]
            filled[step] = filled.get(step, 0) + 1
            while next_step is not None and filled.get(next_step) == size:
                del filled[next_step]
                samples_of_step = pending.pop(next_step)
                if skip:
                    skip -= 1
                else:
                    yield next_step, samples_of_step
                next_step = next(order, None)


def _requests(dataset: BatchIterableDataset, reader: Any, read: RunRead, epoch: int) -> list[Any]:
    windows = np.asarray(read.request_windows, dtype=np.int64)
    return list(dataset.source.requests(reader, windows, epoch))


def generate_block_sync(dataset: BatchIterableDataset, reader: Any, start: Start) -> Iterator[Any]:
    """The worker's block-shuffled batches read with the sync reader, run by run."""
    plan = block_plan(dataset, reader, start)
    feed = _Feed(plan)
    source = dataset.source

    def arrived() -> Iterator[tuple[RunRead, list[Any]]]:
        while feed.reads or feed.pull():
            read = feed.reads.popleft()
            yield read, source.read_many_sync(reader, _requests(dataset, reader, read, start.epoch))

    yield from emit_batches(dataset, assemble(plan, feed, arrived(), start.done))


class BlockIterator(BatchIterator):
    """Block-shuffled batches whose run reads run ahead on the process's I/O loop."""

    def __init__(self, dataset: BatchIterableDataset, start: Start) -> None:
        super().__init__(dataset)
        self._start = start
        self._reader: Any = None
        self._pending: deque[tuple[RunRead, int, concurrent.futures.Future[list[Any]]]] = deque()
        self._in_flight = 0
        self._feed: _Feed | None = None
        self._batches: Iterator[tuple[int, list[Any]]] | None = None
        self._first: Callable[[], dict[int, Any]] | None = None
        self._started: concurrent.futures.Future[Any] | None = self.tasks.submit(self._open())

    async def _open(self) -> WorkerPlan:
        """Open, plan, and send the first step's reads: in a DataLoader worker this runs
        while the worker answers the loader's start-up handshake."""
        self._reader = await self._dataset.async_reader(self.tasks)
        plan = block_plan(self._dataset, self._reader, self._start)
        self._feed = _Feed(plan)
        if not self._start.done:
            self._first = self._read_first_step()
        return plan

    def _read_first_step(self) -> Callable[[], dict[int, Any]] | None:
        """Read the first step's windows one by one, ahead of the runs that hold them.

        The first step takes windows of up to ``K`` runs of its buffer: waiting for those
        runs (``K`` x 4 MiB) delays the first batch a training loop waits for, while its
        few windows, read alone and at once, cost one round trip and a request each. The
        runs start loading once they arrived: read beside them, the windows waited for
        the runs' bytes (``docs/design.md``).
        """
        feed = self._feed
        assert feed is not None
        if not feed.groups and not feed.pull():
            return None
        group = feed.groups[0]
        if len(group.reads) < 2:
            return None  # one run holds it: reading it is as fast
        windows = np.unique(group.windows[group.steps == group.steps[0]])
        reader, source = self._reader, self._dataset.source
        requests = list(source.requests(reader, windows, self._start.epoch))
        future = self.tasks.submit(source.read_many(reader, requests))

        def arrived() -> dict[int, Any]:
            samples = future.result()
            self._fill()
            return dict(zip(windows.tolist(), samples, strict=True))

        return arrived

    def _fill(self) -> None:
        feed = self._feed
        assert feed is not None
        budget = max(self._dataset.prefetch, 1)
        source = self._dataset.source
        while feed.reads or feed.pull():
            read = feed.reads[0]
            count = len(read.request_windows)
            if self._pending and self._in_flight + count > budget:
                return
            feed.reads.popleft()
            requests = _requests(self._dataset, self._reader, read, self._start.epoch)
            future = self.tasks.submit(source.read_many(self._reader, requests))
            self._pending.append((read, count, future))
            self._in_flight += count

    def _arrived(self) -> Iterator[tuple[RunRead, list[Any]]]:
        while True:
            self._fill()
            if not self._pending:
                return
            read, count, future = self._pending.popleft()
            samples = future.result()
            self._in_flight -= count
            self._fill()
            yield read, samples

    def _next_step(self) -> tuple[int, list[Any]] | None:
        if self._started is not None:
            plan = self._started.result()
            self._started = None
            assert self._feed is not None
            if self._first is None:
                self._fill()
            self._batches = assemble(
                plan, self._feed, self._arrived(), self._start.done, self._first
            )
        assert self._batches is not None
        return next(self._batches, None)
