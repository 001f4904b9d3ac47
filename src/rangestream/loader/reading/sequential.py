"""The in-order strategy: an epoch in sequence order, read in stretches of steps.

The per-window shuffle, storage order, temporal draws and mixtures all make the epoch one
global sequence (:mod:`rangestream.loader.orders.sequence_plan`). A worker builds *stretches*
of consecutive steps when the consumer puts tagged batches back in order, and reads a stretch
with one ``read_many`` call, so its ranges are coalesced: in sequential order a stretch of
adjacent windows, up to :data:`STRETCH_READ_BYTES`, is one range request. The stretches go
through the read-ahead (:mod:`rangestream.loader.reading.read_ahead`): over a remote store at
most ``prefetch`` samples ahead of the batch being assembled, taken in order, so memory is
bounded however slow a read is; on local disk stretch by stretch with the sync reader, faster
than any read-ahead of page-cache copies.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rangestream.loader.orders.sequence_plan import EpochPlan
from rangestream.loader.reading.batches import (
    DEFAULT_PREFETCH,
    ReadSpec,
    Start,
    Steps,
    raise_no_batch,
)
from rangestream.loader.reading.read_ahead import ReadAhead, ReadEdge, ReadUnit
from rangestream.loader.sources.protocol import SampleSource

__all__ = [
    "HEAD_STRETCH_STEPS",
    "MAX_STRETCH_STEPS",
    "STRETCH_READ_BYTES",
    "InOrder",
    "read_batches_sync",
    "span_stretch_steps",
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


def stretch_steps(spec: ReadSpec, num_workers: int, budget: int) -> int:
    """Consecutive steps a worker builds and reads together (see :data:`STRETCH_READ_BYTES`).

    More than one only where it saves requests (samples adjacent in storage, known size) or
    read calls (a mixture splits each batch into one ``read_many`` per source: reading
    several batches together keeps the calls per sample those of one source), and where the
    order survives it: in a single process, or when the consumer re-sorts tagged batches.
    """
    if num_workers > 1 and not spec.tagged:
        return 1
    by_budget = budget // (2 * spec.batch_size)  # two stretches in flight
    if spec.source.reads_per_batch() > 1 and not spec.source.sample_span_bytes():
        return max(1, by_budget)
    return max(1, min(span_stretch_steps(spec.source, spec.batch_size), by_budget))


def span_stretch_steps(source: SampleSource, batch_size: int) -> int:
    """Steps per stretch that make a read of about :data:`STRETCH_READ_BYTES`; 1 if unknown."""
    span = source.sample_span_bytes()
    if not span:
        return 1
    steps = STRETCH_READ_BYTES // (span * batch_size)
    return max(1, min(MAX_STRETCH_STEPS, steps))


def stretches(spec: ReadSpec, reader: Any, start: Start, budget: int) -> Iterator[Stretch]:
    """This worker's remaining stretches: ``(first step, read requests of each batch)``;
    ``budget``: the samples in flight per worker."""
    num_samples = spec.check_count(spec.source.num_samples(reader))
    plan = EpochPlan(
        num_samples=num_samples,
        batch_size=spec.batch_size,
        world_size=spec.world_size,
        rank=spec.rank,
        drop_last=spec.drop_last,
        consumed_samples=start.consumed_samples,
    )
    if start.consumed_samples == 0 and plan.num_steps == 0:
        raise_no_batch(spec, num_samples)
    done = start.done
    pending: list[range] = []
    pending_steps = 0
    block_steps = max(1, _TARGET_BLOCK_SAMPLES // plan.batch_size)
    steps = stretch_steps(spec, start.num_workers, budget)
    for stretch in plan.worker_stretches(start.worker_id, start.num_workers, steps):
        if done >= len(stretch):  # built before a per-worker resume
            done -= len(stretch)
            continue
        pending.append(stretch[done:])
        pending_steps += len(pending[-1])
        done = 0
        if pending_steps >= block_steps:
            yield from _mapped(spec.source, reader, plan, pending, start.epoch)
            pending, pending_steps = [], 0
    if pending:
        yield from _mapped(spec.source, reader, plan, pending, start.epoch)


def _mapped(
    source: SampleSource, reader: Any, plan: EpochPlan, pending: list[range], epoch: int
) -> Iterator[Stretch]:
    # One vectorised mapping (the order) for many stretches: numpy overhead amortised.
    steps = np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in pending])
    indices = plan.sequence_indices(steps).reshape(-1)
    requests = source.requests(reader, indices, epoch)
    size = plan.batch_size
    first = 0
    for stretch in pending:
        batches = [
            list(requests[(first + k) * size : (first + k + 1) * size]) for k in range(len(stretch))
        ]
        first += len(stretch)
        yield stretch.start, batches


def read_batches_sync(
    spec: ReadSpec, reader: Any, first_step: int, batches: list[list[Any]]
) -> Iterator[tuple[int, Any]]:
    """Consecutive batches read with one ``read_many`` call, collated one by one."""
    requests = [request for batch in batches for request in batch]
    samples = spec.source.read_many_sync(reader, requests)
    offset = 0
    for number, batch in enumerate(batches):
        taken = samples[offset : offset + len(batch)]
        offset += len(batch)
        yield first_step + number, spec.collate(taken)


class InOrder:
    """The strategy of sources planned as one sequence (:attr:`EpochPlanning.SEQUENCE`)."""

    phased = False

    def default_prefetch(self, source: SampleSource, batch_size: int) -> int:
        """Two stretches of sequential windows, at least :data:`DEFAULT_PREFETCH`."""
        return max(DEFAULT_PREFETCH, 2 * span_stretch_steps(source, batch_size) * batch_size)

    def choose_parameters(
        self, source: SampleSource, count: Callable[[], int], readers: int
    ) -> None:
        return None  # the sequence's order has no parameters to choose

    def steps(self, spec: ReadSpec, reader: Any, start: Start, edge: ReadEdge) -> Steps:
        """Stretches read ahead whole (several batches: one request) or, one batch, in
        parts as room frees up; each batch's samples taken in order."""
        steps: deque[int] = deque()
        budget = spec.budget(self)

        def units() -> Iterator[ReadUnit[None]]:
            for first_step, batches in stretches(spec, reader, start, budget):
                steps.extend(range(first_step, first_step + len(batches)))
                requests = [request for batch in batches for request in batch]
                yield ReadUnit(None, requests, divisible=len(batches) == 1)

        def read(requests: list[Any]) -> Any:
            return edge.read(spec.source, reader, requests)

        ahead = edge.read_ahead(units(), read, budget)
        ahead.fill()
        return _batches(ahead, steps, spec.batch_size)

    def head_stretch(
        self,
        spec: ReadSpec,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any] | None],
        start: Start,
    ) -> Iterator[Any] | None:
        """The lead-in batch, then the first whole stretch, read in this process (as
        ``spec.emit`` hands them out); ``None`` for remote sources."""
        context = open_sync()
        if context is None:
            return None
        return _head_stretch(spec, context, start, spec.budget(self))


def _batches(ahead: ReadAhead[None], steps: deque[int], size: int) -> Steps:
    samples: deque[Any] = deque()
    while True:
        while len(samples) < size:
            taken = ahead.take()
            if taken is None:
                break
            samples.extend(taken[1])
        if len(samples) < size:
            return
        yield steps.popleft(), [samples.popleft() for _ in range(size)]


def _head_stretch(
    spec: ReadSpec, context: contextlib.AbstractContextManager[Any], start: Start, budget: int
) -> Iterator[Any]:
    with context as reader:
        spec.note_reader(reader)
        for first_step, batches in itertools.islice(stretches(spec, reader, start, budget), 2):
            head = batches[:HEAD_STRETCH_STEPS]
            for step, batch in read_batches_sync(spec, reader, first_step, head):
                yield spec.emit(step, batch)
