"""Requests a cold reader makes through the cache, counted exactly at the store.

Why this is pinned: a cold epoch through the cache made 66 GETs where the same epoch
without it made 54 (``benchmarks/cache_epochs``, 16M tokens, 2 workers, block shuffle).
The proxy's log showed every extra GET to be one coalesced range (a whole 4 MiB block)
cut in two around an inner chunk (8,224 bytes) that an earlier window had already kept:
S3 serves one range per GET, so a range with a kept piece inside cost two GETs. A kept
piece inside a range is now fetched again with it (``claims.bridge_inner``): a cold epoch
makes the GETs it makes without the cache; kept pieces at a range's ends still shorten it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from rangestream.io import RangeReader, RangeRequest, open_store
from rangestream.io.cache import ByteCache

KEY = "data/" + "12" * 16 + "/shards/0/stream/c/0/0"
CONTENT = os.urandom(256 * 1024)
#: Three fetch calls: two small windows, then a run spanning both (one coalesced group).
CALLS = [[(0, 8192)], [(16384, 24576)], [(0, 65536)]]
#: As in the benchmark's log: one inner chunk read by a window, then the whole block.
BLOCK_CALLS = [[(98304, 106528)], [(0, 262144)], [(8192, 16384), (40960, 49152)]]


class LoggingStore:
    """A store that logs every range read it serves, as ``(key, start, end)``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.log: list[tuple[str, int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get_range(self, key: str, start: int, end: int) -> Any:
        self.log.append((key, start, end))
        return await self._store.get_range(key, start, end)


def run(reader: RangeReader, calls: list[list[tuple[int, int]]] = CALLS) -> tuple[int, int]:
    """The requests and bytes of the calls, each answer checked exactly."""
    for call in calls:
        requests = [RangeRequest(KEY, start, end) for start, end in call]
        answers = asyncio.run(reader.fetch(requests))
        for request, data in zip(requests, answers, strict=True):
            assert bytes(data) == CONTENT[request.start : request.end]
    stats = reader.stats
    return stats.requests, stats.bytes


def memory_store(name: str) -> Any:
    store = open_store(f"memory://cache-requests-{name}-{os.getpid()}")
    asyncio.run(store.put(KEY, CONTENT))
    return store


def test_a_range_with_a_kept_piece_inside_is_one_request(tmp_path: Path) -> None:
    store = memory_store("inside")
    assert run(RangeReader(store)) == (3, 8192 + 8192 + 65536)
    # the third call's holes [8192, 16384) and [24576, 65536) coalesce into [8192, 65536):
    # one GET, as without the cache ([0, 8192) kept at its end only shortens it; the kept
    # [16384, 24576) inside it is fetched again)
    assert run(RangeReader(store, cache=ByteCache(tmp_path, 1 << 20))) == (3, 8192 + 8192 + 57344)
    # a second pass is served whole by the cache
    assert run(RangeReader(store, cache=ByteCache(tmp_path, 1 << 20))) == (0, 0)


def test_a_cold_reader_makes_the_requests_it_makes_without_the_cache(tmp_path: Path) -> None:
    plain = LoggingStore(memory_store("plain"))
    run(RangeReader(plain), BLOCK_CALLS)
    cached = LoggingStore(memory_store("cached"))
    cache = ByteCache(tmp_path, 1 << 20)
    reader = RangeReader(cached, cache=cache)
    assert run(reader, BLOCK_CALLS) == (2, 8224 + 262144)
    assert cached.log == plain.log[:2]  # the third call's ranges are hits
    assert plain.log == [(KEY, 98304, 106528), (KEY, 0, 262144), (KEY, 8192, 49152)]
    cache.drain()
    assert reader.counter.cache[:2] == [2, 2]  # hits (the third call), misses (the first two)
