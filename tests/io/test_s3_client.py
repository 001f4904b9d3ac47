"""The lean S3 read path: same bytes and same errors as s3fs, one GET per read, fork/loop safe.

Objects are written with a plain botocore client (not through the code under test) and the
expected bytes are slices of the numpy array that was written.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rangestream.errors import (
    MissingObjectError,
    RetriesExhaustedError,
    StorageError,
    TruncatedObjectError,
)
from rangestream.io import (
    RangeReader,
    RangeRequest,
    RetryPolicy,
    S3Store,
    SuffixRequest,
    request_cap,
)
from rangestream.io.process import run_blocking as run_sync
from rangestream.io.retry import is_transient
from rangestream.io.s3 import _LeanReads
from rangestream.io.s3_client import S3ReadClient, S3RequestError, S3TransientError, _error
from rangestream.io.s3_options import READS_ENV, lean_read_config
from testkit import FaultKind, LatencyProxy, S3Endpoint

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core

SIZE = 100_003
# Short backoff; the attempt timeout is the default: on a loaded machine a 5 s timeout of a
# slow first request counted as a retry, and these tests count requests and retries exactly.
FAST = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def content() -> bytes:
    return np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def prefix(s3_server: S3Endpoint, s3_bucket: str, content: bytes) -> str:
    """``s3://bucket/<prefix>`` holding ``blob`` (SIZE random bytes) and ``empty``."""
    name = f"s3-reads-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key=f"{name}/blob", Body=content)
    client.put_object(Bucket=s3_bucket, Key=f"{name}/empty", Body=b"")
    client.put_object(Bucket=s3_bucket, Key=f"{name}/dir/inner", Body=b"x")
    return f"s3://{s3_bucket}/{name}"


