"""Exact counts of what readers asked the store for: live counters and their snapshots.

Tests assert request and byte counts instead of timings, so every read is counted, and
counted once: a reader owns one :class:`IOCounter`, bumped where a request is made (an
attempt through the range reader) or where a mapped read replaces one. A local window
copied out of a mapped block takes a few microseconds, so the counter is two integers in a
list per array kind, bumped in place; totals are summed only when someone reads them.

Process totals (:func:`process_io_stats`) add up every live counter of the process and the
counts of collected ones; a forked child starts at zero.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from rangestream.io.process import after_fork

__all__ = ["IOCounter", "IOStats", "process_io_stats"]


@dataclass
class IOStats:
    """A snapshot of exact counts.

    ``requests`` counts attempts that reached the store (retries included), ``retries`` the
    attempts that were repeats, ``bytes`` the payload bytes received; ``by_key_kind`` and
    ``bytes_by_key_kind`` split requests and bytes by array (``stream``, ``payload_heap``).
    With a byte cache on, ``cache_hits`` counts requests served from it (``cache_bytes``
    their bytes: they are not in ``requests``), ``cache_misses`` requests it did not hold,
    and ``cache_dropped`` damaged entries deleted (and fetched again).
    """

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    failures: int = 0
    by_key_kind: dict[str, int] = field(default_factory=dict)
    bytes_by_key_kind: dict[str, int] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0
    cache_dropped: int = 0

    @property
    def cache_hit_rate(self) -> float:
        """Hits over cacheable requests (0.0 without a cache)."""
        asked = self.cache_hits + self.cache_misses
        return self.cache_hits / asked if asked else 0.0

    def copy(self) -> IOStats:
        return IOStats(
            self.requests,
            self.bytes,
            self.retries,
            self.failures,
            dict(self.by_key_kind),
            dict(self.bytes_by_key_kind),
            *self._cache_counts(),
        )

    def _cache_counts(self) -> tuple[int, int, int, int]:
        return (self.cache_hits, self.cache_misses, self.cache_bytes, self.cache_dropped)

    def __add__(self, other: IOStats) -> IOStats:
        return IOStats(
            self.requests + other.requests,
            self.bytes + other.bytes,
            self.retries + other.retries,
            self.failures + other.failures,
            _combine(self.by_key_kind, other.by_key_kind, 1),
            _combine(self.bytes_by_key_kind, other.bytes_by_key_kind, 1),
            *(a + b for a, b in zip(self._cache_counts(), other._cache_counts(), strict=True)),
        )

    def __sub__(self, other: IOStats) -> IOStats:
        return IOStats(
            self.requests - other.requests,
            self.bytes - other.bytes,
            self.retries - other.retries,
            self.failures - other.failures,
            _combine(self.by_key_kind, other.by_key_kind, -1),
            _combine(self.bytes_by_key_kind, other.bytes_by_key_kind, -1),
            *(a - b for a, b in zip(self._cache_counts(), other._cache_counts(), strict=True)),
        )


def _combine(mine: dict[str, int], theirs: dict[str, int], sign: int) -> dict[str, int]:
    combined = dict(mine)
    for kind, count in theirs.items():
        combined[kind] = combined.get(kind, 0) + sign * count
    return {kind: count for kind, count in combined.items() if count}


class IOCounter:
    """A reader's live counts: ``[requests, bytes]`` per array kind, plus retries and failures.

    ``of(kind)`` hands out the list itself, so a hot path keeps it and bumps it in place.
    """

    __slots__ = ("__weakref__", "cache", "kinds", "outcomes")

    def __init__(self) -> None:
        self.kinds: dict[str, list[int]] = {}
        self.outcomes = [0, 0]  # retries, failures: a list the finalizer can still read
        self.cache = [0, 0, 0, 0]  # byte cache hits, misses, bytes served, entries dropped
        _live.add(self)
        weakref.finalize(self, _retire, self.kinds, self.outcomes, self.cache).atexit = False

    @property
    def retries(self) -> int:
        return self.outcomes[0]

    @property
    def failures(self) -> int:
        return self.outcomes[1]

    def fail(self) -> None:
        """An attempt that did not return the bytes asked for."""
        self.outcomes[1] += 1

    def of(self, kind: str) -> list[int]:
        """The ``[requests, bytes]`` list of ``kind``, for a caller to bump in place."""
        found = self.kinds.get(kind)
        if found is None:
            found = self.kinds.setdefault(kind, [0, 0])
        return found

    def count(self, kind: str, nbytes: int, *, retry: bool = False) -> None:
        """One request of ``kind`` that returned ``nbytes``."""
        counter = self.kinds.get(kind) or self.of(kind)
        counter[0] += 1
        counter[1] += nbytes
        if retry:
            self.outcomes[0] += 1

    def snapshot(self) -> IOStats:
        return _snapshot(self.kinds, self.outcomes, self.cache)


def _snapshot(kinds: dict[str, list[int]], outcomes: list[int], cache: list[int]) -> IOStats:
    stats = IOStats(retries=outcomes[0], failures=outcomes[1])
    stats.cache_hits, stats.cache_misses, stats.cache_bytes, stats.cache_dropped = cache
    for kind, (requests, nbytes) in list(kinds.items()):
        if requests or nbytes:
            stats.requests += requests
            stats.bytes += nbytes
            stats.by_key_kind[kind] = requests
            stats.bytes_by_key_kind[kind] = nbytes
    return stats


#: Every live counter of the process.
_live: weakref.WeakSet[IOCounter] = weakref.WeakSet()
#: What collected counters had counted.
_retired = IOStats()
#: The process totals when this process was forked from its parent (the parent's counts).
_baseline = IOStats()


def _retire(kinds: dict[str, list[int]], outcomes: list[int], cache: list[int]) -> None:
    global _retired
    _retired = _retired + _snapshot(kinds, outcomes, cache)


def _totals() -> IOStats:
    """The retired counts plus every live counter's, summed in one pass.

    A DataLoader worker's collate function may call :func:`process_io_stats` for every
    batch (``cli/demo.py``, the benchmark's loader rows): adding snapshot by snapshot made
    two :class:`IOStats` and four dicts per live counter, about 100 us a batch with half a
    dozen counters. Counts only grow, so dropping zero entries once at the end leaves what
    adding them one by one left.
    """
    retired = _retired
    requests, nbytes = retired.requests, retired.bytes
    retries, failures = retired.retries, retired.failures
    hits, misses, cached, dropped = retired._cache_counts()
    by_kind = dict(retired.by_key_kind)
    bytes_by_kind = dict(retired.bytes_by_key_kind)
    for counter in list(_live):
        outcomes, cache = counter.outcomes, counter.cache
        retries += outcomes[0]
        failures += outcomes[1]
        hits += cache[0]
        misses += cache[1]
        cached += cache[2]
        dropped += cache[3]
        for kind, (count, size) in list(counter.kinds.items()):
            requests += count
            nbytes += size
            by_kind[kind] = by_kind.get(kind, 0) + count
            bytes_by_kind[kind] = bytes_by_kind.get(kind, 0) + size
    return IOStats(
        requests,
        nbytes,
        retries,
        failures,
        {kind: count for kind, count in by_kind.items() if count},
        {kind: size for kind, size in bytes_by_kind.items() if size},
        hits,
        misses,
        cached,
        dropped,
    )


def process_io_stats() -> IOStats:
    """Every request this process's readers made (a forked child starts at zero).

    DataLoader workers are separate processes: a collate function running in the worker
    can attach this snapshot to its batches to report exact totals to the trainer.
    """
    return _totals() - _baseline


def _start_child_at_zero() -> None:
    global _baseline
    _baseline = _totals()


after_fork(in_child=_start_child_at_zero)
