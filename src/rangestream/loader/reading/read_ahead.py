"""The one read-ahead: a bounded, budgeted queue of reads, with a sync edge and an async edge.

Every reading strategy turns its plan into *units*, each one ``read_many`` call's requests
(a stretch of consecutive steps, a run of the block shuffle, the first step's windows), and
hands them to a :class:`ReadAhead`, which issues them in order and returns their samples
in order. How a unit is read is the *edge*'s (the httpx pattern of
``rangestream.layout.executors``, as torchdata's ``_SingleThreadedMapper`` has an inline
and a threaded mode over one queue):

- :class:`AsyncEdge`: over object storage, reads run as tasks of the iteration on the
  process's I/O loop, at most ``budget`` samples requested and not yet taken; the first
  read goes alone (the first batch is what a training loop waits for, and reads of several
  MiB beside it would slow it down), the others follow once it has arrived.
- :class:`SyncEdge`: on local disk, a read is made with the sync reader when its samples
  are asked for (page-cache copies are faster than any read-ahead), one unit at a time.

The budget rule is the strictest of the three loops it replaces: a unit that may be split
(one batch's requests) is read in parts as room frees up, so what is in flight never
exceeds the budget; a unit that may not (a run, a stretch of several batches: one range
request each) waits until it fits whole, and goes alone when nothing else is in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from rangestream.loader.reading.tasks import IterationTasks
    from rangestream.loader.sources.protocol import SampleSource

__all__ = [
    "AsyncEdge",
    "Deferred",
    "Feed",
    "Gate",
    "ReadAhead",
    "ReadEdge",
    "ReadUnit",
    "SyncEdge",
]

T = TypeVar("T")
G = TypeVar("G")
R = TypeVar("R")


class Handle(Protocol):
    """A read's samples, when asked for (a future on the I/O loop, or a deferred read)."""

    def result(self) -> list[Any]: ...


class Deferred:
    """A read made when its result is asked for: the sync edge's handle."""

    def __init__(self, read: Callable[[], list[Any]]) -> None:
        self._read = read

    def result(self) -> list[Any]:
        return self._read()


@dataclass(frozen=True)
class ReadUnit(Generic[T]):
    """One ``read_many`` call's requests, and ``tag``: what the consumer needs to place
    the samples. ``divisible``: may be read in parts (never across two batches)."""

    tag: T
    requests: list[Any]
    divisible: bool = False


class ReadAhead(Generic[T]):
    """Reads of ``units`` issued in order within ``budget`` samples; results taken in order.

    ``budget=None`` reads on demand (the sync edge): a unit is issued whole when the
    previous one has been taken. ``first_alone``: nothing more is issued while the first
    read is pending.
    """

    def __init__(
        self,
        units: Iterator[ReadUnit[T]],
        read: Callable[[list[Any]], Handle],
        *,
        budget: int | None,
        first_alone: bool,
        issued_last: Callable[[], None] | None = None,
        held: bool = False,
    ) -> None:
        self._units = units
        self._issued_last = issued_last
        self._held_back = held  # issue nothing until released (an epoch planned ahead)
        self._read = read
        self._budget = budget
        self._first_waiting = first_alone
        self._held: ReadUnit[T] | None = None
        self._rest: list[Any] = []
        self._pending: deque[tuple[T, int, Handle]] = deque()
        self._in_flight = 0

    def release(self) -> None:
        """Let a read-ahead made ``held`` issue its reads, and issue the first ones."""
        self._held_back = False
        self.fill()

    def fill(self) -> None:
        """Issue the next reads the budget has room for."""
        while not (self._held_back or (self._first_waiting and self._pending)):
            if self._held is None:
                self._held = next(self._units, None)
                if self._held is None:
                    done, self._issued_last = self._issued_last, None
                    if done is not None:
                        done()
                    return
                self._rest = self._held.requests
            count = len(self._rest)
            if self._budget is None:  # on demand: one whole unit, once the last was taken
                if self._pending:
                    return
                take = count
            elif self._held.divisible:  # in parts, never beyond the budget
                room = self._budget - self._in_flight
                if room < 1:
                    return
                take = min(count, room)
            else:  # whole: when it fits, or alone
                if self._pending and self._in_flight + count > self._budget:
                    return
                take = count
            part, self._rest = self._rest[:take], self._rest[take:]
            self._pending.append((self._held.tag, take, self._read(part)))
            self._in_flight += take
            if not self._rest:
                self._held = None

    def take(self) -> tuple[T, list[Any]] | None:
        """The oldest read's tag and samples, waiting for them; ``None`` when all are taken.

        Waiting on the oldest read keeps the order; the others run meanwhile.
        """
        self.fill()
        if not self._pending:
            return None
        tag, count, handle = self._pending.popleft()
        samples = handle.result()
        self._in_flight -= count
        self._first_waiting = False
        self.fill()
        return tag, samples


