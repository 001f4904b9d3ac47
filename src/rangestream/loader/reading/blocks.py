"""The block-shuffle strategy: one ``read_many`` per run, batches as reads arrive.

A worker's :class:`~rangestream.loader.orders.worker_plan.WorkerPlan` lists read groups (one
per buffer its region visits), each a list of
:class:`~rangestream.loader.orders.worker_plan.RunRead` s in the order their windows are first
needed. The worker issues one ``read_many`` per ``RunRead``, in that order, through the
read-ahead (:mod:`rangestream.loader.reading.read_ahead`), keeps the windows of the group
being handed out (at most one buffer: ``K`` runs) and hands out a step as soon as the reads
holding its windows have arrived. Over a remote store at most ``prefetch`` windows are
requested and not yet taken (by default one buffer: the next buffer is read while this one
is handed out), so a worker holds at most ``K x run`` windows plus the prefetch; of those
reads, :data:`RUNS_IN_FLIGHT` run at once, the others wait their turn on the I/O loop, so the
next GET starts when one ends, not when the consumer next asks. The first step's windows
are read apart first (one round trip, rather than waiting for the ``K`` runs that hold
them). On local disk it reads run by run with the sync reader.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any, cast

import numpy as np

from rangestream.loader.orders.worker_plan import ReadGroup, RunRead, WorkerPlan
from rangestream.loader.reading.batches import ReadSpec, Start, Steps, raise_no_batch
from rangestream.loader.reading.read_ahead import Feed, ReadEdge, ReadUnit
from rangestream.loader.sources.protocol import BlockShuffledSource, SampleSource

__all__ = [
    "FIRST_RUNS_BYTES",
    "RUNS_IN_FLIGHT",
    "BlockShuffled",
    "Placement",
    "assemble",
    "block_plan",
    "merge_adjacent",
    "needed_windows",
]

Placement = Callable[[list[Any]], dict[int, Any]]
"""A read's samples by window index (what a read's unit carries as its tag)."""


def block_plan(spec: ReadSpec, reader: Any, start: Start) -> WorkerPlan:
    """The remaining reads and steps of this worker under the block shuffle."""
    source = cast(BlockShuffledSource, spec.source)
    num_samples = spec.check_count(source.num_samples(reader))
    shuffle = source.block_shuffle(num_samples, spec.world_size * start.num_workers)
    position = start.phases
    assert position is not None
    if position.consumed_samples == 0 and shuffle.num_steps(position) == 0:
        raise_no_batch(spec, num_samples)
    return shuffle.worker_plan(start.epoch, position, rank=spec.rank, worker_id=start.worker_id)


def needed_windows(read: RunRead, samples: list[Any]) -> dict[int, Any]:
    """The needed windows of a read, by window index."""
    requested = read.request_windows
    if isinstance(requested, range):
        first = requested.start
        return {window: samples[window - first] for window in read.windows.tolist()}
    return dict(zip(requested.tolist(), samples, strict=True))


def assemble(
    plan: WorkerPlan,
    feed: Feed[ReadGroup, RunRead],
    arrived: Iterator[tuple[Placement, list[Any]]],
    skip: int,
) -> Steps:
    """``(step, samples)`` of the worker's steps in order, each as soon as its reads arrived.

    ``arrived`` yields every read's placement and samples in the read-ahead's order; the
    first ``skip`` steps are dropped (built before a per-worker resume).
    """
    size = plan.batch_size
    pending: dict[int, list[Any]] = {}
    filled: dict[int, int] = {}
    order = iter(plan.steps.tolist())
    next_step = next(order, None)
    while (group := feed.next_group()) is not None:
        have: dict[int, Any] = {}
        for step, slot, window in zip(
            group.steps.tolist(), group.slots.tolist(), group.windows.tolist(), strict=True
        ):
            while window not in have:
                place, samples = next(arrived)
                have.update(place(samples))
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


RUNS_IN_FLIGHT = 2
"""Run reads a worker has running at once (the rest of its read-ahead waits its turn).

A run's GET is a round trip and then its transfer (4 MiB); with two running, one's request
is on its way while the other transfers, so the connection never waits for a round trip.
More would only share the same bandwidth and delay the run needed first (reads complete in
the order they are needed)."""

FIRST_RUNS_BYTES = 1 << 20
"""Bytes of the runs holding the first step up to which those runs are the first read.