@pytest.fixture(params=["lean", "s3fs"])
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The same behaviour through the lean client and through s3fs (the opt-out)."""
    if request.param == "s3fs":
        monkeypatch.setenv(READS_ENV, "s3fs")
    else:
        monkeypatch.delenv(READS_ENV, raising=False)
    return str(request.param)


def make_store(url: str, options: dict[str, Any], reads: str) -> S3Store:
    store = S3Store(url, options)
    assert isinstance(store._reads, _LeanReads) == (reads == "lean")
    return store


def run(store: S3Store, coroutine: Any) -> Any:
    async def main() -> Any:
        try:
            return await coroutine
        finally:
            await store.aclose()

    return asyncio.run(main())


# -- bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, 1), (10, 4096), (SIZE - 5, SIZE), (SIZE - 5, SIZE + 100), (0, SIZE)],
)
def test_a_range_read_returns_the_stored_bytes_clamped_to_the_object(
    prefix: str, s3_server: S3Endpoint, content: bytes, reads: str, start: int, end: int
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)
    assert run(store, store.get_range("blob", start, end)) == content[start:end]


def test_a_range_past_the_end_reads_as_empty(prefix: str, s3_server: S3Endpoint) -> None:
    store = make_store(prefix, s3_server.storage_options, "lean")
    assert run(store, store.get_range("blob", SIZE, SIZE + 10)) == b""
    assert run(store, store.get_range("blob", SIZE + 50, SIZE + 60)) == b""


def test_the_reader_counts_a_range_past_the_end_as_a_truncated_object(
    prefix: str, s3_server: S3Endpoint, reads: str
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)
    reader = RangeReader(store, retry=FAST)
    with pytest.raises(TruncatedObjectError, match="shorter than"):
        run(store, reader.fetch([RangeRequest("blob", SIZE + 50, SIZE + 60)]))


@pytest.mark.parametrize("nbytes", [1, 1000, SIZE, SIZE + 7])
def test_a_suffix_read_returns_the_last_bytes(
    prefix: str, s3_server: S3Endpoint, content: bytes, reads: str, nbytes: int
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)
    assert run(store, store.get_suffix("blob", nbytes)) == content[-nbytes:]


def test_whole_gets_sizes_and_existence_match_the_stored_objects(
    prefix: str, s3_server: S3Endpoint, content: bytes, reads: str
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)

    async def main() -> tuple[Any, ...]:
        return (
            await store.get("blob"),
            await store.get("empty"),
            await store.size("blob"),
            await store.size("empty"),
            await store.exists("blob"),
            await store.exists("missing"),
            await store.exists("dir"),  # a prefix with objects under it, as s3fs says
        )

    assert run(store, main()) == (content, b"", SIZE, 0, True, False, True)


def test_reads_through_the_lean_client_cost_one_get_each(
    prefix: str, s3_proxy: LatencyProxy, content: bytes
) -> None:
    store = make_store(prefix, s3_proxy.storage_options, "lean")
    reader = RangeReader(store, coalesce_gap=0, retry=FAST)
    requests = [
        RangeRequest("blob", 0, 10),
        RangeRequest("blob", 5000, 9000),
        SuffixRequest("blob", 64),
    ]
    data = run(store, reader.fetch(requests))
    assert [bytes(d) for d in data] == [content[:10], content[5000:9000], content[-64:]]
    stats = s3_proxy.stats()
    assert stats.requests == stats.method("GET") == stats.range_gets == 3
    assert reader.stats.requests == 3 and reader.stats.retries == 0


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["get_range", "get_suffix", "get", "size"])
def test_a_missing_key_raises_file_not_found(
    prefix: str, s3_server: S3Endpoint, reads: str, call: str
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)
    args = {"get_range": (0, 10), "get_suffix": (10,), "get": (), "size": ()}[call]
    with pytest.raises(FileNotFoundError):
        run(store, getattr(store, call)("no-such-key", *args))


def test_a_missing_key_becomes_missing_object_in_the_reader(
    prefix: str, s3_server: S3Endpoint, reads: str
) -> None:
    store = make_store(prefix, s3_server.storage_options, reads)
    reader = RangeReader(store, retry=FAST)
    with pytest.raises(MissingObjectError, match="no-such-key"):
        run(store, reader.fetch([RangeRequest("no-such-key", 0, 10)]))
    assert reader.stats.requests == 1 and reader.stats.retries == 0


@pytest.mark.s3_limit("moto", "moto server does not check signatures: any key is accepted")
def test_wrong_credentials_raise_permission_error_without_retries(
    prefix: str, s3_server: S3Endpoint, reads: str
) -> None:
    options = {**s3_server.storage_options, "secret": "not-the-secret"}
    store = make_store(prefix, options, reads)
    with pytest.raises(PermissionError):
        run(store, store.get_range("blob", 0, 10))
    reader = RangeReader(store, retry=FAST)
    with pytest.raises(StorageError) as caught:
        run(store, reader.fetch([RangeRequest("blob", 0, 10)]))
    assert isinstance(caught.value.__cause__, PermissionError)
    assert reader.stats.requests == 1


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (404, b"<Error><Code>NoSuchKey</Code></Error>", FileNotFoundError),
        (404, b"<Error><Code>NoSuchBucket</Code></Error>", FileNotFoundError),
        (403, b"<Error><Code>AccessDenied</Code></Error>", PermissionError),
        (503, b"<Error><Code>SlowDown</Code></Error>", S3TransientError),
        (500, b"<Error><Code>InternalError</Code></Error>", S3TransientError),
        (502, b"bad gateway", S3TransientError),
        (504, b"", S3TransientError),
        (400, b"<Error><Code>RequestTimeout</Code></Error>", S3TransientError),
        (400, b"<Error><Code>InvalidArgument</Code></Error>", S3RequestError),
    ],
)
def test_error_answers_map_to_the_errors_the_retry_policy_expects(
    status: int, body: bytes, kind: type[BaseException]
) -> None:
    error = _error(status, body, "s3://b/k")
    assert type(error) is kind
    assert "s3://b/k" in str(error)
    assert is_transient(error) == (kind is S3TransientError)


@pytest.mark.parametrize(
    ("kind", "count"),
    [
        (FaultKind.SLOWDOWN, 2),
        (FaultKind.INTERNAL_ERROR, 2),
        (FaultKind.RESET, 3),
        (FaultKind.TRUNCATE, 2),
    ],
)
def test_injected_faults_are_retried_and_counted(
    prefix: str, s3_proxy: LatencyProxy, content: bytes, kind: FaultKind, count: int
) -> None:
    store = make_store(prefix, s3_proxy.storage_options, "lean")
    reader = RangeReader(store, retry=FAST)

    async def main() -> bytes:
        await store.connect()
        assert bytes((await reader.fetch([RangeRequest("blob", 0, 10)]))[0]) == content[:10]
        s3_proxy.reset_stats()
        s3_proxy.fail_next(kind, count)
        (data,) = await reader.fetch([RangeRequest("blob", 100, 60_100)])
        return bytes(data)

    before = reader.stats.copy()
    assert run(store, main()) == content[100:60_100]
    spent = reader.stats - before
    stats = s3_proxy.stats()
    assert stats.fault(kind) == count
    # aiohttp itself repeats a GET once when a reused connection is reset
    unseen = stats.method("GET") - (spent.requests - 1)
    assert spent.retries == count - unseen >= 1


def test_retries_run_out_on_endless_throttling(prefix: str, s3_proxy: LatencyProxy) -> None:
    store = make_store(prefix, s3_proxy.storage_options, "lean")
    policy = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02, request_timeout=2)
    reader = RangeReader(store, retry=policy)
    s3_proxy.fail_next(FaultKind.SLOWDOWN, 100)
    with pytest.raises(RetriesExhaustedError, match="SlowDown"):
        run(store, reader.fetch([RangeRequest("blob", 0, 10)]))
    assert reader.stats.requests == 3 and reader.stats.retries == 2


# -- configuration -------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_options_in_the_s3fs_shape_configure_the_lean_client(clean_env: Any) -> None:
    config = lean_read_config(
        {
            "key": "k",
            "secret": "s",
            "token": "t",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:1/", "region_name": "eu-west-3"},
            "config_kwargs": {"max_pool_connections": 64, "connect_timeout": 1, "read_timeout": 2},
            "skip_instance_cache": True,
        }
    )
    assert config is not None
    assert (config.endpoint_url, config.region, config.key, config.secret, config.token) == (
        "http://127.0.0.1:1", "eu-west-3", "k", "s", "t"
    )  # fmt: skip
    assert (config.max_connections, config.connect_timeout, config.read_timeout) == (64, 1, 2)


def test_the_connection_pool_is_sized_to_the_process_request_cap(clean_env: Any) -> None:
    """A pool smaller than the process cap would be a second, hidden cap on requests."""
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}
    store = S3Store("s3://bucket/ds", options)
    assert isinstance(store._reads, _LeanReads)
    assert store._reads.config.max_connections == request_cap.process_max_requests()
    assert store._options()["config_kwargs"]["max_pool_connections"] == (
        request_cap.process_max_requests()
    )  # botocore's pool too (writes, and s3fs reads)
    request_cap.set_process_max_concurrency(300)
    try:
        config = lean_read_config(S3Store("s3://bucket/ds", options)._options())
        assert config is not None and config.max_connections == 300

        async def limit() -> int:
            client = S3ReadClient(config)
            try:
                return int(client._session.connector.limit)
            finally:
                await client.aclose()

        assert asyncio.run(limit()) == 300
    finally:
        request_cap.set_process_max_concurrency(request_cap.DEFAULT_PROCESS_MAX_REQUESTS)
    given = {**options, "config_kwargs": {"max_pool_connections": 8}}
    assert S3Store("s3://bucket/ds", given)._reads.config.max_connections == 8


def test_boto_style_credentials_and_environment_defaults_are_understood(clean_env: Any) -> None:
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "https://minio.example:9000")
    clean_env.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    config = lean_read_config(
        {"client_kwargs": {"aws_access_key_id": "k", "aws_secret_access_key": "s"}}
    )
    assert config is not None
    assert (config.endpoint_url, config.region, config.key, config.secret) == (
        "https://minio.example:9000", "ap-south-1", "k", "s"
    )  # fmt: skip


def test_without_an_endpoint_the_client_addresses_aws(clean_env: Any) -> None:
    config = lean_read_config({})
    assert config is not None and config.endpoint_url is None and config.region == "us-east-1"
    assert config.key is None and not config.anon  # credentials come from the chain later


def test_anon_means_unsigned_and_ignores_keys(clean_env: Any) -> None:
    config = lean_read_config({"anon": True, "key": "k", "secret": "s"})
    assert config is not None and config.anon and config.key is None and config.secret is None


@pytest.mark.parametrize(
    "options",
    [
        {"requester_pays": True},
        {"s3_additional_kwargs": {"SSECustomerKey": "x", "SSECustomerAlgorithm": "AES256"}},
        {"profile": "prod"},
        {"session": object()},
        {"version_aware": True},
        {"use_ssl": False},
        {"key": "k"},  # half a key pair
        {"config_kwargs": {"signature_version": "s3"}},
        {"config_kwargs": {"s3": {"use_accelerate_endpoint": True}}},
        {"client_kwargs": {"verify": False}},
        {"endpoint_url": "http://a:1", "client_kwargs": {"endpoint_url": "http://b:2"}},
        {"something_new": 1},
    ],
)
def test_options_the_lean_client_does_not_reproduce_keep_reads_on_s3fs(
    options: dict[str, Any],
) -> None:
    assert lean_read_config(options) is None
    store = S3Store("s3://bucket/ds", options)
    assert not isinstance(store._reads, _LeanReads)


def test_the_environment_switch_keeps_reads_on_s3fs(monkeypatch: pytest.MonkeyPatch) -> None:
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://a:1"}}
    assert isinstance(S3Store("s3://bucket/ds", options)._reads, _LeanReads)
    monkeypatch.setenv(READS_ENV, "s3fs")
    assert not isinstance(S3Store("s3://bucket/ds", options)._reads, _LeanReads)


def test_credentials_come_from_the_environment_when_options_have_none(
    prefix: str, s3_server: S3Endpoint, content: bytes, clean_env: Any
) -> None:
    clean_env.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    clean_env.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    store = make_store(prefix, {}, "lean")
    assert run(store, store.get_range("blob", 3, 9)) == content[3:9]


def test_reads_import_neither_s3fs_nor_aiobotocore(prefix: str, s3_server: S3Endpoint) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from rangestream.io import open_store
        from rangestream.io.process import run_blocking as run_sync
        store = open_store({prefix!r}, {s3_server.storage_options!r})
        assert len(run_sync(store.get_range("blob", 0, 100))) == 100
        print(sorted(m for m in ("s3fs", "aiobotocore", "fsspec") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- processes and loops -------------------------------------------------------------------


def _read_in_child(store: S3Store, queue: Any) -> None:
    try:
        queue.put(run_sync(store.get_range("blob", 1000, 1100)))
    except BaseException as error:  # report instead of hanging the parent
        queue.put(repr(error))


def test_a_forked_child_reads_through_a_store_the_parent_used(
    prefix: str, s3_server: S3Endpoint, content: bytes
) -> None:
    store = make_store(prefix, s3_server.storage_options, "lean")
    assert run_sync(store.get_range("blob", 0, 100)) == content[:100]  # the parent's session
    parent_client = run_sync(store._reads.client())
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, queue))
    child.start()
    assert queue.get(timeout=60) == content[1000:1100]
    child.join(30)
    assert child.exitcode == 0
    # the parent's pooled connections survived the child (no epoll entries were removed)
    for start in range(0, 5000, 500):
        assert run_sync(store.get_range("blob", start, start + 10)) == content[start : start + 10]
    assert run_sync(store._reads.client()) is parent_client


def test_each_loop_gets_its_own_session_closed_when_the_loop_ends(
    prefix: str, s3_server: S3Endpoint, content: bytes
) -> None:
    store = make_store(prefix, s3_server.storage_options, "lean")
    clients: list[S3ReadClient] = []

    async def main() -> bytes:
        data = await store.get_range("blob", 7, 70)
        clients.append(await store._reads.client())
        return data

    assert asyncio.run(main()) == content[7:70]
    assert asyncio.run(main()) == content[7:70]
    assert clients[0] is not clients[1]
    assert clients[0].closed and clients[1].closed


def test_stores_with_the_same_options_share_one_session(prefix: str, s3_server: S3Endpoint) -> None:
    first = make_store(prefix, s3_server.storage_options, "lean")
    second = make_store(prefix, s3_server.storage_options, "lean")

    async def main() -> bool:
        return await first._reads.client() is await second._reads.client()

    assert asyncio.run(main())


@pytest.fixture
def writes_store(s3_url: Any) -> Iterator[S3Store]:
    yield make_store(s3_url.url, s3_url.storage_options, "lean")


def test_writes_still_go_through_s3fs_and_reads_see_them(writes_store: S3Store) -> None:
    store = writes_store

    async def main() -> tuple[bytes, list[str], bool]:
        await store.connect(writes=True)
        assert store.is_connected(writes=True)
        await store.put("a/b", b"hello")
        data = await store.get("a/b")
        keys = await store.list("")
        await store.delete_prefix("a")
        return data, keys, await store.exists("a/b")

    assert run(store, main()) == (b"hello", ["a/b"], False)


@pytest.mark.s3_limit(
    "rclone", "rclone refuses an unsigned request with 400 UnsupportedAlgorithm, not 403"
)
def test_anonymous_reads_are_unsigned_and_refused_by_a_private_bucket(
    prefix: str, s3_server: S3Endpoint, reads: str
) -> None:
    options = {"anon": True, "client_kwargs": s3_server.storage_options["client_kwargs"]}
    store = make_store(prefix, options, reads)
    with pytest.raises(PermissionError):
        run(store, store.get_range("blob", 0, 10))


@pytest.mark.parametrize(
    ("bucket", "style", "url"),
    [
        ("my-bucket", "auto", "https://my-bucket.s3.eu-west-1.amazonaws.com/a%20b/c~d"),
        ("my.bucket", "auto", "https://s3.eu-west-1.amazonaws.com/my.bucket/a%20b/c~d"),
        ("my-bucket", "path", "https://s3.eu-west-1.amazonaws.com/my-bucket/a%20b/c~d"),
    ],
)
def test_aws_objects_are_addressed_virtual_hosted_when_the_bucket_name_allows(
    clean_env: Any, bucket: str, style: str, url: str
) -> None:
    options = {"client_kwargs": {"region_name": "eu-west-1"}}
    if style != "auto":
        options["config_kwargs"] = {"s3": {"addressing_style": style}}
    config = lean_read_config(options)
    assert config is not None

    async def main() -> tuple[str, str]:
        client = S3ReadClient(config)
        try:
            return client._url(bucket, "a b/c~d")
        finally:
            await client.aclose()

    assert asyncio.run(main()) == (url, "eu-west-1")


# -- listings ------------------------------------------------------------------------------

#: rclone serve s3 keeps objects as files of a local directory: a key ending in "/" (a
#: "directory" marker, which LISTED holds) cannot be stored (500 InternalError on its PUT);
#: ``test_a_listing_of_file_like_keys_is_exact_on_every_server`` covers it without one.
RCLONE_KEYS_ARE_PATHS = "rclone stores keys as file paths: no object key can end in '/'"
#: Keys SigV4 and XML must escape, nested keys, and a "directory" marker (which s3fs lists)
LISTED = ["a", "sp ace/a+b&c=d%e", "ünï/ç", "q?x#y<&>", "dir/", "dir/deep/er", "dir/x"]


@pytest.fixture(scope="module")
def listed(s3_server: S3Endpoint, s3_bucket: str) -> str:
    """``s3://bucket/<prefix>`` holding ``LISTED`` under ``tree/`` and a sibling ``tree2/``
    whose keys share the prefix's first characters."""
    name = f"s3-lists-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()
    for key in [*(f"tree/{k}" for k in LISTED), "tree2/z"]:
        client.put_object(Bucket=s3_bucket, Key=f"{name}/{key}", Body=b"x")
    return f"s3://{s3_bucket}/{name}"


