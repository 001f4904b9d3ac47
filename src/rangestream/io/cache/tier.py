"""The cache as a tier of the range reader: hits served from disk, misses fetched and kept.

A reader with a cache asks it for each request first. The misses are coalesced exactly as
the reader coalesces them (same gap, same bound) and each group is kept as one entry: the
cache holds the coalesced ranges of blocks that reads fetched, not whole objects.

Before fetching, the groups are claimed (``claims``): the parts another process of the
node is fetching right now, or has just kept, are not fetched again but waited for and
read from its entries, so ranks and workers sharing a directory fetch each byte once,
coalesced gap bytes included. Without such a process (one reader, a cold epoch) every
group is claimed whole and the requests are those made without a cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

from rangestream.io.cache.byte_cache import ByteCache, is_cacheable_key
from rangestream.io.cache.claims import CLAIM_SECONDS, ClaimedParts
from rangestream.io.ranges import ByteRequest, RangeRequest, coalesce
from rangestream.io.stats import IOCounter
from rangestream.io.store import ObjectStore

__all__ = ["CachedReader", "fetch_through_cache"]

#: First and longest pause between two looks at another process's claim.
CLAIM_POLL_FIRST = 0.001
CLAIM_POLL_MAX = 0.02


class CachedReader(Protocol):
    """What the tier needs of a range reader (``RangeReader`` is one)."""

    store: ObjectStore
    counter: IOCounter
    cache: ByteCache | None
    coalesce_gap: int
    max_coalesced_bytes: int

    async def fetch(
        self,
        requests: Sequence[ByteRequest],
        *,
        max_concurrency: int | None = None,
        cached: bool = True,
    ) -> list[bytes | memoryview]: ...


async def fetch_through_cache(
    reader: CachedReader, requests: Sequence[ByteRequest], max_concurrency: int | None
) -> list[bytes | memoryview]:
    """``reader.fetch(requests)`` with ``reader.cache`` in front of the store."""
    cache = reader.cache
    assert cache is not None
    url, counts = reader.store.url, reader.counter.cache
    results: list[bytes | memoryview] = [b""] * len(requests)
    #: per range missed: its request index and the pieces the cache had
    partial: list[tuple[int, list[tuple[int, bytes]]]] = []
    holes: list[RangeRequest] = []
    others: list[tuple[int, ByteRequest]] = []
    direct: list[tuple[int, ByteRequest]] = []
    for index, request in enumerate(requests):
        if not is_cacheable_key(request.key):
            direct.append((index, request))
        elif isinstance(request, RangeRequest):
            pieces, gaps = cache.lookup_range(url, request, counts)
            if not gaps:
                results[index] = pieces[0][1] if len(pieces) == 1 else _joined(pieces)
                continue
            holes += [RangeRequest(request.key, low, high) for low, high in gaps]
            partial.append((index, pieces))
        else:
            found = cache.lookup(url, request, counts)
            if found is not None:
                results[index] = found
            else:
                others.append((index, request))
    groups = coalesce(holes, gap=reader.coalesce_gap, max_bytes=reader.max_coalesced_bytes)
    parts = cache.claim(url, [RangeRequest(g.key, g.start, g.end) for g in groups])
    mine = parts.mine
    fetched_requests: list[ByteRequest] = [*mine]
    fetched_requests += [r for _, r in others] + [r for _, r in direct]
    segments = _Segments()
    kept: list[tuple[ByteRequest, bytes | memoryview]] = []
    try:
        if fetched_requests:
            fetched = await reader.fetch(
                fetched_requests, max_concurrency=max_concurrency, cached=False
            )
            for request, data in zip(mine, fetched, strict=False):
                kept.append((request, data))
                segments.add(request, data)
            rest = fetched[len(mine) :]
            for (index, request), data in zip(others, rest[: len(others)], strict=True):
                kept.append((request, data))
                results[index] = data
            for (index, _request), data in zip(direct, rest[len(others) :], strict=True):
                results[index] = data
    except BaseException:
        cache.release(parts)
        raise
    # kept first, released after (``claims``), by the cache's writer thread: the call
    # goes on without waiting for the files
    cache.keep_later(url, kept, parts)
    if parts.theirs:
        await _theirs(reader, cache, parts, segments, max_concurrency)
    for index, pieces in partial:
        request = requests[index]
        assert isinstance(request, RangeRequest)
        at, parts_of = request.start, list(pieces)
        for offset, piece in [*sorted(pieces, key=lambda part: part[0]), (request.end, b"")]:
            if offset > at:  # a hole of this request, fetched or read above
                parts_of.append((at, segments.take(request.key, at, offset)))
            at = max(at, offset + len(piece))
        if len(parts_of) == 1 and not pieces:
            results[index] = parts_of[0][1]
        else:
            results[index] = _joined(parts_of)
    return results


async def _theirs(
    reader: CachedReader,
    cache: ByteCache,
    parts: ClaimedParts,
    segments: _Segments,
    max_concurrency: int | None,
) -> None:
    """Wait for the claims of others, read what they kept; fetch what they did not keep
    (an owner that died, a cache over budget): those bytes at worst twice."""
    url, counts = reader.store.url, reader.counter.cache
    deadline = time.monotonic() + CLAIM_SECONDS
    delay = CLAIM_POLL_FIRST
    for path in parts.awaited:
        while cache.claim_is_live(path) and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(2 * delay, CLAIM_POLL_MAX)
    missing: list[RangeRequest] = []
    for part in parts.theirs:
        pieces, gaps = cache.kept(url, part, counts)
        for offset, piece in pieces:
            segments.add(RangeRequest(part.key, offset, offset + len(piece)), piece)
        missing += [RangeRequest(part.key, low, high) for low, high in gaps]
    if missing:
        fetched = await reader.fetch(missing, max_concurrency=max_concurrency, cached=False)
        for request, data in zip(missing, fetched, strict=True):
            cache.store(url, request, data)
            segments.add(request, data)


class _Segments:
    """Bytes fetched or read for the holes of one call, by object: the holes are cut
    out of them (a hole can span parts fetched here and parts another process kept)."""

    def __init__(self) -> None:
        self._by_key: dict[str, list[tuple[int, int, bytes | memoryview]]] = {}

    def add(self, request: RangeRequest, data: bytes | memoryview) -> None:
        self._by_key.setdefault(request.key, []).append((request.start, request.end, data))

    def take(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``key`` (the segments added cover them)."""
        found = self._by_key[key]
        pieces: list[tuple[int, bytes | memoryview]] = []
        at = start
        while at < end:
            low, high, data = next(s for s in found if s[0] <= at < s[1])
            upto = min(high, end)
            pieces.append((at, memoryview(data)[at - low : upto - low]))
            at = upto
        return pieces[0][1] if len(pieces) == 1 else _joined(pieces)


def _joined(parts: list[tuple[int, bytes | memoryview]]) -> bytes:
    """Pieces of one range (cached and fetched), in offset order, as one buffer."""
    return b"".join(data for _offset, data in sorted(parts, key=lambda part: part[0]))
