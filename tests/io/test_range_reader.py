"""The range reader: exact counts, bounded concurrency, retries, short reads, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rangestream.errors import (
    EndpointUnreachableError,
    MissingObjectError,
    RetriesExhaustedError,
    StorageError,
)
from rangestream.io import ObjectStore, S3Store, request_cap
from rangestream.io.range_reader import RangeReader, set_process_max_concurrency
from rangestream.io.ranges import RangeRequest, SuffixRequest
from rangestream.io.request_cap import DEFAULT_PROCESS_MAX_REQUESTS
from rangestream.io.retry import RetryPolicy

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002, request_timeout=5)
# Requests held at a gate until every call has started: on a loaded machine starting 1,024
# of them took longer than FAST_RETRY's attempt timeout, and each expiry counted as a retry.
HELD_RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002, request_timeout=120)


class ScriptedStore(ObjectStore):
    """An in-memory store whose reads can fail, stall or come back short on demand."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__("fake://bucket/ds")
        self.objects = objects
        self.failures: list[BaseException | Callable[[bytes], bytes]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.calls = 0
        self.gate: asyncio.Event | None = None  # set: requests wait here until it is set

    async def _read(self, data: bytes) -> bytes:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.gate is not None:
                await self.gate.wait()
            if self.failures:
                failure = self.failures.pop(0)
                if isinstance(failure, BaseException):
                    raise failure
                return failure(data)
            return data
        finally:
            self.in_flight -= 1

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if key not in self.objects:
            raise FileNotFoundError(key)
        return await self._read(self.objects[key][start:end])

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        return await self._read(self.objects[key][-nbytes:])

    async def get(self, key: str) -> bytes:
        return await self._read(self.objects[key])

    async def put(self, key: str, data: bytes | memoryview) -> None:
        self.objects[key] = bytes(data)

    async def size(self, key: str) -> int:
        return len(self.objects[key])

    async def exists(self, key: str) -> bool:
        return key in self.objects

    async def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    async def delete_prefix(self, prefix: str) -> None:
        for key in await self.list(prefix):
            del self.objects[key]


def make_store() -> ScriptedStore:
    return ScriptedStore({f"o{i}": bytes(range(256)) * 16 for i in range(8)})


def test_nearby_ranges_of_one_object_cost_one_request_and_exact_bytes() -> None:
    store = make_store()
    reader = RangeReader(store, coalesce_gap=100, retry=FAST_RETRY)
    requests = [RangeRequest("o1", 0, 100), RangeRequest("o1", 150, 300), SuffixRequest("o2", 16)]
    data = asyncio.run(reader.fetch(requests))
    assert [bytes(d) for d in data] == [
        store.objects["o1"][0:100],
        store.objects["o1"][150:300],
        store.objects["o2"][-16:],
    ]
    assert reader.stats.requests == 2
    assert reader.stats.bytes == 300 + 16


def test_requests_in_flight_never_exceed_the_per_call_bound() -> None:
    store = make_store()
    store.delay = 0.01
    reader = RangeReader(store, max_concurrency=3, coalesce_gap=0, retry=FAST_RETRY)
    requests = [RangeRequest(f"o{i}", 0, 10) for i in range(8)]
    asyncio.run(reader.fetch(requests))
    assert store.max_in_flight == 3


def test_the_process_bound_holds_across_concurrent_calls() -> None:
    store = make_store()
    store.delay = 0.01
    set_process_max_concurrency(2)
    try:
        readers = [RangeReader(store, max_concurrency=8, retry=FAST_RETRY) for _ in range(3)]

        async def main() -> None:
            await asyncio.gather(
                *(r.fetch([RangeRequest(f"o{i}", 0, 10) for i in range(8)]) for r in readers)
            )

        asyncio.run(main())
    finally:
        set_process_max_concurrency(DEFAULT_PROCESS_MAX_REQUESTS)
    assert store.max_in_flight == 2


def peak_of_concurrent_calls(calls: int, ranges: int, per_call: int) -> tuple[int, int]:
    """(requests in flight once nothing more can start, most ever in flight) of ``calls``
    concurrent fetches of ``ranges`` separate ranges each, every request held until then."""
    store = ScriptedStore({f"o{i}": bytes(64) for i in range(ranges)})
    reader = RangeReader(store, max_concurrency=per_call, coalesce_gap=0, retry=HELD_RETRY)

    async def main() -> int:
        store.gate = asyncio.Event()
        requests = [RangeRequest(f"o{i}", 0, 8) for i in range(ranges)]
        tasks = [asyncio.ensure_future(reader.fetch(requests)) for _ in range(calls)]
        seen, unchanged = -1, 0
        while unchanged < 50:  # every task has run until it waits: nothing more starts
            await asyncio.sleep(0)
            unchanged = unchanged + 1 if store.in_flight == seen else 0
            seen = store.in_flight
        store.gate.set()
        await asyncio.gather(*tasks)
        return seen

    held = asyncio.run(main())
    assert reader.stats.requests == calls * ranges
    return held, store.max_in_flight


def test_calls_in_flight_times_ranges_per_call_are_admitted_up_to_the_process_cap() -> None:
    set_process_max_concurrency(1024)
    try:
        # 64 document batches of 16 documents: 1,024 wanted, every one of them in flight
        assert peak_of_concurrent_calls(64, 16, 16) == (1024, 1024)
        # the per-call bound still holds: 64 calls of 16 ranges, 4 at a time each
        assert peak_of_concurrent_calls(64, 16, 4) == (256, 256)
        set_process_max_concurrency(100)
        assert peak_of_concurrent_calls(64, 16, 16) == (100, 100)
    finally:
        set_process_max_concurrency(DEFAULT_PROCESS_MAX_REQUESTS)


def test_the_default_process_cap_is_bounded_by_the_descriptors_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = 1024 if soft == resource.RLIM_INFINITY else max(64, min(1024, soft // 2))
    monkeypatch.delenv(request_cap.PROCESS_MAX_REQUESTS_ENV, raising=False)
    assert request_cap._default_cap() == expected
    monkeypatch.setenv(request_cap.PROCESS_MAX_REQUESTS_ENV, "96")
    assert request_cap._default_cap() == 96
    monkeypatch.setenv(request_cap.PROCESS_MAX_REQUESTS_ENV, "zero")
    assert request_cap._default_cap() == expected
    with pytest.raises(ValueError, match="integer >= 1"):
        set_process_max_concurrency(0)


def test_transient_errors_are_retried_and_counted() -> None:
    store = make_store()
    store.failures = [OSError("503 SlowDown"), ConnectionResetError("reset by peer")]
    reader = RangeReader(store, retry=FAST_RETRY)
    (data,) = asyncio.run(reader.fetch([RangeRequest("o0", 10, 20)]))
    assert bytes(data) == store.objects["o0"][10:20]
    assert (reader.stats.requests, reader.stats.retries) == (3, 2)


def test_a_short_body_is_retried_rather_than_returned() -> None:
    store = make_store()
    store.failures = [lambda data: data[:3]]
    reader = RangeReader(store, retry=FAST_RETRY)
    (data,) = asyncio.run(reader.fetch([RangeRequest("o0", 0, 64)]))
    assert bytes(data) == store.objects["o0"][:64]
    assert reader.stats.retries == 1


def test_exhausted_retries_name_the_url_and_the_byte_range() -> None:
    store = make_store()
    store.failures = [OSError("503 SlowDown")] * 10
    reader = RangeReader(store, retry=FAST_RETRY)
    with pytest.raises(RetriesExhaustedError, match=r"fake://bucket/ds/o3 bytes \[5, 9\)"):
        asyncio.run(reader.fetch([RangeRequest("o3", 5, 9)]))
    assert reader.stats.requests == FAST_RETRY.max_attempts


def test_a_permanent_error_is_not_retried() -> None:
    store = make_store()
    store.failures = [PermissionError("AccessDenied")]
    reader = RangeReader(store, retry=FAST_RETRY)
    with pytest.raises(StorageError, match="AccessDenied"):
        asyncio.run(reader.fetch([RangeRequest("o0", 0, 4)]))
    assert reader.stats.requests == 1


def test_a_missing_object_is_reported_as_missing_at_once() -> None:
    reader = RangeReader(make_store(), retry=FAST_RETRY)
    with pytest.raises(MissingObjectError, match="nope"):
        asyncio.run(reader.fetch([RangeRequest("nope", 0, 4)]))


def test_a_stalled_request_times_out_and_is_retried() -> None:
    store = make_store()
    reader = RangeReader(
        store,
        retry=RetryPolicy(max_attempts=2, base_delay=0.001, request_timeout=0.05),
    )

    async def stall(data: bytes) -> bytes:
        await asyncio.sleep(10)
        return data

    original = store._read
    calls = {"n": 0}

    async def first_stalls(data: bytes) -> bytes:
        calls["n"] += 1
        return await (stall(data) if calls["n"] == 1 else original(data))

    store._read = first_stalls  # type: ignore[method-assign]
    (data,) = asyncio.run(reader.fetch([RangeRequest("o0", 0, 8)]))
    assert bytes(data) == store.objects["o0"][:8]
    assert reader.stats.retries == 1


def test_cancelling_a_read_cancels_and_drains_its_requests() -> None:
    store = make_store()
    store.delay = 5.0
    reader = RangeReader(store, coalesce_gap=0, retry=FAST_RETRY)

    async def main() -> None:
        task = asyncio.create_task(reader.fetch([RangeRequest(f"o{i}", 0, 4) for i in range(4)]))
        await asyncio.sleep(0.05)
        assert store.in_flight == 4
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.in_flight == 0

    asyncio.run(main())


def test_an_unreachable_endpoint_fails_with_its_name_after_bounded_retries() -> None:
    store = S3Store(
        "s3://bucket/ds",
        {
            "key": "k",
            "secret": "very-secret-value",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
            "config_kwargs": {"connect_timeout": 0.5, "read_timeout": 0.5},
        },
    )
    policy = RetryPolicy(max_attempts=2, base_delay=0.01, request_timeout=3, total_timeout=10)
    reader = RangeReader(store, retry=policy)

    async def fetch() -> None:
        try:
            await reader.fetch([RangeRequest("x", 0, 1)])
        finally:
            await store.aclose()

    with pytest.raises(EndpointUnreachableError) as caught:
        asyncio.run(fetch())
    message = str(caught.value)
    assert "s3://bucket/ds/x" in message
    assert "127.0.0.1:9" in message
    assert "very-secret-value" not in message


# -- counts bumped in place (mapped reads): in the reader's and the process's stats ------


def _process_totals() -> tuple[int, int, int]:
    from rangestream.io.stats import process_io_stats

    stats = process_io_stats()
    return stats.requests, stats.bytes, stats.by_key_kind.get("mapped-kind", 0)


def test_counts_bumped_in_place_are_in_the_stats_whenever_they_are_read() -> None:
    reader = RangeReader(ScriptedStore({}))
    before = _process_totals()
    counter = reader.counter.of("mapped-kind")
    assert reader.counter.of("mapped-kind") is counter  # one counter per kind
    counter[0] += 2
    counter[1] += 300
    stats = reader.stats
    assert (stats.requests, stats.bytes) == (2, 300)
    assert stats.by_key_kind == {"mapped-kind": 2}
    assert stats.bytes_by_key_kind == {"mapped-kind": 300}
    assert reader.stats.requests == 2  # counted once, not again
    counter[0] += 1
    counter[1] += 5
    after = _process_totals()  # the process's totals include them too
    assert after == (before[0] + 3, before[1] + 305, before[2] + 3)
    assert reader.stats.requests == 3 and reader.stats.bytes == 305


def test_counts_of_a_collected_reader_still_reach_the_process_totals() -> None:
    import gc

    reader = RangeReader(ScriptedStore({}))
    before = _process_totals()
    counter = reader.counter.of("mapped-kind")
    counter[0] += 4
    counter[1] += 40
    del reader, counter
    gc.collect()
    assert _process_totals() == (before[0] + 4, before[1] + 40, before[2] + 4)


def test_process_totals_are_the_sum_of_every_counters_snapshot() -> None:
    """Summed in one pass, the totals equal adding the snapshots one by one: kinds with no
    requests (or no bytes) are left out of that split, cache and retry counts added."""
    import gc

    from rangestream.io.stats import IOCounter, IOStats, process_io_stats

    gc.collect()
    before = process_io_stats()
    counters = [IOCounter() for _ in range(3)]
    counters[0].count("stream", 100)
    counters[0].count("stream", 20, retry=True)
    counters[0].of("never-read")  # a kind with nothing counted
    counters[1].count("payload_heap", 7)
    counters[1].of("stream")[0] += 1  # a request that returned no bytes
    counters[1].fail()
    counters[2].cache[:] = [3, 1, 4096, 1]
    expected = IOStats(
        requests=4,
        bytes=127,
        retries=1,
        failures=1,
        by_key_kind={"stream": 3, "payload_heap": 1},
        bytes_by_key_kind={"stream": 120, "payload_heap": 7},
        cache_hits=3,
        cache_misses=1,
        cache_bytes=4096,
        cache_dropped=1,
    )
    by_snapshots = IOStats()
    for counter in counters:
        by_snapshots = by_snapshots + counter.snapshot()
    assert by_snapshots == expected
    assert process_io_stats() - before == expected


def test_counts_made_before_a_fork_stay_the_parents() -> None:
    import os

    reader = RangeReader(ScriptedStore({}))
    counter = reader.counter.of("mapped-kind")
    counter[0] += 5
    counter[1] += 50
    before = _process_totals()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its process totals start at zero, its own reads count
        try:
            counter[0] += 1
            counter[1] += 1
            os.write(write, repr(_process_totals()).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 1000).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child == repr((1, 1, 1))
    assert _process_totals() == before  # the parent's totals are its own
    assert before[2] >= 5


# -- fetch_distinct: the direct path of a step's ranges in distinct objects -----------------


def test_ranges_of_distinct_objects_cost_the_requests_fetch_makes() -> None:
    requests = [RangeRequest("o3", 10, 400), RangeRequest("o1", 0, 64), RangeRequest("o5", 7, 9)]
    planned, direct = make_store(), make_store()
    planned_reader = RangeReader(planned, retry=FAST_RETRY)
    direct_reader = RangeReader(direct, retry=FAST_RETRY)
    expected = asyncio.run(planned_reader.fetch(requests))
    got = asyncio.run(direct_reader.fetch_distinct(requests))
    assert [bytes(d) for d in got] == [bytes(d) for d in expected]
    assert [bytes(d) for d in got] == [direct.objects[r.key][r.start : r.end] for r in requests]
    assert direct.calls == planned.calls == 3
    assert direct_reader.stats.requests == 3 and direct_reader.stats.bytes == 390 + 64 + 2


def test_ranges_sharing_an_object_or_over_the_bound_keep_the_plan() -> None:
    store = make_store()
    reader = RangeReader(store, coalesce_gap=100, retry=FAST_RETRY)
    same = [RangeRequest("o1", 0, 100), RangeRequest("o1", 150, 300)]
    data = asyncio.run(reader.fetch_distinct(same))
    assert [bytes(d) for d in data] == [store.objects["o1"][0:100], store.objects["o1"][150:300]]
    assert reader.stats.requests == 1  # coalesced, as fetch does
    store.delay = 0.01
    bounded = RangeReader(store, max_concurrency=2, retry=FAST_RETRY)
    asyncio.run(bounded.fetch_distinct([RangeRequest(f"o{i}", 0, 10) for i in range(5)]))
    assert store.max_in_flight == 2 and bounded.stats.requests == 5


def test_a_failed_range_cancels_and_drains_the_others() -> None:
    store = make_store()
    reader = RangeReader(store, retry=FAST_RETRY)
    real = store.get_range

    async def first_fails_later(key: str, start: int, end: int) -> bytes:
        if key == "o0":
            await asyncio.sleep(0.02)
            raise PermissionError("denied")
        store.delay = 5.0  # the others stall until cancelled
        return await real(key, start, end)

    store.get_range = first_fails_later  # type: ignore[method-assign]

    async def main() -> None:
        with pytest.raises(StorageError, match="denied"):
            await reader.fetch_distinct([RangeRequest(f"o{i}", 0, 4) for i in range(4)])
        assert store.calls == 3 and store.in_flight == 0

    asyncio.run(main())