@pytest.mark.s3_limit("rclone", RCLONE_KEYS_ARE_PATHS)
def test_a_listing_names_every_key_under_the_prefix_as_s3fs_does(
    listed: str, s3_server: S3Endpoint, reads: str
) -> None:
    store = make_store(listed, s3_server.storage_options, reads)

    async def main() -> tuple[list[str], ...]:
        return await store.list("tree"), await store.list("tree/dir"), await store.list("none")

    expected = sorted(f"tree/{k}" for k in LISTED)
    assert run(store, main()) == (expected, ["tree/dir/", "tree/dir/deep/er", "tree/dir/x"], [])


@pytest.mark.s3_limit("rclone", RCLONE_KEYS_ARE_PATHS)
def test_a_listing_follows_every_page_with_one_get_each(
    listed: str, s3_proxy: LatencyProxy, s3_bucket: str
) -> None:
    store = make_store(listed, s3_proxy.storage_options, "lean")
    root = listed.removeprefix(f"s3://{s3_bucket}/")

    async def main() -> tuple[list[str], list[str]]:
        client = await store._reads.client()
        paged = await client.list_keys(s3_bucket, f"{root}/tree/", page_size=2)
        return paged, await store.list("tree")

    paged, whole = run(store, main())
    assert paged == sorted(f"{root}/tree/{k}" for k in LISTED)
    assert whole == sorted(f"tree/{k}" for k in LISTED)
    stats = s3_proxy.stats()
    assert stats.method("GET") == stats.requests == 4 + 1  # 7 keys 2 a page, then 1 page


