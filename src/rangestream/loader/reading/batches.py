"""One worker's batches: an explicit value of what to read, one strategy, two drivers.

What an iteration reads and how it hands batches out is a :class:`ReadSpec`: the source,
the batch shape, the prefetch, how to open the source's async reader and how to emit a
batch; where it starts is a :class:`Start`. How an epoch is planned and read is an
:class:`EpochStrategy` (in order, block shuffle, mixed block shuffle:
:mod:`rangestream.loader.reading.strategies`), written once over the read-ahead's edges
(:mod:`rangestream.loader.reading.read_ahead`). Two drivers run a strategy:
:func:`read_sync` with the sync reader (local disk) and :class:`BatchIterator` on the
process's I/O loop (object storage), whose creation already submits the open and the
first reads (in a DataLoader worker ``iter(dataset)`` runs before the worker answers the
loader's start-up handshake, so they overlap that round trip).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.reading.read_ahead import AsyncEdge, ReadEdge, SyncEdge
from rangestream.loader.reading.tasks import IterationTasks

if TYPE_CHECKING:
    import concurrent.futures

    from rangestream.loader.orders.phases import EpochPosition
    from rangestream.loader.sources.protocol import SampleSource

__all__ = [
    "DEFAULT_PREFETCH",
    "BatchIterator",
    "EpochStrategy",
    "ReadSpec",
    "Start",
    "Steps",
    "check_same_count",
    "raise_no_batch",
    "read_sync",
]

DEFAULT_PREFETCH = 64
"""Samples in flight per worker when samples are read one by one (shuffled windows,
documents, temporal windows); it bounds memory: at most ``prefetch`` samples requested and
not yet taken, plus the stretch being handed over. Sequential windows default to two
stretches instead (see :data:`rangestream.loader.reading.sequential.STRETCH_READ_BYTES`)."""

Steps = Iterator[tuple[int, list[Any]]]
"""``(step, samples)`` of a worker's remaining steps, in the order it builds them."""


@dataclass(frozen=True)
class Start:
    """Where one iteration of one worker starts: the position and the worker."""

    epoch: int
    consumed_samples: int
    phases: EpochPosition | None
    worker_id: int
    num_workers: int
    done: int = 0  # steps this worker already built (a per-worker torchdata resume)


@dataclass(frozen=True)
class ReadSpec:
    """What one iteration reads and how it hands batches out (made by the dataset)."""

    source: SampleSource
    batch_size: int
    world_size: int
    rank: int
    drop_last: bool
    collate: Callable[[list[Any]], Any]
    #: Samples in flight per worker as given; ``None``: the strategy's default, chosen
    #: once the epoch is planned (the block shuffle's runs are chosen by planning).
    prefetch: int | None
    #: Whether the consumer re-sorts tagged batches (workers may build stretches).
    tagged: bool
    #: Samples per epoch as counted when the loader was built (``None``: not counted).
    known_samples: int | None
    #: The source's async reader, entered on the I/O loop for ``tasks``.
    open_async: Callable[[IterationTasks], Awaitable[Any]]
    #: What the worker hands the DataLoader for ``(step, collated batch)``.
    emit: Callable[[int, Any], Any]
    #: The reader this process reads with now (its counters feed ``emit``).
    note_reader: Callable[[Any], None]

    def budget(self, strategy: EpochStrategy) -> int:
        """Samples in flight per worker: as given, else ``strategy``'s default now."""
        if self.prefetch is not None:
            return self.prefetch
        return strategy.default_prefetch(self.source, self.batch_size)

    def check_count(self, found: int) -> int:
        """``found`` (a reader's count), if it agrees with what the loader counted."""
        return check_same_count(self.known_samples, found, repr(self.source))


class EpochStrategy(Protocol):
    """How an epoch is planned and read: one of the registry of
    :mod:`rangestream.loader.reading.strategies`, chosen once from the source."""

    #: Whether positions carry the phases of the epoch (the block shuffles do).
    phased: bool

    def default_prefetch(self, source: SampleSource, batch_size: int) -> int:
        """Samples in flight per worker when the options do not say."""

    def choose_parameters(
        self, source: SampleSource, count: Callable[[], int], readers: int
    ) -> None:
        """Fix the order's parameters before its identity is saved (in the loader's
        process; ``count`` counts the epoch's samples, only if needed)."""

    def steps(self, spec: ReadSpec, reader: Any, start: Start, edge: ReadEdge) -> Steps:
        """Plan this worker's reads, issue the first ones, and return its steps."""

    def head_stretch(
        self,
        spec: ReadSpec,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any] | None],
        start: Start,
    ) -> Iterator[Any] | None:
        """The first stretch read in the loader's process, or ``None`` (see
        :meth:`rangestream.loader.BatchIterableDataset.head_stretch`)."""


