"""The ``gs://`` store on gcp-storage-emulator, with a counting proxy in front of it.

What crosses the wire is asserted from the proxy's request log: one ranged GET per range
read (never a whole-object download), uploads with ``ifGenerationMatch`` where a commit
needs a condition, no retries of gcsfs's own (the store's are counted). The emulator
ignores preconditions, so the probe's verdict there is a refusal, tested as such.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from support.cloud import CloudLocation, counting_proxy

from rangestream.errors import RetriesExhaustedError
from rangestream.io.conditional_writes import (
    SINGLE_WRITER_ANY_ENV,
    ConditionalWritesUnsupportedError,
)
from rangestream.io.gcs import GcsStore
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.stores import open_store
from testkit import FaultKind, LatencyProxy

DATA = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture
def proxy(gcs_location: CloudLocation) -> Iterator[LatencyProxy]:
    yield from counting_proxy(gcs_location)


def _store(location: CloudLocation, proxy: LatencyProxy) -> GcsStore:
    store = open_store(location.url, location.options_for(proxy.endpoint_url))
    assert isinstance(store, GcsStore)
    return store


def test_gs_and_gcs_urls_open_the_gcs_store(gcs_location: CloudLocation) -> None:
    assert isinstance(open_store(gcs_location.url, gcs_location.storage_options), GcsStore)
    assert isinstance(open_store("gcs://bucket/x", {"token": "anon"}), GcsStore)


def test_a_range_read_is_one_ranged_get_of_exactly_its_bytes(
    gcs_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = _store(gcs_location, proxy)

    async def run() -> list[bytes]:
        await store.put("blob", DATA)
        proxy.start_request_log()
        return [
            await store.get_range("blob", 100, 1100),
            await store.get_range("blob", 10000, 20000),  # runs past the end
            await store.get_range("blob", 20000, 20010),  # starts past the end
        ]

    got = asyncio.run(run())
    assert got == [DATA[100:1100], DATA[10000:], b""]
    log = proxy.stop_request_log()
    assert [(r.method, r.range, r.body_bytes) for r in log] == [
        ("GET", "bytes=100-1099", 1000),
        ("GET", "bytes=10000-19999", 240),
        ("GET", "bytes=20000-20009", 0),
    ]


def test_a_suffix_costs_a_metadata_get_and_one_range(
    gcs_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = _store(gcs_location, proxy)

    async def run() -> bytes:
        await store.put("blob", DATA)
        proxy.start_request_log()
        return await store.get_suffix("blob", 300)

    assert asyncio.run(run()) == DATA[-300:]
    log = proxy.stop_request_log()
    assert [r.range for r in log] == [None, "bytes=9940-10239"]
    assert log[0].query == "" and "/storage/v1/b/" in log[0].path  # metadata, not media


def test_the_probe_finds_that_the_emulator_ignores_if_generation_match(
    gcs_location: CloudLocation, proxy: LatencyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SINGLE_WRITER_ANY_ENV)
    store = _store(gcs_location, proxy)
    proxy.start_request_log()
    with pytest.raises(ConditionalWritesUnsupportedError) as refused:
        asyncio.run(store.put_if_version("zarr.json", b"{}", None, 100))
    message = str(refused.value)
    assert "accepted a create-only write (ifGenerationMatch) over an existing object" in message
    assert SINGLE_WRITER_ANY_ENV in message
    log = proxy.stop_request_log()
    uploads = [r for r in log if r.method == "POST"]
    # the probe: a create (ifGenerationMatch=0) that must succeed, a second that must fail
    assert [r.query.split("&")[-1] for r in uploads] == ["ifGenerationMatch=0"] * 2
    assert all("_rangestream-probes/" in r.path or r.method != "DELETE" for r in log)
    assert not asyncio.run(store.exists("zarr.json"))  # nothing written behind the refusal
    assert asyncio.run(store.list("")) == []  # nor any probe object left


def test_a_declared_single_writer_commits_with_a_check_then_write(
    gcs_location: CloudLocation, proxy: LatencyProxy
) -> None:
    assert os.environ[SINGLE_WRITER_ANY_ENV] == "1"  # the fixture's declaration
    store = _store(gcs_location, proxy)

    async def run() -> tuple[bytes, str, bytes]:
        await store.put_if_version("root", b"v1", None, 100)
        first, version = await store.get_versioned("root", 100)
        await store.put_if_version("root", b"v2", version, 100)
        second, newer = await store.get_versioned("root", 100)
        assert newer != version  # a new generation
        return first, version, second

    first, _, second = asyncio.run(run())
    assert (first, second) == (b"v1", b"v2")
    from rangestream.errors import ConcurrentWriteError

    with pytest.raises(ConcurrentWriteError):  # the check still sees a stale version
        asyncio.run(store.put_if_version("root", b"v3", "123", 100))


def test_commits_send_the_generation_they_read_where_gcs_honours_it(
    gcs_location: CloudLocation, proxy: LatencyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the documented protocol (the emulator cannot show a refusal): once the
    endpoint is proved, a new root is uploaded with ifGenerationMatch=0 and a replacement
    with the generation that was read, and a 412 is a ``ConcurrentWriteError``."""
    from rangestream.errors import ConcurrentWriteError
    from rangestream.io import conditional_writes

    monkeypatch.delenv(SINGLE_WRITER_ANY_ENV)
    store = _store(gcs_location, proxy)
    monkeypatch.setattr(conditional_writes, "proven", _honoured)

    async def run() -> str:
        await store.put_if_version("root", b"v1", None, 100)
        _, generation = await store.get_versioned("root", 100)
        proxy.start_request_log()
        await store.put_if_version("root", b"v2", generation, 100)
        return generation

    generation = asyncio.run(run())
    (upload,) = [r for r in proxy.stop_request_log() if r.method == "POST"]
    assert upload.query == f"uploadType=multipart&ifGenerationMatch={generation}"
    # the emulator never answers 412: GCS's answer, as gcsfs raises it, is a refusal
    monkeypatch.setattr(store, "_upload", _refused_upload)
    with pytest.raises(ConcurrentWriteError):
        asyncio.run(store.put_if_version("root", b"v3", generation, 100))


