"""An S3 endpoint that misbehaves on purpose: it serves a local directory as one bucket.

Real S3 servers answer a range GET with the range asked for. Some proxies and gateways do
not: they ignore ``Range`` (200 with the whole object) or answer another range than asked.
This small aiohttp app serves the files under a local directory as ``<bucket>/<key>`` and,
per ``mode``, answers honestly, ignores ranges, or shifts them; it checks no signature. PUTs
write the file (their headers are kept) and ignore If-Match / If-None-Match, as rclone does,
unless told to honour them; GET answers may carry a checksum header.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["MODES", "FakeS3", "fake_s3"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


#: How the server may answer a range GET (see ``FakeS3``).
MODES = (
    "honest",  # 206, Content-Range, the bytes asked for
    "ignore_range",  # 200, the whole object
    "shift",  # 206 for another range of the same length, ``shift`` bytes later, and its bytes
    "range_as_200",  # 200, Content-Range, the bytes asked for (rclone serve s3)
    "bare_range",  # 200, the bytes asked for, no Content-Range
    "no_content_range",  # 206, the bytes asked for, no Content-Range
    "status_203",  # 203, Content-Range, the bytes asked for
)


class FakeS3:
    """``mode``: one of ``MODES``, how range GETs are answered (HEADs are always honest)."""

    def __init__(self, root: Path, bucket: str = "fake-bucket", shift: int = 64) -> None:
        self.root = root
        self.bucket = bucket
        self.mode = "honest"
        self.shift = shift
        self.gets = 0
        self.heads = 0
        #: headers of each PUT received (the object is written under ``root``)
        self.put_headers: list[dict[str, str]] = []
        #: keys of each PUT received, in order
        self.put_keys: list[str] = []
        #: whether PUTs honour If-Match / If-None-Match (412 when they do not hold)
        self.honour_conditions = False
        #: sent with every GET answer as ``x-amz-checksum-crc32``, right or not
        self.checksum_header: str | None = None
        self.body_bytes = 0
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        return {
            "key": "fake",
            "secret": "fake-secret",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            **extra,
        }

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        bucket, _, key = request.match_info["path"].partition("/")
        path = self.root / key
        if request.method == "PUT" and bucket == self.bucket and key:
            return await self._put(request, path)
        if request.method == "DELETE" and bucket == self.bucket and key:
            path.unlink(missing_ok=True)
            return web.Response(status=204)
        if bucket != self.bucket or not key or not path.is_file():
            body = b"<Error><Code>NoSuchKey</Code><Message>missing</Message></Error>"
            return web.Response(status=404, body=body, content_type="application/xml")
        # the ETag names the content only where conditions are checked against it (hashing
        # would cost a whole read of a large object the client reads 4 KB of)
        etag = _etag(path.read_bytes()) if self.honour_conditions else '"fake"'
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        if self.checksum_header is not None:
            headers["x-amz-checksum-crc32"] = self.checksum_header
        size = path.stat().st_size
        if request.method == "HEAD":
            self.heads += 1
            return web.Response(status=200, headers={**headers, "Content-Length": str(size)})
        self.gets += 1
        match = _RANGE.fullmatch(request.headers.get("Range", ""))
        if match is None or self.mode == "ignore_range":
            return await self._whole(request, path, size, headers)
        data = path.read_bytes()
        first, last = match.groups()
        if first == "":  # a suffix: the last n bytes
            start, end = max(0, len(data) - int(last)), len(data)
        else:
            start, end = int(first), min(len(data), int(last) + 1 if last else len(data))
        if start >= len(data):
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        if self.mode == "shift":
            start, end = start + self.shift, min(len(data), end + self.shift)
        self.body_bytes += end - start
        if self.mode not in ("bare_range", "no_content_range"):
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        status = {"range_as_200": 200, "bare_range": 200, "status_203": 203}.get(self.mode, 206)
        return web.Response(status=status, body=data[start:end], headers=headers)

    async def _put(self, request: web.Request, path: Path) -> web.Response:
        """Write the object; the conditions are checked only if ``honour_conditions``."""
        self.put_headers.append(dict(request.headers))
        self.put_keys.append(str(path.relative_to(self.root)))
        body = await request.read()
        current = _etag(path.read_bytes()) if path.is_file() else None
        if self.honour_conditions:
            if_none = request.headers.get("If-None-Match")
            if_match = request.headers.get("If-Match")
            if (if_none == "*" and current is not None) or (
                if_match is not None and if_match != current
            ):
                error = b"<Error><Code>PreconditionFailed</Code><Message>no</Message></Error>"
                return web.Response(status=412, body=error, content_type="application/xml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        return web.Response(status=200, headers={"ETag": _etag(body)})

    async def _whole(
        self, request: web.Request, path: Path, size: int, headers: dict[str, str]
    ) -> web.StreamResponse:
        """The whole object, streamed a MiB at a time (a client may stop reading early)."""
        response = web.StreamResponse(status=200, headers=headers)
        response.content_length = size
        await response.prepare(request)
        with open(path, "rb") as handle:
            while piece := handle.read(1 << 20):
                try:
                    await response.write(piece)
                except (ConnectionResetError, RuntimeError):
                    return response  # the client had what it wanted and hung up
                self.body_bytes += len(piece)
        await response.write_eof()
        return response

    def start(self) -> FakeS3:
        self._thread.start()
        self._started.wait(10)
        return self

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def fake_s3(root: Path) -> Iterator[FakeS3]:
    server = FakeS3(root).start()
    try:
        yield server
    finally:
        server.close()
