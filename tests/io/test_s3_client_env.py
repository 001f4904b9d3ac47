"""The lean client's requests stay on the event loop, and the proxy environment still holds.

aiohttp's ``trust_env`` looked up ``~/.netrc`` in the loop's executor and the proxy
environment in another thread for every request: two thread handoffs per GET. The client
now reads the proxy environment once per host; these tests count the handoffs (none) and
check that ``HTTP_PROXY`` / ``NO_PROXY`` still decide where requests go, as botocore's do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from rangestream.io import RangeReader, RangeRequest, RetryPolicy, S3Store
from rangestream.io.s3 import _LeanReads
from rangestream.io.s3_options import READS_ENV
from testkit import S3Endpoint

pytestmark = pytest.mark.s3_core

SIZE = 50_000
FAST = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)
PROXY_SETTINGS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
                  "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy")  # fmt: skip


@pytest.fixture(scope="module")
def content() -> bytes:
    return np.random.default_rng(11).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def prefix(s3_server: S3Endpoint, s3_bucket: str, content: bytes) -> str:
    name = f"s3-env-{uuid.uuid4().hex[:8]}"
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"{name}/blob", Body=content)
    return f"s3://{s3_bucket}/{name}"


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(READS_ENV, raising=False)
    return monkeypatch


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.submitted.append(getattr(fn, "__qualname__", repr(fn)))
        return super().submit(fn, *args, **kwargs)


def test_range_reads_make_no_thread_handoffs(
    prefix: str, s3_server: S3Endpoint, content: bytes, no_proxies: Any
) -> None:
    store = S3Store(prefix, s3_server.storage_options)
    assert isinstance(store._reads, _LeanReads)
    reader = RangeReader(store, coalesce_gap=0, retry=FAST)
    ranges = [(i * 997 % (SIZE - 4096), i * 997 % (SIZE - 4096) + 4096) for i in range(40)]
    apart = [(k * 6000, k * 6000 + 100) for k in range(8)]  # one request each
    executor = CountingExecutor()

    async def main() -> tuple[list[bytes], int]:
        asyncio.get_running_loop().set_default_executor(executor)
        try:
            await store.connect()  # the session, made once per loop
            before = len(executor.submitted)
            got = [bytes(await reader.fetch_range(RangeRequest("blob", a, b))) for a, b in ranges]
            more = await reader.fetch([RangeRequest("blob", a, b) for a, b in apart])
            return got + [bytes(m) for m in more], len(executor.submitted) - before
        finally:
            await store.aclose()

    got, handoffs = asyncio.run(main())
    executor.shutdown()
    assert got == [content[a:b] for a, b in ranges + apart]
    assert handoffs == 0, executor.submitted
    assert reader.stats.requests == 48 and reader.stats.retries == 0


class ForwardProxy:
    """A plain HTTP forward proxy (absolute-form request targets), recording each target."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.SockSite(self._runner, self._socket).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._socket.close()

    async def _forward(self, request: web.Request) -> web.Response:
        target = str(request.url)
        self.targets.append(target)
        hop = {"proxy-connection", "transfer-encoding"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method, target, headers=headers, allow_redirects=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
            ) as answer,
        ):  # fmt: skip
            body = await answer.read()
            dropped = {"transfer-encoding", "connection", "content-length"}
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in dropped}
            return web.Response(status=answer.status, body=body, headers=kept)


@pytest.fixture
def forward_proxy() -> Iterator[ForwardProxy]:
    yield ForwardProxy()


@pytest.mark.parametrize("bypassed", [False, True])
def test_http_proxy_from_the_environment_carries_reads_unless_no_proxy_names_the_host(
    prefix: str,
    s3_server: S3Endpoint,
    content: bytes,
    no_proxies: pytest.MonkeyPatch,
    forward_proxy: ForwardProxy,
    bypassed: bool,
) -> None:
    no_proxies.setenv("HTTP_PROXY", forward_proxy.url)
    if bypassed:
        no_proxies.setenv("NO_PROXY", "127.0.0.1,localhost")
    store = S3Store(prefix, s3_server.storage_options)
    assert isinstance(store._reads, _LeanReads)
    reader = RangeReader(store, retry=FAST)

    async def main() -> list[bytes]:
        await forward_proxy.start()
        try:
            return [bytes(await reader.fetch_range(RangeRequest("blob", a, a + 100)))
                    for a in (0, 1000, 2000)]  # fmt: skip
        finally:
            await store.aclose()
            await forward_proxy.close()

    got = asyncio.run(main())
    assert got == [content[a : a + 100] for a in (0, 1000, 2000)]
    bucket_key = prefix.removeprefix("s3://") + "/blob"
    expected = [] if bypassed else [f"{s3_server.endpoint_url}/{bucket_key}"] * 3
    assert forward_proxy.targets == expected
    assert reader.stats.requests == 3


def test_a_plain_http_endpoint_loads_no_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AWS_CA_BUNDLE`` is set on many clusters; loading it for an ``http://`` endpoint
    cost every DataLoader worker's client about 30 ms and was never used."""
    import ssl

    from rangestream.io import s3_client
    from rangestream.io.process import ProcessLocal
    from rangestream.io.s3_client import S3ReadClient
    from rangestream.io.s3_options import S3ReadConfig

    monkeypatch.setattr(s3_client, "_contexts", ProcessLocal())  # none made yet

    loaded: list[str | None] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        loaded.append(kwargs.get("cafile"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    bundle = ssl.get_default_verify_paths().cafile or __file__

    async def open_and_close(endpoint: str) -> None:
        client = S3ReadClient(S3ReadConfig(endpoint, "us-east-1", anon=True, ca_bundle=bundle))
        await client.aclose()

    asyncio.run(open_and_close("http://127.0.0.1:9"))  # no request is made
    assert loaded == []
    for _ in range(3):  # an https endpoint trusts the bundle, loaded once per process
        asyncio.run(open_and_close("https://s3.example.invalid"))
    assert loaded.count(bundle) == 1