Runs that small arrive in about the round trip the first step's windows read apart would
take (their GETs run together: at 20 ms and 50 MB/s about 1 MiB arrives in a round trip),
and the windows read apart are bytes read twice: each one's inner chunks again in its run
(9% of the data of a reader holding 16 runs of 64 KiB). Beyond this, the runs would delay
the first batch by their transfer, and the windows are read apart."""


def merge_adjacent(reads: tuple[RunRead, ...]) -> list[RunRead]:
    """A group's reads with whole runs adjacent in storage read together.

    Where windows do not start on inner-chunk boundaries, the chunk a run ends in is the
    chunk the next run starts in, and chunks are read whole (their crc32c is checked): read
    apart, that chunk is fetched twice. Whole runs of one group (one buffer, held together
    anyway) that touch are one read, one coalesced range, at the first use of either; its
    memory is the group's. Partial runs (a region's edge) are read as they are.
    """
    if len(reads) < 2:
        return list(reads)
    whole = sorted((read for read in reads if read.whole), key=lambda read: read.start)
    chains: list[list[RunRead]] = []
    for read in whole:
        if chains and chains[-1][-1].stop == read.start:
            chains[-1].append(read)
        else:
            chains.append([read])
    merged = [
        RunRead(
            chain[0].start,
            chain[-1].stop,
            np.concatenate([read.windows for read in chain]),
            min(read.first_use for read in chain),
        )
        for chain in chains
    ]
    merged.extend(read for read in reads if not read.whole)
    return sorted(merged, key=lambda read: read.first_use)


def _first_step(
    spec: ReadSpec, reader: Any, feed: Feed[ReadGroup, RunRead], epoch: int
) -> tuple[ReadUnit[Placement], list[RunRead]] | None:
    """The first step's windows as one read, ahead of the runs that hold them, and the
    reads it serves whole (not to be made again).

    The first step takes windows of up to ``K`` runs of its buffer: waiting for those
    runs (``K`` x 4 MiB) delays the first batch a training loop waits for, while its few
    windows, read alone and at once, cost one round trip and a request each. The runs
    start loading once they arrived: read beside them, the windows waited for the runs'
    bytes (``docs/design.md``). Runs holding at most :data:`FIRST_RUNS_BYTES` together
    are read instead, all in that first read: as fast, and no chunk read twice.
    """
    group = feed.first_group()
    if group is None or len(group.reads) < 2:
        return None  # one run holds it: reading it is as fast
    windows = np.unique(group.windows[group.steps == group.steps[0]])
    holding = [
        read
        for read in feed.waiting_reads()
        if ((windows >= read.start) & (windows < read.stop)).any()
    ]
    span = spec.source.sample_span_bytes()
    run_bytes = sum(len(read.request_windows) for read in holding) * (span or 0)
    if span is not None and run_bytes <= FIRST_RUNS_BYTES:
        parts = [np.asarray(read.request_windows, dtype=np.int64) for read in holding]
        chosen = np.concatenate(parts)
        requests = list(spec.source.requests(reader, chosen, epoch))

        def place_runs(samples: list[Any]) -> dict[int, Any]:
            out: dict[int, Any] = {}
            at = 0
            for read, part in zip(holding, parts, strict=True):
                out.update(needed_windows(read, samples[at : at + len(part)]))
                at += len(part)
            return out

        return ReadUnit(place_runs, requests), holding
    requests = list(spec.source.requests(reader, windows, epoch))

    def place(samples: list[Any]) -> dict[int, Any]:
        return dict(zip(windows.tolist(), samples, strict=True))

    return ReadUnit(place, requests), []


class BlockShuffled:
    """The strategy of block-shuffled sources (:attr:`EpochPlanning.BLOCKS`)."""

    phased = True

    def default_prefetch(self, source: SampleSource, batch_size: int) -> int:
        """One buffer (``K`` runs), at least two runs.

        A buffer's first steps take windows of all its ``K`` runs, so the next buffer's
        runs are what must be read while this one is handed out: with less ahead, the
        worker hands out a buffer with the network idle, then waits for ``K`` runs with the
        CPU idle. A worker holds at most two buffers (the one handed out, the next).
        """
        block = cast(BlockShuffledSource, source)
        return max(2, block.buffer_runs or 1) * (block.run_windows or 1)

    def choose_parameters(
        self, source: SampleSource, count: Callable[[], int], readers: int
    ) -> None:
        # chosen here from the count; a worker chooses them from its reader when it plans
        # (counting here would open the dataset a second time in the worker)
        cast(BlockShuffledSource, source).block_shuffle(count(), readers)

    def steps(self, spec: ReadSpec, reader: Any, start: Start, edge: ReadEdge) -> Steps:
        plan = block_plan(spec, reader, start)
        feed: Feed[ReadGroup, RunRead] = Feed(plan.groups(), lambda g: merge_adjacent(g.reads))
        source, epoch = spec.source, start.epoch
        first = _first_step(spec, reader, feed, epoch) if edge.overlaps and not start.done else None
        served = set() if first is None else {id(read) for read in first[1]}

        def runs() -> Iterator[ReadUnit[Placement]]:
            for run in feed.reads():
                if id(run) in served:  # the first read made it
                    served.discard(id(run))
                    continue
                windows = np.asarray(run.request_windows, dtype=np.int64)
                requests = list(source.requests(reader, windows, epoch))
                yield ReadUnit(lambda samples, run=run: needed_windows(run, samples), requests)

        units = runs() if first is None else chain([first[0]], runs())

        gate = edge.gate(RUNS_IN_FLIGHT)

        def read(requests: list[Any]) -> Any:
            return edge.read(source, reader, requests, gate)

        ahead = edge.read_ahead(units, read, max(spec.budget(self), 1))
        ahead.fill()

        def arrived() -> Iterator[tuple[Placement, list[Any]]]:
            while (taken := ahead.take()) is not None:
                yield taken

        return assemble(plan, feed, arrived(), start.done)

    def head_stretch(
        self,
        spec: ReadSpec,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any] | None],
        start: Start,
    ) -> Iterator[Any] | None:
        return None  # its regions depend on the workers
