"""Reading an epoch in sequence order: stretches of steps, read ahead within a budget.

The per-window shuffle, storage order, temporal draws and mixtures all make the epoch one
global sequence (:mod:`rangestream.loader.orders.sequence_plan`). A worker builds *stretches* of
consecutive steps when the consumer puts tagged batches back in order, and reads a stretch with one
``read_many`` call, so its ranges are coalesced: in sequential order a stretch of adjacent
windows, up to :data:`STRETCH_READ_BYTES`, is one range request. Over a remote store reads
are issued on the process's I/O loop in order, at most ``prefetch`` samples ahead of the
batch being assembled, and taken in order, so memory is bounded however slow a read is. On
local disk the worker calls the sync reader stretch by stretch: faster than any read-ahead
of page-cache copies.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.orders.sequence_plan import EpochPlan
from rangestream.loader.reading.tasks import BatchIterator, IterationTasks

if TYPE_CHECKING:
    from rangestream.loader.iterable import BatchIterableDataset, Start

__all__ = [
    "HEAD_STRETCH_STEPS",
    "MAX_STRETCH_STEPS",
    "STRETCH_READ_BYTES",
    "PrefetchingIterator",
    "read_batches_sync",
    "stretches",
]

STRETCH_READ_BYTES = 4 << 20
"""Bytes a worker aims to read per range request in sequential order, by building stretches
of consecutive steps (at most :data:`MAX_STRETCH_STEPS`, at most half the prefetch budget).
An object store charges per request far more than per byte (``docs/design.md``, "The
loader: positions, not worker state")."""

MAX_STRETCH_STEPS = 64
"""Bound on a stretch: the loader holds up to ``(num_workers - 1) * MAX_STRETCH_STEPS``
batches to put stretches from several workers back in step order."""

HEAD_STRETCH_STEPS = 16
"""Bound on the first stretch read in the training process (:meth:`head_stretch`): its
batches only have to last until the workers' first reads arrive."""

_TARGET_BLOCK_SAMPLES = 4096
"""Sequence indices mapped per vectorised order call: large enough to amortise numpy
overhead, small enough that a worker's memory does not grow with the epoch."""

Stretch = tuple[int, list[list[Any]]]
"""``(first step, read requests of each batch)``."""


def stretch_steps(dataset: BatchIterableDataset, num_workers: int) -> int:
    """Consecutive steps a worker builds and reads together (see :data:`STRETCH_READ_BYTES`).

    More than one only where it saves requests (samples adjacent in storage, known size) or
    read calls (a mixture splits each batch into one ``read_many`` per source: reading
    several batches together keeps the calls per sample those of one source), and where the
    order survives it: in a single process, or when the consumer re-sorts tagged batches.
    """
    if num_workers > 1 and not dataset.tagged:
        return 1
    by_budget = dataset.prefetch // (2 * dataset.options.batch_size)  # two stretches in flight
    if dataset.source.reads_per_batch() > 1 and not dataset.source.sample_span_bytes():
        return max(1, by_budget)
    return max(1, min(span_stretch_steps(dataset), by_budget))


def span_stretch_steps(dataset: BatchIterableDataset) -> int:
    """Steps per stretch that make a read of about :data:`STRETCH_READ_BYTES`; 1 if unknown."""
    span = dataset.source.sample_span_bytes()
    if not span:
        return 1
    steps = STRETCH_READ_BYTES // (span * dataset.options.batch_size)
    return max(1, min(MAX_STRETCH_STEPS, steps))


def stretches(dataset: BatchIterableDataset, reader: Any, start: Start) -> Iterator[Stretch]:
    """This worker's remaining stretches: ``(first step, read requests of each batch)``."""
    options, source = dataset.options, dataset.source
    num_samples = dataset.check_num_samples(source.num_samples(reader))
    plan = EpochPlan(
        num_samples=num_samples,
        batch_size=options.batch_size,
        world_size=options.world_size,  # type: ignore[arg-type]
        rank=options.rank,  # type: ignore[arg-type]
        drop_last=options.drop_last,
        consumed_samples=start.consumed_samples,
    )
    if start.consumed_samples == 0 and plan.num_steps == 0:
        raise_no_batch(dataset, num_samples)
    done = start.done
    pending: list[range] = []
    pending_steps = 0
    block_steps = max(1, _TARGET_BLOCK_SAMPLES // plan.batch_size)
    steps = stretch_steps(dataset, start.num_workers)
    for stretch in plan.worker_stretches(start.worker_id, start.num_workers, steps):
        if done >= len(stretch):  # built before a per-worker resume
            done -= len(stretch)
            continue
        pending.append(stretch[done:])
        pending_steps += len(pending[-1])
        done = 0
        if pending_steps >= block_steps:
            yield from _mapped(dataset, reader, plan, pending, start.epoch)
            pending, pending_steps = [], 0
    if pending:
        yield from _mapped(dataset, reader, plan, pending, start.epoch)


def raise_no_batch(dataset: BatchIterableDataset, num_samples: int) -> None:
    """A whole epoch without one batch would end every training loop at once, silently."""
    options = dataset.options
    raise LoaderConfigError(
        f"{dataset.source!r}: an epoch of {num_samples} samples makes no batch of "
        f"batch_size {options.batch_size} x world_size {options.world_size} = "
        f"{options.global_batch_size} samples (drop_last={options.drop_last}); "
        + (
            "the dataset has no sample (is sequence_length longer than the data?)"
            if num_samples == 0
            else "lower batch_size or world_size, or pass drop_last=False"
        )
    )


def _mapped(
    dataset: BatchIterableDataset, reader: Any, plan: EpochPlan, pending: list[range], epoch: int
) -> Iterator[Stretch]:
    # One vectorised mapping (the order) for many stretches: numpy overhead amortised.
    steps = np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in pending])
    indices = plan.sequence_indices(steps).reshape(-1)
    requests = dataset.source.requests(reader, indices, epoch)
    size = plan.batch_size
    first = 0
    for stretch in pending:
        batches = [
            list(requests[(first + k) * size : (first + k + 1) * size]) for k in range(len(stretch))
        ]
        first += len(stretch)
        yield stretch.start, batches