async def _honoured(*_args: object) -> None:
    return None


async def _refused_upload(*_args: object) -> str:
    raise FileExistsError("gcsfs raises this for HTTP 412 Precondition Failed")


def test_transient_errors_are_retried_by_the_store_alone(
    gcs_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = RetryingStore(_store(gcs_location, proxy), RetryPolicy(base_delay=0.001))
    asyncio.run(store.put("blob", DATA))
    proxy.reset_stats()
    proxy.fail_next(FaultKind.SLOWDOWN, 2)
    assert asyncio.run(store.get_range("blob", 5, 50)) == DATA[5:50]
    stats = proxy.stats()
    # three attempts, each one request: gcsfs's own retry loop never ran
    assert stats.requests == 3 and stats.responses_by_status == {503: 2, 206: 1}


def test_retries_end_at_the_policy_deadline(
    gcs_location: CloudLocation, proxy: LatencyProxy
) -> None:
    store = RetryingStore(_store(gcs_location, proxy), RetryPolicy(max_attempts=3, base_delay=0))
    asyncio.run(store.put("blob", DATA))
    proxy.reset_stats()
    proxy.fail_next(FaultKind.SLOWDOWN, 5)
    with pytest.raises(RetriesExhaustedError):
        asyncio.run(store.get_range("blob", 0, 10))
    assert proxy.stats().requests == 3


def test_storage_options_go_to_gcsfs_and_never_show(gcs_location: CloudLocation) -> None:
    options = {**gcs_location.storage_options, "project": "secret-project-name"}
    store = open_store(gcs_location.url, options)
    assert "secret" not in repr(store)

    async def run() -> object:
        fs = await store._fs()  # type: ignore[attr-defined]
        return fs.project, type(fs).__module__

    assert asyncio.run(run()) == ("secret-project-name", "gcsfs.core")
