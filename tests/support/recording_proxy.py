"""A reverse proxy in front of the suite's S3 server that records what each request carried.

The configuration tests check where requests went and how they were signed: the ``Host``
header, the SigV4 credential scope (``<date>/<region>/s3/aws4_request``) and whether the
request came over TLS. Requests are forwarded unchanged (headers, Host included, so the
signature still holds) to the upstream endpoint. With ``tls`` the proxy serves https with a
certificate of a throwaway CA (``trustme``), whose bundle a test hands to the client.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

__all__ = ["RecordedRequest", "RecordingProxy", "recording_proxy"]

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    host: str
    path: str
    region: str | None  # of the SigV4 credential scope; None if unsigned
    tls: bool


class RecordingProxy:
    def __init__(self, upstream_url: str, tls_dir: Path | None = None) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.requests: list[RecordedRequest] = []
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))  # bound here: no other process can take the port
        self._socket.listen(128)
        self.port = int(self._socket.getsockname()[1])
        self.ca_bundle: Path | None = None
        self._ssl: ssl.SSLContext | None = None
        if tls_dir is not None:
            import trustme

            authority = trustme.CA()
            certificate = authority.issue_cert("127.0.0.1", "localhost")
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            certificate.configure_cert(self._ssl)
            self.ca_bundle = tls_dir / "ca.pem"
            authority.cert_pem.write_to_path(str(self.ca_bundle))
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.SockSite(self._runner, self._socket, ssl_context=self._ssl)
        self._loop.run_until_complete(site.start())
        self._started.set()
        self._loop.run_forever()

    async def _forward(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        match = _SCOPE.search(authorization)
        self.requests.append(
            RecordedRequest(
                request.method,
                request.headers.get("Host", ""),
                request.path,
                match.group(1) if match else None,
                request.secure,
            )
        )
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "transfer-encoding"}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                self.upstream_url + request.raw_path,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
            ) as answer,
        ):
            data = await answer.read()
            dropped = {"transfer-encoding", "connection"}
            if request.method != "HEAD":  # a HEAD's length is the object's: keep it
                dropped.add("content-length")
            out = {k: v for k, v in answer.headers.items() if k.lower() not in dropped}
            if request.method == "HEAD":
                return web.Response(status=answer.status, headers=out)
            return web.Response(status=answer.status, body=data, headers=out)

    def start(self) -> RecordingProxy:
        self._thread.start()
        if not self._started.wait(60):
            raise RuntimeError("the recording proxy did not start")
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._socket.close()


@contextmanager
def recording_proxy(upstream_url: str, tls_dir: Path | None = None) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(upstream_url, tls_dir).start()
    try:
        yield proxy
    finally:
        proxy.close()
