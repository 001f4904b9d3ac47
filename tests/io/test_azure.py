"""The ``az://`` / ``abfs://`` store on Azurite, with a counting proxy in front of it.

Azurite honours ``If-None-Match: *`` and ``If-Match: <ETag>``: the probe proves it, and a
stale or racing write is refused as a ``ConcurrentWriteError``. Range reads are one
``Get Blob`` with ``x-ms-range`` each; retries are the store's (the SDK's are off).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cloud import CloudLocation, counting_proxy

from rangestream.errors import ConcurrentWriteError, RetriesExhaustedError
from rangestream.io.azure import AzureStore
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.stores import open_store
from testkit import FaultKind, LatencyProxy

DATA = bytes(range(256)) * 40  # 10240 bytes
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def proxy(azure_location: CloudLocation) -> Iterator[LatencyProxy]:
    yield from counting_proxy(azure_location)


def _store(location: CloudLocation, proxy: LatencyProxy) -> AzureStore:
    store = open_store(location.url, location.options_for(proxy.endpoint_url))
    assert isinstance(store, AzureStore)
    return store


def test_az_abfs_and_abfss_urls_open_the_azure_store(azure_location: CloudLocation) -> None:
    for scheme in ("az", "abfs", "abfss"):
        url = azure_location.url.replace("az://", f"{scheme}://")
        assert isinstance(open_store(url, azure_location.storage_options), AzureStore)


def test_a_range_read_is_one_get_blob_of_exactly_its_bytes(
    azure_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = _store(azure_location, proxy)

    async def run() -> list[bytes]:
        await store.put("blob", DATA)
        proxy.start_request_log()
        return [
            await store.get_range("blob", 100, 1100),
            await store.get_range("blob", 10000, 20000),  # runs past the end
        ]

    assert asyncio.run(run()) == [DATA[100:1100], DATA[10000:]]
    log = proxy.stop_request_log()
    assert [(r.method, r.range, r.served, r.body_bytes) for r in log] == [
        ("GET", "bytes=100-1099", (100, 1100), 1000),
        ("GET", "bytes=10000-19999", (10000, 10240), 240),
    ]
    assert proxy.stats().range_gets == 2


def test_a_range_past_the_end_is_empty(azure_location: CloudLocation) -> None:
    store = open_store(azure_location.url, azure_location.storage_options)

    async def run() -> bytes:
        await store.put("blob", DATA)
        return await store.get_range("blob", 20000, 20010)

    assert asyncio.run(run()) == b""


def test_conditional_writes_are_proved_then_used(
    azure_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = _store(azure_location, proxy)
    proxy.start_request_log()

    async def run() -> None:
        await store.put_if_version("root", b"v1", None, 100)
        _, etag = await store.get_versioned("root", 100)
        with pytest.raises(ConcurrentWriteError):  # it exists now
            await store.put_if_version("root", b"again", None, 100)
        await store.put_if_version("root", b"v2", etag, 100)
        with pytest.raises(ConcurrentWriteError):  # the ETag it was read as is gone
            await store.put_if_version("root", b"v3", etag, 100)
        assert (await store.get_versioned("root", 100))[0] == b"v2"

    asyncio.run(run())
    puts = [(r.path.rsplit("/", 1)[-1][:11], r.status) for r in proxy.stop_request_log()
            if r.method == "PUT"]  # fmt: skip
    # the probe (create, a create and a stale replace refused, a replace), then the root's
    assert puts == [
        ("conditional", 201), ("conditional", 409), ("conditional", 412), ("conditional", 201),
        ("root", 201), ("root", 409), ("root", 201), ("root", 412),
    ]  # fmt: skip
    assert asyncio.run(store.list("")) == ["root"]  # the probe object is gone


def test_transient_errors_are_retried_by_the_store_alone(
    azure_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = RetryingStore(_store(azure_location, proxy), RetryPolicy(base_delay=0.001))
    asyncio.run(store.put("blob", DATA))
    proxy.reset_stats()
    proxy.fail_next(FaultKind.SLOWDOWN, 2)
    assert asyncio.run(store.get_range("blob", 5, 50)) == DATA[5:50]
    stats = proxy.stats()
    # three attempts, one request each: the SDK's retry policy never ran
    assert stats.requests == 3 and stats.responses_by_status == {503: 2, 206: 1}


def test_retries_end_at_the_policy_deadline(
    azure_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = RetryingStore(_store(azure_location, proxy), RetryPolicy(max_attempts=3, base_delay=0))
    asyncio.run(store.put("blob", DATA))
    proxy.reset_stats()
    proxy.fail_next(FaultKind.INTERNAL_ERROR, 5)
    with pytest.raises(RetriesExhaustedError):
        asyncio.run(store.get_range("blob", 0, 10))
    assert proxy.stats().requests == 3


def test_no_client_session_is_left_unclosed_at_exit(azure_location: CloudLocation) -> None:
    """A dataset written and read through the sync API (the I/O loop's clients, closed at
    exit) and through ``asyncio.run`` (closed with that loop) leaves no warning behind."""
    script = textwrap.dedent(
        f"""
        import asyncio, gc
        import numpy as np
        from rangestream import StreamNumpyFormat, StreamStorage
        from rangestream.io.stores import open_store
        url, options = {azure_location.url!r}, {azure_location.storage_options!r}
        storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("t", "<i4")])),
                                storage_options=options)
        with storage.sync_writer() as writer:
            writer.append(0, {{"t": np.arange(100, dtype="<i4")}})
        with storage.sync_reader() as reader:
            assert reader.read(3, 5)["t"].tolist() == [3, 4, 5, 6, 7]
        store = open_store(url, options)
        asyncio.run(store.get_range("zarr.json", 0, 10))
        gc.collect()
        print("done")
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-X", "dev", "-c", script],
        capture_output=True, text=True, timeout=120, cwd=REPOSITORY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert "Unclosed" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_storage_options_go_to_adlfs_and_never_show(azure_location: CloudLocation) -> None:
    store = open_store(azure_location.url, azure_location.storage_options)
    assert "AccountKey" not in repr(store) and "connection" not in repr(store)

    async def run() -> str:
        fs = await store._fs()  # type: ignore[attr-defined]
        return str(fs.service_client.account_name)

    assert asyncio.run(run()) == "devstoreaccount1"