def test_a_listing_of_file_like_keys_is_exact_on_every_server(
    s3_server: S3Endpoint, s3_bucket: str, reads: str
) -> None:
    name = f"s3-plain-lists-{uuid.uuid4().hex[:8]}"
    keys = [key for key in LISTED if not key.endswith("/")]
    client = s3_server.client()
    for key in [*(f"tree/{k}" for k in keys), "tree2/z"]:
        client.put_object(Bucket=s3_bucket, Key=f"{name}/{key}", Body=b"x")
    store = make_store(f"s3://{s3_bucket}/{name}", s3_server.storage_options, reads)

    async def main() -> tuple[list[str], ...]:
        listed = await store.list("tree"), await store.list("tree/dir"), await store.list("no")
        if reads != "lean":
            return listed
        paged = await (await store._reads.client()).list_keys(s3_bucket, f"{name}/", page_size=2)
        return (*listed, paged)

    got = run(store, main())
    assert got[:3] == (sorted(f"tree/{k}" for k in keys), ["tree/dir/deep/er", "tree/dir/x"], [])
    if reads == "lean":
        assert got[3] == sorted(f"{name}/{k}" for k in [*(f"tree/{k}" for k in keys), "tree2/z"])


@pytest.mark.s3_limit("rclone", RCLONE_KEYS_ARE_PATHS)
def test_listing_keys_imports_neither_s3fs_nor_aiobotocore(
    listed: str, s3_server: S3Endpoint
) -> None:
    code = f"""
        import asyncio, sys
        from rangestream.io import S3Store
        store = S3Store({listed!r}, {s3_server.storage_options!r})
        async def main():
            try:
                return await store.list("tree/dir")
            finally:
                await store.aclose()
        keys = asyncio.run(main())
        assert keys == ["tree/dir/", "tree/dir/deep/er", "tree/dir/x"], keys
        assert "s3fs" not in sys.modules and "aiobotocore" not in sys.modules
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True)