def read_batches_sync(
    dataset: BatchIterableDataset, reader: Any, first_step: int, batches: list[list[Any]]
) -> Iterator[tuple[int, Any]]:
    """Consecutive batches read with one ``read_many`` call, collated one by one."""
    requests = [request for batch in batches for request in batch]
    samples = dataset.source.read_many_sync(reader, requests)
    collate = dataset.options.collate_fn
    offset = 0
    for number, batch in enumerate(batches):
        taken = samples[offset : offset + len(batch)]
        offset += len(batch)
        yield first_step + number, collate(taken)  # type: ignore[misc]


def generate_sync(dataset: BatchIterableDataset, reader: Any, start: Start) -> Iterator[Any]:
    """The worker's batches read with the sync reader, stretch by stretch."""
    for first_step, batches in stretches(dataset, reader, start):
        for step, collated in read_batches_sync(dataset, reader, first_step, batches):
            dataset.worker_batches += 1
            yield dataset.emit(step, collated)


def head_stretch(
    dataset: BatchIterableDataset, context: contextlib.AbstractContextManager[Any], start: Start
) -> Iterator[Any]:
    """The lead-in batch, then the first whole stretch, read in this process (as
    :meth:`BatchIterableDataset.emit` hands them out)."""
    with context as reader:
        dataset.note_reader(reader)
        for first_step, batches in itertools.islice(stretches(dataset, reader, start), 2):
            head = batches[:HEAD_STRETCH_STEPS]
            for step, batch in read_batches_sync(dataset, reader, first_step, head):
                yield dataset.emit(step, batch)


