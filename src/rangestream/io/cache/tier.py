"""The cache as a tier of the range reader: hits served from disk, misses fetched and kept.

A reader with a cache asks it for each request first. The misses are coalesced exactly as
the reader coalesces them (same gap, same bound), fetched as those groups (so a cold epoch
makes the same requests as without a cache), and each group is kept as one entry: the
cache holds the coalesced ranges of blocks that reads fetched, not whole objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rangestream.io.cache.byte_cache import ByteCache, is_cacheable_key
from rangestream.io.ranges import ByteRequest, RangeRequest, coalesce
from rangestream.io.stats import IOCounter
from rangestream.io.store import ObjectStore

__all__ = ["CachedReader", "fetch_through_cache"]


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
    #: per range missed: its request index, the pieces the cache had, its holes' indexes
    partial: list[tuple[int, list[tuple[int, bytes]], list[int]]] = []
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
            first = len(holes)
            holes += [RangeRequest(request.key, low, high) for low, high in gaps]
            partial.append((index, pieces, list(range(first, len(holes)))))
        else:
            found = cache.lookup(url, request, counts)
            if found is not None:
                results[index] = found
            else:
                others.append((index, request))
    groups = coalesce(holes, gap=reader.coalesce_gap, max_bytes=reader.max_coalesced_bytes)
    fetched_requests: list[ByteRequest] = [RangeRequest(g.key, g.start, g.end) for g in groups]
    fetched_requests += [r for _, r in others] + [r for _, r in direct]
    if not fetched_requests:
        return results
    fetched = await reader.fetch(fetched_requests, max_concurrency=max_concurrency, cached=False)
    hole_bytes: list[bytes | memoryview] = [b""] * len(holes)
    for group, request, data in zip(groups, fetched_requests, fetched, strict=False):
        cache.store(url, request, data)
        view = memoryview(data)
        for member in group.members:
            hole = holes[member]
            hole_bytes[member] = view[hole.start - group.start : hole.end - group.start]
    for index, pieces, hole_indexes in partial:
        if not pieces and len(hole_indexes) == 1:
            results[index] = hole_bytes[hole_indexes[0]]
            continue
        parts = pieces + [(holes[h].start, hole_bytes[h]) for h in hole_indexes]
        results[index] = _joined(parts)
    rest = fetched[len(groups) :]
    for (index, request), data in zip(others, rest[: len(others)], strict=True):
        cache.store(url, request, data)
        results[index] = data
    for (index, _request), data in zip(direct, rest[len(others) :], strict=True):
        results[index] = data
    return results


def _joined(parts: list[tuple[int, bytes | memoryview]]) -> bytes:
    """Pieces of one range (cached and fetched), in offset order, as one buffer."""
    return b"".join(data for _offset, data in sorted(parts, key=lambda part: part[0]))
