"""LatencyProxy: exact traffic accounting, added latency, and S3-style fault injection.

Raw aiohttp requests use presigned URLs generated through the proxy, so they are signed for the
proxy's host exactly like s3fs requests, and each assertion sees a single HTTP exchange.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import s3fs
from yarl import URL

from testkit import FaultConfig, FaultKind, LatencyProxy, LoggedRequest, S3Endpoint
from testkit.proxy import CONTROL_PREFIX

MIB = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StoredObject:
    path: str  # "bucket/key", as s3fs takes it
    data: bytes


def _fs(storage_options: dict[str, object], **extra: object) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**storage_options, **extra, skip_instance_cache=True)


@pytest.fixture(scope="module")
def stored(s3_server: S3Endpoint, s3_bucket: str) -> StoredObject:
    """One object written directly (not through any proxy), shared by the read tests."""
    path = f"{s3_bucket}/proxy-tests-{uuid.uuid4().hex[:8]}/object.bin"
    data = os.urandom(6 * MIB + 321)
    _fs(s3_server.storage_options).pipe(path, data)
    return StoredObject(path=path, data=data)


@pytest.fixture
def proxy(s3_server: S3Endpoint) -> Iterator[LatencyProxy]:
    with LatencyProxy(s3_server, delay=0.0) as latency_proxy:
        yield latency_proxy


@pytest.fixture
def proxied_fs(proxy: LatencyProxy) -> s3fs.S3FileSystem:
    return _fs(proxy.storage_options)


def _presigned(proxy_fs: s3fs.S3FileSystem, path: str) -> URL:
    # encoded=True: the signature covers the exact query string, so it must not be re-quoted.
    return URL(proxy_fs.url(path, expires=600), encoded=True)


@dataclass(frozen=True)
class RawResult:
    status: int
    content_length: int | None
    body: bytes


async def _raw_get(
    url: URL, *, byte_range: tuple[int, int] | None = None, timeout: float = 30.0
) -> RawResult:
    headers = {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"}
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=client_timeout) as session,
        session.get(url, headers=headers) as response,
    ):
        body = await response.read()
        return RawResult(response.status, response.content_length, body)


def _get(
    url: URL, *, byte_range: tuple[int, int] | None = None, timeout: float = 30.0
) -> RawResult:
    return asyncio.run(_raw_get(url, byte_range=byte_range, timeout=timeout))


# -- forwarding and accounting -------------------------------------------------------------


def test_range_reads_return_exact_bytes_and_are_counted_exactly(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    ranges = [(0, 100), (4 * MIB - 50, 4 * MIB + 50), (len(stored.data) - 7, len(stored.data))]

    for start, end in ranges:
        assert proxied_fs.cat_file(stored.path, start=start, end=end) == stored.data[start:end]

    stats = proxy.stats()
    assert stats.requests == 3
    assert stats.requests_by_method == {"GET": 3}
    assert stats.range_gets == 3
    assert stats.response_bytes == sum(end - start for start, end in ranges)
    assert stats.responses_by_status == {206: 3}
    assert stats.faults == {}


def test_whole_object_get_is_not_counted_as_a_range_get(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    assert proxied_fs.cat_file(stored.path) == stored.data

    stats = proxy.stats()
    assert stats.method("GET") == 1
    assert stats.range_gets == 0
    assert stats.response_bytes == len(stored.data)


def test_head_request_counts_no_body_bytes(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    assert proxied_fs.info(stored.path)["size"] == len(stored.data)

    stats = proxy.stats()
    assert stats.requests_by_method == {"HEAD": 1}
    assert stats.response_bytes == 0


def test_put_list_and_multipart_upload_work_through_the_proxy(
    s3_server: S3Endpoint,
    s3_bucket: str,
    proxy: LatencyProxy,
    proxied_fs: s3fs.S3FileSystem,
) -> None:
    prefix = f"{s3_bucket}/proxy-writes-{uuid.uuid4().hex[:8]}"
    small = b"written through the proxy"
    large = os.urandom(11 * MIB + 5)

    proxied_fs.pipe(f"{prefix}/small", small)
    with proxied_fs.open(f"{prefix}/large", "wb", block_size=5 * MIB) as f:
        for offset in range(0, len(large), 5 * MIB):
            f.write(large[offset : offset + 5 * MIB])
    listing = proxied_fs.ls(prefix, detail=False)

    assert listing == [f"{prefix}/large", f"{prefix}/small"]
    direct = _fs(s3_server.storage_options)
    assert direct.cat(f"{prefix}/small") == small
    assert direct.cat(f"{prefix}/large") == large
    stats = proxy.stats()
    assert stats.method("POST") == 2  # CreateMultipartUpload + CompleteMultipartUpload
    assert stats.method("PUT") >= 2  # the small object + at least one part
    assert stats.method("GET") == 1  # the listing
    assert set(stats.responses_by_status) == {200}


def test_requests_signed_with_a_wrong_secret_are_still_rejected(
    proxy: LatencyProxy, s3_bucket: str
) -> None:
    # The proxy relays the client's Host header so SigV4 verifies upstream; it must not turn
    # into a way around authentication either.
    bad = _fs(proxy.merge_storage_options({**proxy.storage_options, "secret": "wrong"}))
    with pytest.raises(PermissionError):
        bad.ls(s3_bucket)
    assert proxy.stats().responses_by_status == {403: 1}


def test_reset_stats_zeroes_every_counter(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxied_fs.cat_file(stored.path, start=0, end=10)
    assert proxy.stats().requests == 1

    proxy.reset_stats()

    stats = proxy.stats()
    assert (stats.requests, stats.range_gets, stats.response_bytes) == (0, 0, 0)
    assert stats.requests_by_method == {} and stats.responses_by_status == {}
    assert stats.max_in_flight == 0


def test_max_in_flight_equals_the_client_concurrency(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    # Every request is held for 0.5 s, so all six overlap unless the proxy serialised them.
    proxy.delay = 0.5
    url = _presigned(proxied_fs, stored.path)

    async def six_at_once() -> list[RawResult]:
        return list(await asyncio.gather(*(_raw_get(url, byte_range=(i, i)) for i in range(6))))

    results = asyncio.run(six_at_once())

    assert [r.body for r in results] == [stored.data[i : i + 1] for i in range(6)]
    assert proxy.stats().max_in_flight == 6


def test_held_requests_stay_in_flight_until_released(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.hold()

    async def five_held() -> list[RawResult]:
        tasks = [asyncio.ensure_future(_raw_get(url, byte_range=(i, i))) for i in range(5)]
        while proxy.in_flight < 5:
            await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)  # none answered while held
        proxy.release()
        return list(await asyncio.gather(*tasks))

    results = asyncio.run(asyncio.wait_for(five_held(), 60))
    assert [r.body for r in results] == [stored.data[i : i + 1] for i in range(5)]
    assert (proxy.stats().max_in_flight, proxy.in_flight) == (5, 0)


# -- latency -------------------------------------------------------------------------------


def test_delay_is_added_to_every_request(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxy.delay = 0.05
    started = time.perf_counter()
    for i in range(4):
        proxied_fs.cat_file(stored.path, start=i, end=i + 1)
    elapsed = time.perf_counter() - started

    stats = proxy.stats()
    assert stats.requests == 4
    assert stats.delay_seconds == pytest.approx(4 * 0.05)
    assert elapsed >= 4 * 0.05 * 0.9


def test_zero_delay_adds_no_latency_accounting(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxied_fs.cat_file(stored.path, start=0, end=1)
    assert proxy.stats().delay_seconds == 0.0


def test_negative_delay_is_rejected(proxy: LatencyProxy) -> None:
    with pytest.raises(ValueError, match="delay"):
        proxy.delay = -0.001


# -- fault injection -----------------------------------------------------------------------


def test_slowdown_fault_returns_503_with_an_s3_error_body(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.fail_next(FaultKind.SLOWDOWN)

    failed = _get(url, byte_range=(0, 9))
    recovered = _get(url, byte_range=(0, 9))

    assert failed.status == 503
    assert b"<Error><Code>SlowDown</Code>" in failed.body
    assert recovered.status == 206 and recovered.body == stored.data[:10]
    stats = proxy.stats()
    assert stats.faults == {FaultKind.SLOWDOWN: 1}
    assert stats.responses_by_status == {503: 1, 206: 1}
    assert stats.response_bytes == len(failed.body) + 10


def test_internal_error_fault_returns_500_with_an_s3_error_body(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.fail_next(FaultKind.INTERNAL_ERROR)

    failed = _get(url, byte_range=(0, 9))

    assert failed.status == 500
    assert b"<Error><Code>InternalError</Code>" in failed.body
    assert proxy.stats().fault(FaultKind.INTERNAL_ERROR) == 1


def test_access_denied_fault_returns_403_with_an_s3_error_body(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.fail_next(FaultKind.ACCESS_DENIED)

    failed = _get(url, byte_range=(0, 9))

    assert failed.status == 403
    assert b"<Error><Code>AccessDenied</Code>" in failed.body
    assert proxy.stats().fault(FaultKind.ACCESS_DENIED) == 1


def test_reset_fault_drops_the_connection_without_a_response(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    # aiohttp silently retries an idempotent request once after a dropped connection, so two
    # resets are needed before a caller sees one.
    proxy.fail_next(FaultKind.RESET, 2)

    with pytest.raises(aiohttp.ClientConnectionError):
        _get(url, byte_range=(0, 9))

    stats = proxy.stats()
    assert stats.faults == {FaultKind.RESET: 2}
    assert stats.method("GET") == 2
    assert stats.responses_by_status == {}
    assert stats.response_bytes == 0


def test_truncate_fault_announces_the_full_length_but_sends_half(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.fail_next(FaultKind.TRUNCATE)
    length = 1_000_000

    async def read_until_broken() -> tuple[int, int | None, int]:
        received = 0
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Range": f"bytes=0-{length - 1}"}) as response,
        ):
            with pytest.raises(aiohttp.ClientPayloadError):
                while chunk := await response.content.read(64 * 1024):
                    received += len(chunk)
            return response.status, response.content_length, received

    status, announced, received = asyncio.run(read_until_broken())

    assert status == 206
    assert announced == length
    assert received == length // 2
    stats = proxy.stats()
    assert stats.faults == {FaultKind.TRUNCATE: 1}
    assert stats.response_bytes == length // 2


def test_slow_fault_outlasts_a_shorter_client_timeout(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.set_faults(FaultConfig(slow_seconds=3.0))
    proxy.fail_next(FaultKind.SLOW)

    with pytest.raises(TimeoutError):
        _get(url, byte_range=(0, 9), timeout=0.5)
    after = _get(url, byte_range=(0, 9), timeout=10.0)

    assert after.status == 206 and after.body == stored.data[:10]
    assert proxy.stats().faults == {FaultKind.SLOW: 1}


def test_slow_fault_still_delivers_the_response_to_a_patient_client(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.set_faults(FaultConfig(slow_seconds=0.3))
    proxy.fail_next(FaultKind.SLOW)

    started = time.perf_counter()
    result = _get(url, byte_range=(0, 9), timeout=10.0)

    assert result.status == 206 and result.body == stored.data[:10]
    assert time.perf_counter() - started >= 0.3 * 0.9


def test_faults_hit_only_gets_by_default(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject, s3_bucket: str
) -> None:
    proxy.set_faults(FaultConfig(slowdown=1.0))
    url = _presigned(proxied_fs, stored.path)

    proxied_fs.pipe(f"{s3_bucket}/proxy-put-{uuid.uuid4().hex[:8]}", b"unharmed")  # PUT
    assert proxied_fs.info(stored.path)["size"] == len(stored.data)  # HEAD
    assert _get(url, byte_range=(0, 9)).status == 503

    stats = proxy.stats()
    assert stats.faults == {FaultKind.SLOWDOWN: 1}
    assert stats.responses_by_status == {200: 2, 503: 1}


def test_faults_can_be_limited_to_matching_paths(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject, s3_bucket: str
) -> None:
    healthy = f"{s3_bucket}/proxy-healthy-{uuid.uuid4().hex[:8]}"
    proxied_fs.pipe(healthy, b"fine")
    proxy.set_faults(FaultConfig(internal_error=1.0, path_regex=r"/object\.bin$"))

    assert _get(_presigned(proxied_fs, healthy)).body == b"fine"
    assert _get(_presigned(proxied_fs, stored.path), byte_range=(0, 0)).status == 500


def test_fail_next_affects_exactly_the_requested_number_of_requests(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.fail_next(FaultKind.INTERNAL_ERROR, 2)

    statuses = [_get(url, byte_range=(0, 0)).status for _ in range(3)]

    assert statuses == [500, 500, 206]


def test_seeded_random_faults_repeat_the_same_sequence(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)

    def run() -> list[int]:
        proxy.set_faults(FaultConfig(slowdown=0.5, seed=1234))
        return [_get(url, byte_range=(0, 0)).status for _ in range(16)]

    first = run()
    second = run()

    assert first == second
    assert set(first) == {206, 503}  # the rate really produces a mix
    assert proxy.stats().fault(FaultKind.SLOWDOWN) == 2 * first.count(503)


def test_clear_faults_drops_rates_and_pending_faults(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.set_faults(FaultConfig(reset=1.0))
    proxy.fail_next(FaultKind.SLOWDOWN, 3)

    proxy.clear_faults()

    assert _get(url, byte_range=(0, 0)).status == 206
    assert proxy.stats().faults == {}


def test_s3fs_retries_through_a_transient_slowdown(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxy.fail_next(FaultKind.SLOWDOWN)

    assert proxied_fs.cat_file(stored.path, start=10, end=20) == stored.data[10:20]

    stats = proxy.stats()
    assert stats.method("GET") == 2
    assert stats.faults == {FaultKind.SLOWDOWN: 1}


@pytest.mark.parametrize(
    "config",
    [
        {"slowdown": 0.6, "reset": 0.6},
        {"truncate": -0.1},
        {"truncate_fraction": 1.0},
        {"slow_seconds": -1.0},
    ],
)
def test_invalid_fault_configs_are_rejected(config: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FaultConfig(**config)  # type: ignore[arg-type]


def test_unreachable_upstream_is_reported_as_502() -> None:
    with socket.socket() as sock:  # bound but never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
        with LatencyProxy(f"http://127.0.0.1:{dead_port}", delay=0.0) as proxy:
            result = _get(URL(f"{proxy.endpoint_url}/bucket/key"))

    assert result.status == 502
    assert proxy.stats().responses_by_status == {502: 1}
    assert proxy.stats().response_bytes == len(result.body)


def test_upstream_with_a_path_is_refused() -> None:
    # The client signs the path it sends; prefixing it upstream would break every signature.
    with pytest.raises(ValueError, match="path"):
        LatencyProxy("http://127.0.0.1:9000/prefix")


# -- request log -----------------------------------------------------------------------------


def _key(stored: StoredObject) -> str:
    return stored.path.partition("/")[2]


def test_request_log_records_the_key_and_served_bytes_of_each_get_in_order(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    ranges = [(0, 100), (4 * MIB - 50, 4 * MIB + 50), (len(stored.data) - 7, len(stored.data))]
    proxy.start_request_log()

    for start, end in ranges:
        assert proxied_fs.cat_file(stored.path, start=start, end=end) == stored.data[start:end]
    assert _get(_presigned(proxied_fs, stored.path)).body == stored.data  # one whole GET

    log = proxy.take_request_log()
    assert [(e.method, e.bucket, e.key, e.status) for e in log] == [
        ("GET", stored.path.partition("/")[0], _key(stored), 206)
    ] * 3 + [("GET", stored.path.partition("/")[0], _key(stored), 200)]
    assert [e.served for e in log] == [*ranges, None]
    assert [e.body_bytes for e in log] == [end - start for start, end in ranges] + [
        len(stored.data)
    ]
    assert [e.range for e in log[:3]] == [f"bytes={a}-{b - 1}" for a, b in ranges]
    assert log[3].range is None
    assert all(e.arrived <= e.finished for e in log)
    assert [e.arrived for e in log] == sorted(e.arrived for e in log)


def test_request_log_resolves_a_suffix_range_to_absolute_offsets(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.start_request_log()

    async def suffix() -> bytes:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Range": "bytes=-7"}) as response,
        ):
            return await response.read()

    assert asyncio.run(suffix()) == stored.data[-7:]
    (entry,) = proxy.take_request_log()
    assert entry.range == "bytes=-7"
    assert entry.served == (len(stored.data) - 7, len(stored.data))


def test_request_log_is_empty_until_started_and_after_stopped(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxied_fs.cat_file(stored.path, start=0, end=10)
    assert proxy.take_request_log() == []

    proxy.start_request_log()
    proxied_fs.cat_file(stored.path, start=0, end=20)
    (last,) = proxy.stop_request_log()
    proxied_fs.cat_file(stored.path, start=0, end=30)

    assert last.served == (0, 20)
    assert proxy.take_request_log() == []
    assert proxy.stats().requests == 3


def test_request_log_returns_each_request_once_across_takes(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxy.start_request_log()
    proxied_fs.cat_file(stored.path, start=0, end=1)
    first = proxy.take_request_log()
    proxied_fs.cat_file(stored.path, start=1, end=3)
    proxied_fs.cat_file(stored.path, start=3, end=6)
    second = proxy.take_request_log()

    assert [e.served for e in first] == [(0, 1)]
    assert [e.served for e in second] == [(1, 3), (3, 6)]
    assert proxy.take_request_log() == []


def test_request_log_holds_back_a_request_until_its_response_is_sent(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    proxy.delay = 1.0  # holds the request at the proxy while the log is taken
    url = _presigned(proxied_fs, stored.path)
    proxy.start_request_log()

    async def scenario() -> tuple[list[LoggedRequest], list[LoggedRequest]]:
        task = asyncio.ensure_future(_raw_get(url, byte_range=(5, 9)))
        while proxy.stats().requests == 0:
            await asyncio.sleep(0.01)
        during = proxy.take_request_log()
        assert (await task).body == stored.data[5:10]
        return during, proxy.take_request_log()

    during, after = asyncio.run(scenario())

    assert during == []
    assert [e.served for e in after] == [(5, 10)]


def test_a_response_of_headers_alone_is_logged_before_the_client_has_it(
    proxy: LatencyProxy,
    proxied_fs: s3fs.S3FileSystem,
    stored: StoredObject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A HEAD and an empty body end with their headers, which prepare() sends at once. The
    # proxy's thread pausing right after that (a loaded machine) must not leave a client that
    # has its answer without the request in the log.
    empty = f"{stored.path}-empty"
    proxied_fs.pipe(empty, b"")
    prepare = aiohttp.web.StreamResponse.prepare

    async def prepare_then_pause(self: aiohttp.web.StreamResponse, request: Any) -> Any:
        writer = await prepare(self, request)
        await asyncio.sleep(0.5)
        return writer

    monkeypatch.setattr(aiohttp.web.StreamResponse, "prepare", prepare_then_pause)
    proxy.start_request_log()

    assert proxied_fs.info(stored.path)["size"] == len(stored.data)
    head = proxy.take_request_log()
    assert _get(_presigned(proxied_fs, empty)).body == b""
    get = proxy.take_request_log()

    assert [(e.method, e.key, e.body_bytes) for e in head] == [("HEAD", _key(stored), 0)]
    assert [(e.method, e.key, e.status, e.body_bytes) for e in get] == [
        ("GET", f"{_key(stored)}-empty", 200, 0)
    ]


def test_request_log_records_injected_faults_with_their_status(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    url = _presigned(proxied_fs, stored.path)
    proxy.start_request_log()
    proxy.fail_next(FaultKind.SLOWDOWN)
    failed = _get(url, byte_range=(0, 9))
    proxy.fail_next(FaultKind.RESET, 2)
    with pytest.raises(aiohttp.ClientConnectionError):
        _get(url, byte_range=(0, 9))

    log = proxy.take_request_log()

    assert [(e.status, e.served) for e in log] == [(503, None), (None, None), (None, None)]
    assert [e.body_bytes for e in log] == [len(failed.body), 0, 0]


def test_request_log_lists_non_get_requests_with_an_empty_key_for_the_bucket(
    proxy: LatencyProxy, proxied_fs: s3fs.S3FileSystem, stored: StoredObject
) -> None:
    bucket = stored.path.partition("/")[0]
    proxy.start_request_log()

    proxied_fs.info(stored.path)
    proxied_fs.ls(bucket, refresh=True)

    head, listing = proxy.take_request_log()
    assert (head.method, head.key, head.body_bytes) == ("HEAD", _key(stored), 0)
    assert (listing.method, listing.bucket, listing.key) == ("GET", bucket, "")
    assert "list-type=2" in listing.query


# -- control endpoints and process mode ------------------------------------------------------


def _control(endpoint: str, what: str, method: str = "GET") -> dict[str, Any]:
    request = urllib.request.Request(f"{endpoint}{CONTROL_PREFIX}/{what}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_control_endpoints_serve_stats_and_reset_without_counting_themselves(
    s3_server: S3Endpoint, stored: StoredObject
) -> None:
    with LatencyProxy(s3_server, delay=0.0, control_endpoints=True) as proxy:
        fs = _fs(proxy.storage_options)
        assert fs.cat_file(stored.path, start=0, end=100) == stored.data[:100]

        stats = _control(proxy.endpoint_url, "stats")
        assert stats == proxy.stats().to_json()
        assert stats["requests"] == 1
        assert stats["range_gets"] == 1
        assert stats["response_bytes"] == 100
        assert stats["responses_by_status"] == {"206": 1}

        after_reset = _control(proxy.endpoint_url, "reset", method="POST")
        assert after_reset["requests"] == 0
        assert proxy.stats().requests == 0


def test_control_endpoints_start_take_and_stop_the_request_log_without_logging_themselves(
    s3_server: S3Endpoint, stored: StoredObject
) -> None:
    with LatencyProxy(s3_server, delay=0.0, control_endpoints=True) as proxy:
        fs = _fs(proxy.storage_options)
        assert _control(proxy.endpoint_url, "log/start", method="POST") == {"recording": True}
        fs.cat_file(stored.path, start=10, end=60)

        taken = _control(proxy.endpoint_url, "log/take", method="POST")
        fs.cat_file(stored.path, start=0, end=5)
        stopped = _control(proxy.endpoint_url, "log/stop", method="POST")

    assert taken["dropped"] == 0
    (entry,) = [LoggedRequest.from_json(e) for e in taken["requests"]]
    assert (entry.method, entry.key, entry.served, entry.body_bytes) == (
        "GET", _key(stored), (10, 60), 50,
    )  # fmt: skip
    assert [tuple(e["served"]) for e in stopped["requests"]] == [(0, 5)]


def test_control_endpoints_are_forwarded_when_not_enabled(proxy: LatencyProxy) -> None:
    # Off by default: an in-process proxy relays every path exactly as the client sent it.
    result = _get(URL(f"{proxy.endpoint_url}{CONTROL_PREFIX}/stats"))
    assert result.status != 200
    assert proxy.stats().requests == 1


def test_process_mode_prints_its_endpoint_and_serves_counters(
    s3_server: S3Endpoint, stored: StoredObject
) -> None:
    command = [
        sys.executable, "-m", "testkit.proxy", "--upstream",
        s3_server.endpoint_url, "--delay-ms", "30", "--port", "0",
    ]  # fmt: skip
    # run from the repository root, as the benchmark harness does: the kit is not installed
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT
    )
    try:
        assert process.stdout is not None
        endpoint = process.stdout.readline().decode().strip()
        assert endpoint.startswith("http://127.0.0.1:")
        options = dict(s3_server.storage_options)
        options["client_kwargs"] = {**options.get("client_kwargs", {}), "endpoint_url": endpoint}
        options.pop("endpoint_url", None)
        fs = _fs(options)
        started = time.perf_counter()
        assert fs.cat_file(stored.path, start=10, end=60) == stored.data[10:60]
        assert time.perf_counter() - started >= 0.03

        stats = _control(endpoint, "stats")
        assert stats["requests"] == 1
        assert stats["response_bytes"] == 50
        assert stats["delay_seconds"] == pytest.approx(0.03)
        assert _control(endpoint, "reset", method="POST")["requests"] == 0
        assert _control(endpoint, "stats")["requests"] == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr.decode()
    assert b"Warning" not in stderr, stderr.decode()  # e.g. runpy's double-import warning
