"""What the byte cache adds to a cold epoch's fetch calls, apart from the network.

A cold epoch with the cache on makes the requests it makes without one (``cache_epochs``
counts them at the proxy), so what it can add is local work per fetch call: the lookup
(a miss), the claim (byte-range locks on ``claims/LOCKS`` and a listing of the object's
folder), the entry written and renamed (by the cache's writer thread, while the next call runs; the
clock stops once it is done), the claim released, and now and then a slab of budget
reserved under the directory's lock. Timing whole epochs over S3 on a shared
machine leaves that work inside the noise of the network (repeats differ by 2x there);
this measures it apart: the same fetch calls of a reader over an in-memory store, with a
fresh cache and without one, interleaved, so the difference is the cache's own cost per
call, which is then set against what a call costs over S3 (one request at the proxy's
added latency or more).

    PYTHONPATH=src:. python -m benchmarks.cache_overhead [--calls 2000] [--repeats 5] [--dir D]
        [--store-latency-ms 20]   (each read of the store waits that long first)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from rangestream.io.cache.byte_cache import ByteCache
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import RangeRequest
from rangestream.io.stores import open_store

COMMIT = "0123456789abcdef0123456789abcdef"
BLOCK_BYTES = 1 << 20
RUN_BYTES = 64 << 10  # one run of a block shuffle: one coalesced range per fetch call


async def _calls(reader: RangeReader, keys: list[str], calls: int) -> tuple[float, float]:
    """Seconds and CPU seconds (the process's, every thread's) for ``calls`` fetch calls of
    one run-sized range each, every range new."""
    per_block = BLOCK_BYTES // RUN_BYTES
    cpu = time.process_time()
    started = time.perf_counter()
    for i in range(calls):
        key = keys[(i // per_block) % len(keys)]
        start = (i % per_block) * RUN_BYTES
        await reader.fetch([RangeRequest(key, start, start + RUN_BYTES)])
    if reader.cache is not None and hasattr(reader.cache, "drain"):
        reader.cache.drain()  # entries still queued for the writer thread count too
    return time.perf_counter() - started, time.process_time() - cpu


class _Slow:
    """A store whose range reads take ``delay`` seconds more (a request's first byte over
    S3): the cache's writer thread then writes while the next call waits, as in training."""

    def __init__(self, store: Any, delay: float) -> None:
        self._store, self._delay = store, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get_range(self, key: str, start: int, end: int) -> Any:
        await asyncio.sleep(self._delay)
        return await self._store.get_range(key, start, end)


def measure(
    calls: int, repeats: int, where: str | None, delay: float = 0.0
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Seconds per call without and with a (cold) cache, one pair per repeat; then CPU
    seconds per call, likewise (less swayed by other work on a shared machine)."""
    per_block = BLOCK_BYTES // RUN_BYTES
    blocks = -(-calls // per_block)
    plain: list[float] = []
    cached: list[float] = []
    plain_cpu: list[float] = []
    cached_cpu: list[float] = []
    for repeat in range(repeats):
        store = open_store(f"memory://cache-overhead-{os.getpid()}-{repeat}")
        keys = [f"data/{COMMIT}/shards/0/stream/c/{b}/0" for b in range(blocks)]

        async def fill(keys: list[str] = keys, store: object = store) -> None:
            for key in keys:
                await store.put(key, os.urandom(BLOCK_BYTES))  # type: ignore[attr-defined]

        asyncio.run(fill())
        with tempfile.TemporaryDirectory(dir=where) as directory:
            cache = ByteCache(directory, budget=4 * blocks * BLOCK_BYTES)
            order = [False, True] if repeat % 2 == 0 else [True, False]
            for with_cache in order:
                served = _Slow(store, delay) if delay else store
                reader = RangeReader(served, cache=cache if with_cache else None)  # type: ignore[arg-type]
                took, cpu = asyncio.run(_calls(reader, keys, calls))
                (cached if with_cache else plain).append(took / calls)
                (cached_cpu if with_cache else plain_cpu).append(cpu / calls)
    return plain, cached, plain_cpu, cached_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--dir", default=None, help="where the cache lives (the node's disk)")
    parser.add_argument("--store-latency-ms", type=float, default=0.0,
                        help="added to every range read of the store (0: none)")  # fmt: skip
    args = parser.parse_args()
    plain, cached, plain_cpu, cached_cpu = measure(
        args.calls, args.repeats, args.dir, args.store_latency_ms / 1e3
    )
    added = [c - p for p, c in zip(plain, cached, strict=True)]
    median = statistics.median(added)
    where = args.dir or tempfile.gettempdir()
    slow = f" +{args.store_latency_ms:g} ms per read" if args.store_latency_ms else ""
    print(f"fetch call of one {RUN_BYTES >> 10} KiB range, in-memory store{slow}, {args.repeats} "
          f"interleaved repeats of {args.calls} calls, cache in {where}; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"  without cache: {statistics.median(plain) * 1e6:,.0f} us per call")
    print(f"  cold cache:    {statistics.median(cached) * 1e6:,.0f} us per call")
    print(f"  added by the cache: {median * 1e6:,.0f} us per call "
          f"(repeats {min(added) * 1e6:,.0f}-{max(added) * 1e6:,.0f})")  # fmt: skip
    added_cpu = [c - p for p, c in zip(plain_cpu, cached_cpu, strict=True)]
    print(f"  CPU (all threads): {statistics.median(plain_cpu) * 1e6:,.0f} us per call without, "
          f"{statistics.median(cached_cpu) * 1e6:,.0f} us with; added "
          f"{statistics.median(added_cpu) * 1e6:,.0f} us (repeats "
          f"{min(added_cpu) * 1e6:,.0f}-{max(added_cpu) * 1e6:,.0f})")  # fmt: skip
    one_request = args.latency_ms / 1e3
    print(f"  against one S3 request at +{args.latency_ms:g} ms: "
          f"{median / one_request:.1%} of the call's time, at most")  # fmt: skip


if __name__ == "__main__":
    main()