class _ReadAhead:
    """The reads in flight of one iteration: at most ``prefetch`` samples, oldest first.

    A stretch of batches is read with one ``read_many`` call (one round of coalesced range
    requests) once the budget has room for all of it; a one-batch stretch is read in parts
    as room frees up, parts that never span two batches. So what is in flight stays within
    the budget, and what was read waits to be handed over for at most one stretch
    (stretches are at most half the budget).
    """

    def __init__(self, dataset: BatchIterableDataset, tasks: IterationTasks) -> None:
        self.dataset = dataset
        self.tasks = tasks
        self.pending: deque[tuple[int, concurrent.futures.Future[list[Any]]]] = deque()
        self.steps: deque[int] = deque()
        self.in_flight = 0
        self._scheduling: list[Any] = []
        self._whole = 1
        # the first read goes alone: the first batch is what a training loop waits for,
        # and stretches of several MiB read beside it would slow it down
        self.first_pending = True
        self._stretches: Iterator[Stretch] = iter(())
        self._reader: Any = None

    async def start(self, start: Start) -> None:
        """Open the source on the loop and submit the first reads."""
        self._reader = await self.dataset.async_reader(self.tasks)
        self._stretches = stretches(self.dataset, self._reader, start)
        self.fill()

    def fill(self) -> None:
        budget = self.dataset.prefetch
        source = self.dataset.source
        while not (self.first_pending and self.pending):
            if not self._scheduling:
                first_step, batches = next(self._stretches, (0, []))
                if not batches:
                    return
                self.steps.extend(range(first_step, first_step + len(batches)))
                self._scheduling = [request for batch in batches for request in batch]
                # a multi-batch stretch waits until it fits whole: one request, not pieces
                self._whole = len(self._scheduling) if len(batches) > 1 else 1
            room = budget - self.in_flight
            if room < min(self._whole, budget, len(self._scheduling)):
                return
            take = min(len(self._scheduling), room)
            part, self._scheduling = self._scheduling[:take], self._scheduling[take:]
            read = self.tasks.submit(source.read_many(self._reader, part))
            self.pending.append((take, read))
            self.in_flight += take


class PrefetchingIterator(BatchIterator):
    """Collated batches read ahead on the I/O loop, started as soon as it is made.

    Creating it submits the open and the first reads without waiting for them: in a
    DataLoader worker ``iter(dataset)`` runs before the worker answers the loader's start-up
    handshake, so the open and the first requests overlap that round trip. Results are
    taken in order. Closing it (at the end, on an error, or when dropped) cancels and
    drains this iteration's reads; the I/O loop itself carries on.
    """

    def __init__(self, dataset: BatchIterableDataset, start: Start) -> None:
        super().__init__(dataset)
        self._samples: deque[Any] = deque()
        self._reads = _ReadAhead(dataset, self.tasks)
        self._started: concurrent.futures.Future[None] | None = self.tasks.submit(
            self._reads.start(start)
        )

    def _next_step(self) -> tuple[int, list[Any]] | None:
        reads = self._reads
        size = self._dataset.options.batch_size
        if self._started is not None:
            self._started.result()
            self._started = None
        while len(self._samples) < size and reads.pending:
            # Waiting on the oldest read keeps the order; the others run meanwhile.
            count, read = reads.pending.popleft()
            self._samples.extend(read.result())
            reads.in_flight -= count
            reads.first_pending = False
            reads.fill()
        if len(self._samples) < size:
            return None
        return reads.steps.popleft(), [self._samples.popleft() for _ in range(size)]


def check_same_count(known: int | None, found: int, owner: str) -> int:
    """``found``, if it agrees with the count made when the loader was built."""
    if known is not None and known != found:
        raise StateError(
            f"{owner} counted {known} samples when created but the reader in process "
            f"{os.getpid()} has {found}; the dataset changed underneath the loader"
        )
    return found
