"""The ceiling over S3: a bare loop of the same range GETs with a lean client.

What any reader could reach on this server, through this proxy, at this concurrency, if it
did nothing but the GETs: one GET per token window, one per field group of a temporal window,
one per document of a batch, with the byte sizes a range reader needs, at random offsets of
objects of ``OBJECT_BYTES`` (the block size, and below SeaweedFS's 4 MiB piece size).
``concurrency`` is the number of windows in flight; a window's GETs go out together.

Two clients, so the ceiling is not one client's artefact: aiohttp signing with botocore's
SigV4 (the Python cost a signing client pays per request), and obstore (Rust; not fork-safe,
which is fine here: each worker is a freshly spawned interpreter that never forks).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import OBJECT_BYTES, SEED, RunConfig
from benchmarks.systems.base import Location, Support, System, Unavailable, run_lanes
from benchmarks.workloads import DatasetData, Payload, WindowSet, named_rng

_NOTE = "bare range GETs of the same sizes at random offsets of 4 MiB objects; no decoding"


def _object_key(i: int) -> str:
    return f"obj-{i:04d}.bin"


class _Ceiling(System):
    """Shared parts: the objects, the range plan, the async loop driving the GETs."""

    family = "ceiling"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._plans: dict[str, np.ndarray] = {}
        self._location: Location | None = None
        self._objects = 0
        self._seed = 0

    def supports(self, workload: str, location: str) -> Support | None:
        if location != "s3":
            return None
        return Support(concurrency=(1, 16, 64), exact=False, note=_NOTE)

    def prepare(self, data: DatasetData, out_dir: Path, config: RunConfig) -> None:
        rng = named_rng(config.seed, "ceiling-objects")
        for i in range(config.sizes.ceiling_objects):
            rng.integers(0, 256, OBJECT_BYTES, dtype=np.uint8).tofile(out_dir / _object_key(i))

    def open(self, data: DatasetData, location: Location) -> None:
        self._location = location
        self._objects = len(list(location.local_dir.glob("obj-*.bin")))
        self._seed = SEED
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._connect())

    def _plan(self, windows: WindowSet) -> np.ndarray:
        plan = self._plans.get(windows.workload)
        if plan is None:
            plan = self._plans[windows.workload] = windows.ceiling_ranges(self._seed, self._objects)
        return plan

    def truth(self, data: DatasetData, windows: WindowSet, i: int) -> Payload:
        assert self._location is not None
        out = []
        for obj, off, size in self._plan(windows)[i].tolist():
            with open(self._location.local_dir / _object_key(obj), "rb") as f:
                f.seek(off)
                out.append(f.read(size))
        return out

    def fetch(self, windows: WindowSet, i: int) -> Payload:
        assert self._loop is not None
        return self._loop.run_until_complete(self._window(self._plan(windows)[i]))

    async def _window(self, ranges: np.ndarray) -> list[Any]:
        return list(await asyncio.gather(*(self._get(o, a, n) for o, a, n in ranges.tolist())))

    def read(self, windows: WindowSet, ids: np.ndarray, concurrency: int) -> int:
        assert self._loop is not None
        plan = self._plan(windows)
        return self._loop.run_until_complete(self._read_many(list(plan[ids]), concurrency))

    async def _read_many(self, plans: list[np.ndarray], concurrency: int) -> int:
        async def one(i: int) -> int:
            return sum(len(b) for b in await self._window(plans[i]))

        return await run_lanes(range(len(plans)), concurrency, one)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._disconnect())
            self._loop.close()
            self._loop = None

    async def _connect(self) -> None:
        raise NotImplementedError

    async def _disconnect(self) -> None:
        return None

    async def _get(self, obj: int, offset: int, size: int) -> Any:
        """One range GET; returns a buffer of exactly ``size`` bytes."""
        raise NotImplementedError


class CeilingAiohttp(_Ceiling):
    """aiohttp + botocore SigV4: signing costs Python CPU, as in any boto-family client."""

    name = "s3-ceiling-aiohttp"
    label = "S3 ceiling: aiohttp + SigV4"

    def check_available(self) -> None:
        try:
            import aiohttp  # noqa: F401
            import botocore  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"not installed: {exc.name}") from exc

    async def _connect(self) -> None:
        import aiohttp
        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials

        assert self._location is not None and self._location.endpoint is not None
        ep = self._location.endpoint
        bucket, prefix = self._location.bucket_key
        self._base = f"{ep.proxy_url}/{bucket}/{prefix}"
        self._signer = S3SigV4Auth(Credentials(ep.access_key, ep.secret_key), "s3", ep.region)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=60),
            auto_decompress=False,
        )

    async def _disconnect(self) -> None:
        await self._session.close()

    async def _get(self, obj: int, offset: int, size: int) -> bytes:
        from botocore.awsrequest import AWSRequest

        url = f"{self._base}/{_object_key(obj)}"
        req = AWSRequest(
            method="GET", url=url, headers={"Range": f"bytes={offset}-{offset + size - 1}"}
        )
        self._signer.add_auth(req)
        async with self._session.get(url, headers=dict(req.headers.items())) as resp:
            if resp.status != 206:
                raise OSError(f"GET {url}: HTTP {resp.status}: {await resp.text()}")
            body = await resp.read()
        if len(body) != size:
            raise OSError(f"short range read: {len(body)} of {size}")
        return body


class CeilingObstore(_Ceiling):
    """obstore (Rust object_store): the leanest client available from PyPI."""

    name = "s3-ceiling-obstore"
    label = "S3 ceiling: obstore"

    def check_available(self) -> None:
        try:
            import obstore  # noqa: F401
        except ImportError as exc:
            raise Unavailable("not installed: obstore") from exc

    async def _connect(self) -> None:
        from obstore.store import S3Store

        assert self._location is not None and self._location.endpoint is not None
        ep = self._location.endpoint
        bucket, prefix = self._location.bucket_key
        self._prefix = prefix
        config: Any = {
            "endpoint": self._endpoint_url(ep),
            "access_key_id": ep.access_key,
            "secret_access_key": ep.secret_key,
            "region": ep.region,
            "virtual_hosted_style_request": False,
        }
        client: Any = {"allow_http": True, "pool_max_idle_per_host": "256", "timeout": "60s"}
        self._store = S3Store(bucket, config=config, client_options=client)

    def _endpoint_url(self, ep: Any) -> str:
        return ep.proxy_url

    async def _get(self, obj: int, offset: int, size: int) -> Any:
        import obstore

        data = await obstore.get_range_async(
            self._store, f"{self._prefix}/{_object_key(obj)}", start=offset, length=size
        )
        if len(data) != size:
            raise OSError(f"short range read: {len(data)} of {size}")
        return data  # obstore.Bytes: a zero-copy buffer, what a lean reader would keep


class ServerDirectObstore(CeilingObstore):
    """The same GETs straight to the server, no proxy: what SeaweedFS itself sustains here.

    Not a ceiling for the others (it skips the added latency); it shows how much of every S3
    figure is the server's own capacity on this shared 2-core machine.
    """

    name = "s3-server-direct"
    label = "S3 server alone (obstore, no proxy)"

    def supports(self, workload: str, location: str) -> Support | None:
        if location != "s3":
            return None
        return Support(
            concurrency=(1, 16, 64),
            exact=False,
            note="as the obstore ceiling but straight to SeaweedFS (no added latency, not "
            "counted by the proxy): the server's own capacity, for context only",
        )

    def _endpoint_url(self, ep: Any) -> str:
        return ep.direct_url
