"""Writing a fetch call's entries off the call: one thread per cache, claims released after.

Why: keeping a range costs its file (creation, the bytes, the rename): about 0.3 to 1.5 ms
on a node's ext4 under load, against a fetch call of 20 ms or more over S3. Written in the
call, that is the cold epoch's added cost; written by a thread while the next call waits on
the network, it is hidden. The claims of the call's ranges are handed over with the bytes
and released by the thread once the entries are in place, so the order every other process
relies on holds ("store, then release": ``claims``): a process that wants those bytes now
waits for the claim and reads the entry, as it would for another process's.

A reader of this process looking up bytes whose entries are still queued waits for them
first, so a range it kept is a hit, as before; entries of other bytes of the same object
are not waited for. Pending bytes are bounded
(``MAX_PENDING_BYTES``): past it, the call writes its entries itself. Before a fork (a
DataLoader worker starting) the queue is drained, so a child never inherits a write half
done; the thread is not a daemon, so the interpreter's exit (a multiprocessing child's too,
whose finalizers registered at fork are cleared) waits for it, and it ends once idle.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import deque
from collections.abc import Sequence
from contextlib import suppress
from typing import Protocol

from rangestream.io.cache.claims import ClaimedParts
from rangestream.io.ranges import ByteRequest, RangeRequest

__all__ = ["IDLE_SECONDS", "MAX_PENDING_BYTES", "EntryWriter", "drain_all"]

#: An end past any object's: a wait for every offset of an object.
_EVERY = 1 << 62
#: Bytes queued for writing at most, per cache; a call past it writes its own entries.
MAX_PENDING_BYTES = 64 << 20


class Keeper(Protocol):
    """What the writer needs of a cache: keep one entry, release a call's claims."""

    def store(self, url: str, request: ByteRequest, data: bytes | memoryview) -> None: ...

    def release(self, parts: ClaimedParts) -> None: ...


#: ``(cache, url, [(request, bytes)], claims to release after)``: one fetch call's entries.
#: The job holds its cache: a cache let go of with entries queued lives until they are kept.
_Job = tuple[Keeper, str, list[tuple[ByteRequest, bytes | memoryview]], ClaimedParts]

#: A writer thread with nothing to write for this long ends.
IDLE_SECONDS = 0.05

#: Every writer of this process, drained before a fork and at exit.
_writers: weakref.WeakSet[EntryWriter] = weakref.WeakSet()


class EntryWriter:
    """Queues a cache's entries and writes them on one daemon thread (``cache.store``, then
    ``cache.release`` of the call's claims)."""

    def __init__(self) -> None:
        self._reset()
        _writers.add(self)

    def _reset(self) -> None:
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._busy = False
        #: keys with entries queued or being written: key -> their byte spans (a suffix or
        #: a whole object spans every offset)
        self._keys: dict[str, list[tuple[int, int]]] = {}
        self._thread: threading.Thread | None = None

    def submit(
        self,
        cache: Keeper,
        url: str,
        entries: Sequence[tuple[ByteRequest, bytes | memoryview]],
        parts: ClaimedParts,
    ) -> None:
        """Keep ``entries`` and then release ``parts``: on the thread, or now if too much
        is queued already."""
        kept = [(r, d if _immutable(d) else bytes(d)) for r, d in entries]
        nbytes = sum(len(d) for _r, d in kept)
        with self._cond:
            if self._pending + nbytes <= MAX_PENDING_BYTES:
                self._jobs.append((cache, url, kept, parts))
                self._pending += nbytes
                for request, _data in kept:
                    self._keys.setdefault(request.key, []).append(_span(request))
                if self._thread is None:
                    # not a daemon: the interpreter's exit (and a multiprocessing child's)
                    # joins it, so queued entries are kept before the process ends
                    self._thread = threading.Thread(
                        target=self._run, name="rangestream-cache-writer", daemon=False
                    )
                    self._thread.start()
                self._cond.notify_all()
                return
        self._write((cache, url, kept, parts))

    def wait_for(self, key: str, start: int = 0, end: int = _EVERY) -> None:
        """Return once no entry of ``key`` over bytes ``[start, end)`` is queued or being
        written.

        Why by span and not by key: a block-shuffled reader's next fetch call is usually
        the next run of the same object; waiting for the entry of the run before it (which
        it does not need) put the writer's file work back on the call's path.
        """
        if key not in self._keys:  # no lock: a dict lookup is atomic; the common case
            return
        with self._cond:
            while any(low < end and high > start for low, high in self._keys.get(key, ())):
                self._cond.wait()

    def drain(self) -> None:
        """Return once every queued entry is written and its claims released (at once on
        the writer's own thread, where the job in hand cannot end first)."""
        if threading.current_thread() is self._thread:
            return
        with self._cond:
            while self._jobs or self._busy:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._cond.wait(IDLE_SECONDS)
                if not self._jobs:  # idle: end (a later job starts a new thread)
                    self._thread = None
                    self._cond.notify_all()
                    return
                job = self._jobs.popleft()
                self._busy = True
            entries = job[2]
            try:
                self._write(job)
            finally:
                job = None  # the cache may go now (a cache let go of is freed here)
                with self._cond:
                    self._busy = False
                    self._pending -= sum(len(d) for _r, d in entries)
                    for request, _data in entries:
                        spans = self._keys.get(request.key, [])
                        with suppress(ValueError):
                            spans.remove(_span(request))
                        if not spans:
                            self._keys.pop(request.key, None)
                    self._cond.notify_all()

    def _write(self, job: _Job) -> None:
        cache, url, entries, parts = job
        try:
            for request, data in entries:
                cache.store(url, request, data)  # OS errors turn the cache off in there
        except Exception as error:  # any: the thread must go on, and release the claims
            warnings.warn(
                f"rangestream: keeping a cache entry failed: {error!r}",
                RuntimeWarning,
                stacklevel=1,
            )
        finally:
            cache.release(parts)

    def reset_after_fork(self) -> None:
        """A forked child starts with an empty queue and no thread (the parent drained)."""
        self._reset()


def _span(request: ByteRequest) -> tuple[int, int]:
    """The bytes of an object an entry holds (all of them for a suffix or an object: its
    offsets are not known before it is fetched)."""
    if isinstance(request, RangeRequest):
        return request.start, request.end
    return 0, _EVERY


def _immutable(data: bytes | memoryview) -> bool:
    """Whether ``data`` cannot change under the thread (a writable buffer is copied)."""
    return isinstance(data, bytes) or (
        isinstance(data, memoryview) and data.readonly and isinstance(data.obj, bytes)
    )


def drain_all() -> None:
    """Drain every writer of this process (before a fork, at exit)."""
    for writer in list(_writers):
        writer.drain()