def read_sync(
    spec: ReadSpec,
    strategy: EpochStrategy,
    context: contextlib.AbstractContextManager[Any],
    start: Start,
) -> Iterator[Any]:
    """The worker's batches read with the sync reader of ``context`` (local disk)."""
    with context as reader:
        spec.note_reader(reader)
        for step, samples in strategy.steps(spec, reader, start, SyncEdge()):
            yield spec.emit(step, spec.collate(samples))


class BatchIterator(Iterator[Any]):
    """The worker's batches read ahead on the I/O loop, started as soon as it is made.

    Its reads are tasks of one iteration (:class:`IterationTasks`): closing it (at its
    end, on an error, or when dropped in the process that made it) cancels and drains
    them; the I/O loop itself carries on. A forked copy closes nothing: the tasks belong
    to the parent's loop.
    """

    def __init__(
        self, spec: ReadSpec, strategy: EpochStrategy, start: Start, *, held: bool = False
    ) -> None:
        self._spec = spec
        #: Planned but issuing no read until its first batch is asked for (an epoch
        #: planned ahead of time, ``epoch_ahead``).
        self._held = held
        self._edge: AsyncEdge | None = None
        self._strategy = strategy
        self.start = start
        self._pid = os.getpid()
        self._closed = False
        # what runs once this iteration has issued its last read (``after_last_read``)
        self._lock = threading.Lock()
        self._then: Callable[[], None] | None = None
        self._issued_all = False
        self.tasks = IterationTasks()
        self._steps: Steps | None = None
        self._started: concurrent.futures.Future[Steps] | None = self.tasks.submit(
            self._open(start)
        )

    async def _open(self, start: Start) -> Steps:
        """Open, plan and send the first reads (on the loop)."""
        reader = await self._spec.open_async(self.tasks)
        edge = self._edge = AsyncEdge(self.tasks, self._issued_last, held=self._held)
        return self._strategy.steps(self._spec, reader, start, edge)

    @property
    def spec(self) -> ReadSpec:
        return self._spec

    def after_last_read(self, then: Callable[[], None]) -> None:
        """Call ``then`` once this iteration has issued its last read (at once if it has):
        a persistent worker starts its next epoch there (``epoch_ahead``)."""
        with self._lock:
            if not self._issued_all:
                self._then = then
                return
        then()

    def _issued_last(self) -> None:
        with self._lock:
            self._issued_all = True
            then, self._then = self._then, None
        if then is not None:
            then()

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            if self._started is not None:
                self._steps = self._started.result()
                self._started = None
                if self._held and self._edge is not None:
                    self._edge.release()  # the first read, now that a batch is wanted
            assert self._steps is not None
            found = next(self._steps, None)
            if found is not None:
                step, samples = found
                return self._spec.emit(step, self._spec.collate(samples))
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Cancel what is in flight and exit the readers (idempotent)."""
        if not self._closed:
            self._closed = True
            self.tasks.close()

    def __del__(self) -> None:
        if os.getpid() == getattr(self, "_pid", None):
            with contextlib.suppress(Exception):
                self.close()


def raise_no_batch(spec: ReadSpec, num_samples: int) -> None:
    """A whole epoch without one batch would end every training loop at once, silently."""
    raise LoaderConfigError(
        f"{spec.source!r}: an epoch of {num_samples} samples makes no batch of "
        f"batch_size {spec.batch_size} x world_size {spec.world_size} = "
        f"{spec.batch_size * spec.world_size} samples (drop_last={spec.drop_last}); "
        + (
            "the dataset has no sample (is sequence_length longer than the data?)"
            if num_samples == 0
            else "lower batch_size or world_size, or pass drop_last=False"
        )
    )


def check_same_count(known: int | None, found: int, owner: str) -> int:
    """``found``, if it agrees with the count made when the loader was built."""
    if known is not None and known != found:
        raise StateError(
            f"{owner} counted {known} samples when created but the reader in process "
            f"{os.getpid()} has {found}; the dataset changed underneath the loader"
        )
    return found