class Feed(Generic[G, R]):
    """A plan's groups pulled ahead of their use, for their reads to run ahead.

    The consumer takes the groups in order (:meth:`next_group`); the read-ahead takes
    their reads in order (:meth:`reads`), pulling groups as it needs them.
    """

    def __init__(self, groups: Iterator[G], reads_of: Callable[[G], Iterable[R]]) -> None:
        self._groups = groups
        self._reads_of = reads_of
        self._pulled: deque[G] = deque()
        self._reads: deque[R] = deque()

    def _pull(self) -> bool:
        group = next(self._groups, None)
        if group is None:
            return False
        self._pulled.append(group)
        self._reads.extend(self._reads_of(group))
        return True

    def first_group(self) -> G | None:
        """The next group the consumer takes, without taking it."""
        if not self._pulled and not self._pull():
            return None
        return self._pulled[0]

    def waiting_reads(self) -> tuple[R, ...]:
        """The reads of the groups pulled so far not yet handed to the read-ahead (after
        :meth:`first_group` alone: the first group's reads, as :meth:`reads` yields them)."""
        return tuple(self._reads)

    def next_group(self) -> G | None:
        """The next group; ``None`` at the end of the plan."""
        if not self._pulled and not self._pull():
            return None
        return self._pulled.popleft()

    def reads(self) -> Iterator[R]:
        """Every group's reads, in order."""
        while self._reads or self._pull():
            yield self._reads.popleft()


class Gate:
    """Reads in flight at once, at most ``reads``, taken in the order they were issued.

    Why apart from the read-ahead's budget: the budget bounds memory (samples requested
    and not yet taken, e.g. the block shuffle's next buffer), the gate bounds the network
    depth (GETs running). Reads issued within the budget wait here on the I/O loop, so a
    read starts as soon as one ends, whether or not the consumer has taken anything since
    (the read-ahead issues reads only when it is called). ``asyncio.Semaphore`` wakes its
    waiters in order, so reads start in the order they were issued.
    """

    def __init__(self, reads: int) -> None:
        self.reads = max(1, reads)
        self._semaphore: asyncio.Semaphore | None = None  # made on the loop, on first use

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.reads)
        try:
            async with self._semaphore:
                return await coroutine
        finally:
            coroutine.close()  # never awaited if cancelled while waiting: no warning


class ReadEdge(Protocol):
    """How reads are made: the sync edge or the async edge of the read-ahead."""

    #: Whether reads run while the consumer works (reads issued apart overlap).
    overlaps: bool

    def read(
        self, source: SampleSource, reader: Any, requests: list[Any], gate: Gate | None = None
    ) -> Handle:
        """A read of ``requests`` from ``reader`` of ``source``; with ``gate``, it waits for
        a place among the gate's reads in flight."""

    def gate(self, reads: int) -> Gate | None:
        """At most ``reads`` reads made through it in flight at once (``None``: this edge
        makes one read at a time anyway)."""

    def read_ahead(
        self, units: Iterator[ReadUnit[T]], read: Callable[[list[Any]], Handle], budget: int
    ) -> ReadAhead[T]:
        """The read-ahead of ``units`` on this edge (``budget``: samples in flight)."""


class SyncEdge:
    """Reads made with the sync reader when their samples are asked for (local disk)."""

    overlaps = False

    def read(
        self, source: SampleSource, reader: Any, requests: list[Any], gate: Gate | None = None
    ) -> Deferred:
        return Deferred(lambda: source.read_many_sync(reader, requests))

    def gate(self, reads: int) -> Gate | None:
        return None

    def read_ahead(
        self, units: Iterator[ReadUnit[T]], read: Callable[[list[Any]], Handle], budget: int
    ) -> ReadAhead[T]:
        return ReadAhead(units, read, budget=None, first_alone=False)


class AsyncEdge:
    """Reads run as tasks of one iteration on the process's I/O loop (object storage)."""

    overlaps = True

    def __init__(
        self,
        tasks: IterationTasks,
        issued_last: Callable[[], None] | None = None,
        *,
        held: bool = False,
    ) -> None:
        self._tasks = tasks
        #: Called once the (first) read-ahead made on this edge has issued its last read.
        self._issued_last = issued_last
        #: Whether read-aheads made here issue nothing until :meth:`release`.
        self._held = held
        self._made: list[ReadAhead[Any]] = []

    def release(self) -> None:
        """Let the read-aheads made here issue their reads (on the consumer's thread)."""
        self._held = False
        for ahead in self._made:
            ahead.release()

    def read(
        self, source: SampleSource, reader: Any, requests: list[Any], gate: Gate | None = None
    ) -> concurrent.futures.Future[list[Any]]:
        coroutine = source.read_many(reader, requests)
        return self._tasks.submit(coroutine if gate is None else gate.run(coroutine))

    def gate(self, reads: int) -> Gate | None:
        return Gate(reads)

    def read_ahead(
        self, units: Iterator[ReadUnit[T]], read: Callable[[list[Any]], Handle], budget: int
    ) -> ReadAhead[T]:
        done, self._issued_last = self._issued_last, None
        ahead = ReadAhead(
            units, read, budget=budget, first_alone=True, issued_last=done, held=self._held
        )
        self._made.append(ahead)
        return ahead
