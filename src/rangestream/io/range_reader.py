"""The range-reading core: coalesced, bounded, retried, verified and counted reads.

Readers describe what they need as a *read program*: a generator that yields lists of
byte requests and receives their bytes, then returns its result. The async driver and the
sync driver run the same program, so sync and async readers are one code path that differs
only at the I/O edge (the httpx pattern). Counters are exact, so tests assert request and
byte counts instead of timings.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import threading
import time
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rangestream.errors import (
    EndpointUnreachableError,
    MissingObjectError,
    RangestreamError,
    RetriesExhaustedError,
    StorageError,
    TruncatedObjectError,
)
from rangestream.io.loop import current_pid, run_sync
from rangestream.io.ranges import ByteRequest, RangeRequest, SuffixRequest, coalesce
from rangestream.io.retry import (
    RetryPolicy,
    ShortReadError,
    is_range_not_satisfiable,
    is_transient,
    is_unreachable,
)
from rangestream.io.store import ObjectStore

T = TypeVar("T")

#: A read program: yields batches of requests, receives their bytes in order, returns T.
ReadProgram = Generator[Sequence[ByteRequest], list[bytes], T]

DEFAULT_MAX_CONCURRENCY = 16
DEFAULT_PROCESS_MAX_CONCURRENCY = int(os.environ.get("RANGESTREAM_PROCESS_MAX_REQUESTS", "64"))
DEFAULT_COALESCE_GAP = 64 * 1024
DEFAULT_MAX_COALESCED_BYTES = 16 * 1024 * 1024
#: Complete responses shorter than asked for, per request, before the object is declared
#: truncated. A body cut off in transit raises a transport error (retried as transient);
#: a complete short body means the object itself is short, so one repeat is enough.
SHORT_READ_ATTEMPTS = 2


@dataclass
class IOStats:
    """Exact counts of what a reader asked the store for.

    ``requests`` counts attempts that reached the store (retries included), ``retries`` the
    attempts that were repeats, ``bytes`` the payload bytes received; ``by_key_kind`` and
    ``bytes_by_key_kind`` split requests and bytes by array (``stream``, ``payload_heap``).
    """

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    failures: int = 0
    by_key_kind: dict[str, int] = field(default_factory=dict)
    bytes_by_key_kind: dict[str, int] = field(default_factory=dict)

    def copy(self) -> IOStats:
        return IOStats(
            self.requests,
            self.bytes,
            self.retries,
            self.failures,
            dict(self.by_key_kind),
            dict(self.bytes_by_key_kind),
        )

    def __sub__(self, other: IOStats) -> IOStats:
        return IOStats(
            self.requests - other.requests,
            self.bytes - other.bytes,
            self.retries - other.retries,
            self.failures - other.failures,
            _difference(self.by_key_kind, other.by_key_kind),
            _difference(self.bytes_by_key_kind, other.bytes_by_key_kind),
        )


def _difference(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    changed = {kind: count - before.get(kind, 0) for kind, count in now.items()}
    return {kind: count for kind, count in changed.items() if count}


_process_stats = IOStats()
_process_stats_pid = os.getpid()


def process_io_stats() -> IOStats:
    """A snapshot of every request this process's readers made (reset in forked children).

    DataLoader workers are separate processes: a collate function running in the worker
    can attach this snapshot to its batches to report exact totals to the trainer.
    """
    _fold_all_tallies()
    if _process_stats_pid != current_pid():
        return IOStats()
    return _process_stats.copy()


class MappedTally:
    """Ranges copied out of memory maps, counted but not yet added to the stats.

    Local windows served from mapped blocks run in a few microseconds, and adding each to
    two ``IOStats`` (the reader's and the process's: eight dict and attribute updates per
    range) was a tenth of that. So a hot path bumps ``counts[kind] = [requests, bytes]``
    here, two list items, and the totals are folded into both stats whenever either is
    read (``RangeReader.stats``, ``process_io_stats``), before a fork, and when the reader
    is collected: every reader of the counters sees exact figures.
    """

    __slots__ = ("__weakref__", "counts", "stats")

    def __init__(self, stats: IOStats) -> None:
        self.stats = stats
        self.counts: dict[str, list[int]] = {}

    def of(self, kind: str) -> list[int]:
        """The ``[requests, bytes]`` counter of ``kind``, for a caller to bump in place."""
        found = self.counts.get(kind)
        if found is None:
            found = self.counts[kind] = [0, 0]
        return found

    def fold(self) -> None:
        """Add the pending counts to the reader's and the process's stats, and zero them."""
        global _process_stats, _process_stats_pid
        for kind, counter in list(self.counts.items()):
            requests, nbytes = counter
            if not requests:
                continue
            counter[0] -= requests  # not zeroed: a concurrent bump in between is kept
            counter[1] -= nbytes
            if _process_stats_pid != current_pid():
                _process_stats, _process_stats_pid = IOStats(), current_pid()
            for stats in (self.stats, _process_stats):
                stats.requests += requests
                stats.bytes += nbytes
                stats.by_key_kind[kind] = stats.by_key_kind.get(kind, 0) + requests
                stats.bytes_by_key_kind[kind] = stats.bytes_by_key_kind.get(kind, 0) + nbytes


#: Every live tally of this process, folded before the process's stats are read.
_tallies: weakref.WeakSet[MappedTally] = weakref.WeakSet()


def _fold_all_tallies() -> None:
    for tally in list(_tallies):
        tally.fold()


# a forked child starts its own process totals: what the parent counted stays the parent's
os.register_at_fork(before=_fold_all_tallies)


def _bump_process_stats(key_kind: str, nbytes: int, retry: bool) -> None:
    global _process_stats, _process_stats_pid
    if _process_stats_pid != current_pid():
        _process_stats, _process_stats_pid = IOStats(), current_pid()
    stats = _process_stats
    stats.requests += 1
    stats.bytes += nbytes
    stats.retries += int(retry)
    stats.by_key_kind[key_kind] = stats.by_key_kind.get(key_kind, 0) + 1
    stats.bytes_by_key_kind[key_kind] = stats.bytes_by_key_kind.get(key_kind, 0) + nbytes


_process_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)
_process_slots_pid = os.getpid()
_process_limit = DEFAULT_PROCESS_MAX_CONCURRENCY
_thread_slots: threading.BoundedSemaphore | None = None


def set_process_max_concurrency(limit: int) -> None:
    """Bound the requests in flight across every reader of this process (default 64)."""
    global _process_limit, _thread_slots
    if limit < 1:
        raise ValueError(f"the process request bound must be >= 1, got {limit}")
    _process_limit = limit
    _process_slots.clear()
    _thread_slots = None


def _process_semaphore() -> asyncio.Semaphore:
    global _process_slots_pid
    if _process_slots_pid != os.getpid():
        _process_slots.clear()
        _process_slots_pid = os.getpid()
    loop = asyncio.get_running_loop()
    semaphore = _process_slots.get(loop)
    if semaphore is None:
        semaphore = _process_slots[loop] = asyncio.Semaphore(_process_limit)
    return semaphore


@functools.lru_cache(maxsize=4096)
def _key_kind(key: str) -> str:
    """The array an object belongs to (``stream``, ``payload_heap``...), for the counters."""
    parts = key.split("/")
    if "c" in parts:
        index = len(parts) - 1 - parts[::-1].index("c")
        return parts[index - 1] if index > 0 else key
    return parts[-1]


class RangeReader:
    """Runs read programs against one store with bounded, retried, counted requests.

    Parameters
    ----------
    store
        Where the objects live.
    max_concurrency
        Requests in flight for one call (one window, one ``read_many``). A per-process bound
        (``set_process_max_concurrency``) holds across all calls and readers as well.
    coalesce_gap
        Ranges of the same object closer than this many bytes are fetched as one request.
    max_coalesced_bytes
        Upper bound on the size of one coalesced request.
    retry
        How transient errors are retried.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        coalesce_gap: int = DEFAULT_COALESCE_GAP,
        max_coalesced_bytes: int = DEFAULT_MAX_COALESCED_BYTES,
        retry: RetryPolicy | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.store = store
        self.max_concurrency = max_concurrency
        self.coalesce_gap = coalesce_gap
        self.max_coalesced_bytes = max_coalesced_bytes
        self.retry = retry or RetryPolicy()
        self._stats = IOStats()
        self._tally: MappedTally | None = None
        self._rng = random.Random()

    @property
    def stats(self) -> IOStats:
        """This reader's counters (ranges served from memory maps included)."""
        if self._tally is not None:
            self._tally.fold()
        return self._stats

    @stats.setter
    def stats(self, stats: IOStats) -> None:
        if self._tally is not None:
            self._tally.fold()
            self._tally.stats = stats
        self._stats = stats

    def mapped_tally(self, kind: str) -> list[int]:
        """The ``[requests, bytes]`` counter a mapped-read hot path bumps for ``kind``.

        See ``MappedTally``: bumping it counts one range exactly as ``count_mapped_reads``
        does, without the cost of updating two ``IOStats`` per range.
        """
        tally = self._tally
        if tally is None:
            tally = self._tally = MappedTally(self._stats)
            _tallies.add(tally)
            weakref.finalize(self, tally.fold).atexit = False
        return tally.of(kind)

    # -- counting -------------------------------------------------------------------
    def _count(self, key: str, nbytes: int, *, retry: bool) -> None:
        stats = self._stats
        stats.requests += 1
        stats.bytes += nbytes
        if retry:
            stats.retries += 1
        kind = _key_kind(key)
        stats.by_key_kind[kind] = stats.by_key_kind.get(kind, 0) + 1
        stats.bytes_by_key_kind[kind] = stats.bytes_by_key_kind.get(kind, 0) + nbytes
        _bump_process_stats(kind, nbytes, retry)

    def count_mapped_reads(self, reads: list[tuple[str, int]]) -> None:
        """Count ranges a caller copied out of memory maps as the ``pread`` each replaces.

        ``reads`` holds ``(kind, nbytes)`` per range, ``kind`` being the array name (what
        ``by_key_kind`` is keyed by). Local readers that serve ranges from
        ``rangestream.io.local_map`` instead of the store still report them, so request
        and byte counts mean the same on either path. Written out, not via ``_count``,
        because it runs for every window.
        """
        global _process_stats, _process_stats_pid
        if _process_stats_pid != current_pid():
            _process_stats, _process_stats_pid = IOStats(), current_pid()
        for stats in (self._stats, _process_stats):
            counts, sizes = stats.by_key_kind, stats.bytes_by_key_kind
            for kind, nbytes in reads:
                stats.requests += 1
                stats.bytes += nbytes
                counts[kind] = counts.get(kind, 0) + 1
                sizes[kind] = sizes.get(kind, 0) + nbytes

    # -- one request, async -----------------------------------------------------------
    async def _fetch_one(self, request: ByteRequest, expected: int | None) -> bytes:
        policy = self.retry
        last_error: BaseException | None = None
        short_reads = 0
        for attempt, deadline, delay in policy.attempts(self._rng):
            if delay:
                await asyncio.sleep(delay)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with _process_semaphore():
                    if not self.store.is_connected():
                        # the session is made once per loop, outside the per-request timeout
                        await asyncio.wait_for(self.store.connect(), timeout=remaining)
                        remaining = deadline - time.monotonic()
                    if isinstance(request, RangeRequest):
                        call = self.store.get_range(request.key, request.start, request.end)
                    elif isinstance(request, SuffixRequest):
                        call = self.store.get_suffix(request.key, request.nbytes)
                    elif request.max_nbytes is not None:
                        call = self.store.get_range(request.key, 0, request.max_nbytes + 1)
                    else:
                        call = self.store.get(request.key)
                    if self.store.supports_sync_reads:
                        data = await call  # local files: no network to time out on
                    else:
                        data = await asyncio.wait_for(
                            call, timeout=min(policy.request_timeout, remaining)
                        )
            except FileNotFoundError as error:
                self._count(request.key, 0, retry=attempt > 0)
                self._stats.failures += 1
                raise MissingObjectError(
                    f"object {self.store.describe(request.key)} is missing"
                ) from error
            except RangestreamError:
                raise  # already names what is wrong (an unsafe key, say); no request was made
            except Exception as error:
                self._count(request.key, 0, retry=attempt > 0)
                self._stats.failures += 1
                if is_range_not_satisfiable(error) and expected is not None:
                    data = b""  # the range starts past the object's end: a short read
                elif not is_transient(error):
                    raise StorageError(
                        f"reading {_describe(self.store, request)} failed: {error}"
                    ) from error
                else:
                    last_error = error
                    continue
            else:
                self._count(request.key, len(data), retry=attempt > 0)
                if expected is None or len(data) >= expected:
                    return data
                self._stats.failures += 1
            last_error = ShortReadError(
                f"got {len(data)} of {expected} bytes from {_describe(self.store, request)}"
            )
            short_reads += 1
            if short_reads >= SHORT_READ_ATTEMPTS:
                break
        return self._give_up(request, last_error)

    def _give_up(self, request: ByteRequest, error: BaseException | None) -> bytes:
        where = _describe(self.store, request)
        if error is not None and is_unreachable(error):
            raise EndpointUnreachableError(
                f"cannot reach the object store for {where} after "
                f"{self.retry.max_attempts} attempts: {error}"
            ) from error
        if isinstance(error, ShortReadError):
            raise TruncatedObjectError(
                f"{where}: the object is shorter than the dataset's metadata says "
                f"(truncated?): {error}"
            ) from error
        raise RetriesExhaustedError(
            f"reading {where} failed after retries "
            f"(max_attempts={self.retry.max_attempts}, "
            f"total_timeout={self.retry.total_timeout}s): {error!r}"
        ) from error

    async def fetch(
        self, requests: Sequence[ByteRequest], *, max_concurrency: int | None = None
    ) -> list[bytes]:
        """Bytes of each request, in order; ranges are coalesced, suffixes fetched as is."""
        limit = max_concurrency or self.max_concurrency
        results: list[bytes] = [b""] * len(requests)
        ranges = [(i, r) for i, r in enumerate(requests) if isinstance(r, RangeRequest)]
        suffixes = [(i, r) for i, r in enumerate(requests) if not isinstance(r, RangeRequest)]
        merged = coalesce(
            [r for _, r in ranges], gap=self.coalesce_gap, max_bytes=self.max_coalesced_bytes
        )
        semaphore = asyncio.Semaphore(limit)

        async def run_range(group_index: int) -> None:
            group = merged[group_index]
            async with semaphore:
                data = await self._fetch_one(
                    RangeRequest(group.key, group.start, group.end), group.end - group.start
                )
            view = memoryview(data)
            for member in group.members:
                index, request = ranges[member]
                results[index] = view[request.start - group.start : request.end - group.start]

        async def run_suffix(index: int, request: ByteRequest) -> None:
            async with semaphore:
                results[index] = await self._fetch_one(request, None)

        tasks = [run_range(g) for g in range(len(merged))]
        tasks += [run_suffix(i, r) for i, r in suffixes]
        if len(tasks) == 1:
            await tasks[0]
        elif tasks:
            await _gather_or_cancel(tasks)
        return results

    def fetch_sync(self, requests: Sequence[ByteRequest]) -> list[bytes]:
        """The sync edge: ``pread`` for local stores, the process I/O loop otherwise."""
        if not self.store.supports_sync_reads:
            return run_sync(self.fetch(requests))
        if len(requests) == 1 and isinstance(requests[0], RangeRequest):
            request = requests[0]
            return [self._local_read(request, request.end - request.start)]
        results: list[bytes] = [b""] * len(requests)
        ranges = [(i, r) for i, r in enumerate(requests) if isinstance(r, RangeRequest)]
        merged = coalesce(
            [r for _, r in ranges], gap=self.coalesce_gap, max_bytes=self.max_coalesced_bytes
        )
        for group in merged:
            request = RangeRequest(group.key, group.start, group.end)
            data = self._local_read(request, group.end - group.start)
            view = memoryview(data)
            for member in group.members:
                index, member_request = ranges[member]
                results[index] = view[
                    member_request.start - group.start : member_request.end - group.start
                ]
        for index, request in enumerate(requests):
            if not isinstance(request, RangeRequest):
                results[index] = self._local_read(request, None)
        return results

    def _local_read(self, request: ByteRequest, expected: int | None) -> bytes:
        store = self.store
        try:
            if isinstance(request, RangeRequest):
                data = store.get_range_sync(request.key, request.start, request.end)
            elif isinstance(request, SuffixRequest):
                data = store.get_suffix_sync(request.key, request.nbytes)
            elif request.max_nbytes is not None:
                data = store.get_range_sync(request.key, 0, request.max_nbytes + 1)
            else:
                data = store.get_sync(request.key)
        except FileNotFoundError as error:
            self._count(request.key, 0, retry=False)
            self._stats.failures += 1
            raise MissingObjectError(f"object {store.describe(request.key)} is missing") from error
        except OSError as error:
            self._stats.failures += 1
            raise StorageError(f"reading {_describe(store, request)} failed: {error}") from error
        self._count(request.key, len(data), retry=False)
        if expected is not None and len(data) < expected:
            self._stats.failures += 1
            raise TruncatedObjectError(
                f"{_describe(store, request)}: the object is shorter than the dataset's "
                f"metadata says (truncated?): got {len(data)} of {expected} bytes"
            )
        return data

    # -- programs -----------------------------------------------------------------------
    async def run(self, program: ReadProgram[T], *, max_concurrency: int | None = None) -> T:
        """Drive a read program with async I/O."""
        try:
            requests = next(program)
            while True:
                data = await self.fetch(requests, max_concurrency=max_concurrency)
                requests = program.send(data)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def run_sync(self, program: ReadProgram[T]) -> T:
        """Drive a read program with sync I/O (pread locally, the I/O loop otherwise)."""
        if not self.store.supports_sync_reads:
            return run_sync(self.run(program))
        try:
            requests = next(program)
            while True:
                requests = program.send(self.fetch_sync(requests))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


async def _gather_or_cancel(coroutines: list) -> None:  # type: ignore[type-arg]
    """Run all; on the first failure or on cancellation, cancel and drain the rest."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _describe(store: ObjectStore, request: ByteRequest) -> str:
    if isinstance(request, RangeRequest):
        return f"{store.describe(request.key)} bytes [{request.start}, {request.end})"
    if isinstance(request, SuffixRequest):
        return f"{store.describe(request.key)} last {request.nbytes} bytes"
    return store.describe(request.key)
