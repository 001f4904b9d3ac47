"""An HTTP reverse proxy that adds latency, counts S3 traffic exactly, and injects faults.

It fronts the GCS and Azure emulators too (``LatencyProxy(url)``): neither signs the Host,
and Azure's ``x-ms-range`` counts as a range request like ``Range``.

A local S3 server answers in microseconds and never misbehaves, so on its own it can neither
show whether a reader overlaps its range requests nor whether it survives throttling, resets
and short reads. Placed between a client and the server, this proxy makes each request cost a
fixed round trip, records exactly what crossed the wire (requests by method, range GETs, body
bytes, peak concurrency) and, when asked, misbehaves like a real object store: seeded, so a
failing reliability test can be replayed.

SigV4 signs the Host header. Clients are pointed at the proxy, so they sign for the proxy's
host:port, and the proxy forwards that Host header unchanged; the upstream server verifies the
signature against the same value the client signed.

Run as a process (``python -m testkit.proxy --upstream URL --delay-ms 20``), it
prints its endpoint URL on stdout and serves until SIGTERM/SIGINT. That mode exists for
benchmarks: the proxy's CPU must not be charged to the client being measured, and clients in
other interpreters read the counters over HTTP, from ``GET /__proxy__/stats`` (JSON) and
``POST /__proxy__/reset``, and the request log (which object and bytes each request asked
for, see :mod:`testkit.request_log`) from ``POST /__proxy__/log/start``, ``.../log/take`` and
``.../log/stop``. Those control paths are answered by the proxy itself, never forwarded nor
counted; ``__proxy__`` is not a valid bucket name, so no S3 request can clash.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import random
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from testkit.faults import (
    DRAW_ORDER,
    ERROR_RESPONSES,
    FaultConfig,
    FaultKind,
    ProxyStats,
    s3_error,
)
from testkit.request_log import LoggedRequest, RequestLog, served_range

__all__ = [
    "CONTROL_PREFIX",
    "FaultConfig",
    "FaultKind",
    "LatencyProxy",
    "LoggedRequest",
    "ProxyStats",
    "main",
]

#: Path prefix of the proxy's own endpoints (``stats``, ``reset``) when they are enabled.
CONTROL_PREFIX = "/__proxy__"

_CHUNK_SIZE = 256 * 1024
# Connection-level headers describe one hop and must not be relayed (RFC 9110 7.6.1). "Expect"
# is answered by this proxy's own server (it sends 100 Continue), and SigV4 never signs it.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)


#: Headers that ask for a byte range: HTTP's own, and Azure Blob's (``x-ms-range`` wins there).
_RANGE_HEADERS = ("x-ms-range", "Range")


def _range_of(request: web.Request) -> str | None:
    """The byte range a request asks for, in whichever header its service uses."""
    for name in _RANGE_HEADERS:
        value = request.headers.get(name)
        if value is not None:
            return value
    return None


class _Counters:
    def __init__(self, in_flight: int = 0) -> None:
        self.requests = 0
        self.by_method: Counter[str] = Counter()
        self.range_gets = 0
        self.response_bytes = 0
        self.by_status: Counter[int] = Counter()
        self.faults: Counter[FaultKind] = Counter()
        self.delay_seconds = 0.0
        self.max_in_flight = in_flight

    def snapshot(self) -> ProxyStats:
        return ProxyStats(
            requests=self.requests,
            requests_by_method=dict(self.by_method),
            range_gets=self.range_gets,
            response_bytes=self.response_bytes,
            responses_by_status=dict(self.by_status),
            faults=dict(self.faults),
            delay_seconds=self.delay_seconds,
            max_in_flight=self.max_in_flight,
        )


class _Flight:
    """One request's membership in the in-flight count.

    It must end before the response's last byte is handed to the socket: a client that has its
    whole response can send its next request at once, and a strictly sequential client must
    never show up as two requests in flight.
    """

    __slots__ = ("_landed", "_proxy", "entry")

    def __init__(self, proxy: LatencyProxy, entry: Any = None) -> None:
        self._proxy = proxy
        self._landed = False
        self.entry = entry  # the request's log entry while recording, else None

    def land(self) -> None:
        if not self._landed:
            self._landed = True
            with self._proxy._lock:
                self._proxy._in_flight -= 1
            if self.entry is not None:
                self._proxy._log.finish(self.entry, time.monotonic())


class S3EndpointLike(Protocol):
    """Anything that describes an S3 endpoint, e.g. ``S3Endpoint`` or ``SeaweedFSServer``."""

    @property
    def endpoint_url(self) -> str: ...

    @property
    def storage_options(self) -> dict[str, Any]: ...


class LatencyProxy:
    """Reverse proxy on a free loopback port, served by its own thread and event loop.

    Running on a separate loop keeps it independent of whatever loop the code under test uses
    (s3fs has its own IO thread; tests may use ``asyncio.run``), and lets synchronous tests and
    benchmarks use it without any async plumbing. It starts in the constructor and stops in
    ``close()`` (or at the end of a ``with`` block).

    The proxy imposes no concurrency limit of its own, so ``max_in_flight`` reflects the
    client's concurrency, not the proxy's.
    """

    def __init__(
        self,
        upstream: str | S3EndpointLike,
        *,
        delay: float = 0.02,
        faults: FaultConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 10.0,
        control_endpoints: bool = False,
    ) -> None:
        """``control_endpoints`` serves ``GET {CONTROL_PREFIX}/stats`` (the counters as JSON),
        ``POST {CONTROL_PREFIX}/reset`` and ``POST {CONTROL_PREFIX}/log/{start,take,stop}``
        (the request log, as ``{"requests": [...], "dropped": n}``) for clients in other
        processes; off by default so that, in-process, every request is forwarded exactly as
        a client sent it.
        """
        self._control_endpoints = control_endpoints
        if isinstance(upstream, str):
            self._upstream_url = upstream
            self._upstream_options: dict[str, Any] | None = None
        else:
            self._upstream_url = upstream.endpoint_url
            self._upstream_options = upstream.storage_options
        parsed = URL(self._upstream_url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"upstream must be an http(s) URL, got {self._upstream_url!r}")
        if parsed.raw_path not in ("", "/") or parsed.raw_query_string:
            # SigV4 signs the path the client sent; a rewritten path could never verify.
            raise ValueError(f"upstream must not have a path or query: {self._upstream_url!r}")
        self._upstream_base = str(parsed.origin())
        self._host = host
        self.delay = delay

        self._lock = threading.Lock()
        self._in_flight = 0
        self._counters = _Counters()
        self._faults = FaultConfig()
        self._rng = random.Random(self._faults.seed)
        self._forced: deque[FaultKind] = deque()
        self._request_seq = 0
        self._log = RequestLog()
        self._gate: asyncio.Event | None = None
        if faults is not None:
            self.set_faults(faults)

        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name=f"LatencyProxy->{self._upstream_url}", daemon=True
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(port), self._loop).result(start_timeout)
        except BaseException:
            self.close()
            raise

    # -- configuration ---------------------------------------------------------------------

    @property
    def delay(self) -> float:
        """Seconds added before every request is forwarded (also before injected faults)."""
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._delay = float(seconds)

    @property
    def faults(self) -> FaultConfig:
        return self._faults

    def set_faults(self, config: FaultConfig) -> None:
        """Replace the fault configuration and restart its random sequence from ``seed``.

        Pending ``fail_next`` faults are kept: they are an explicit request, not a rate.
        """
        with self._lock:
            self._faults = config
            self._rng = random.Random(config.seed)

    def fail_next(self, kind: FaultKind, count: int = 1) -> None:
        """Inject ``kind`` into the next ``count`` eligible requests, ahead of random faults.

        Eligibility (methods, path_regex) follows the current ``FaultConfig``.
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        with self._lock:
            self._forced.extend([FaultKind(kind)] * count)

    def clear_faults(self) -> None:
        """Stop injecting faults: no probabilities, nothing pending."""
        with self._lock:
            self._faults = FaultConfig()
            self._rng = random.Random(self._faults.seed)
            self._forced.clear()

    # -- holding requests ------------------------------------------------------------------

    def hold(self) -> None:
        """Hold every request arriving from now on (after its delay) until ``release``.

        A held request counts as in flight, so a test can see exactly how many requests a
        client keeps in flight at once (``in_flight``, ``max_in_flight``) without racing
        answers that come back meanwhile.
        """
        with self._lock:
            if self._gate is None:
                self._gate = asyncio.Event()  # binds to the proxy's loop on first wait

    def release(self) -> None:
        """Let every held request (and every later one) go on."""
        with self._lock:
            gate, self._gate = self._gate, None
        if gate is not None:
            self._loop.call_soon_threadsafe(gate.set)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not answered yet (held ones included)."""
        with self._lock:
            return self._in_flight

    # -- observation -----------------------------------------------------------------------

    def stats(self) -> ProxyStats:
        with self._lock:
            return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Zero every counter; ``max_in_flight`` restarts from the requests still running."""
        with self._lock:
            self._counters = _Counters(in_flight=self._in_flight)

    def start_request_log(self) -> None:
        """Record every request from now on (method, path, range asked and served, status,
        body bytes, times); the log starts empty. Off until called."""
        self._log.start()

    def take_request_log(self) -> list[LoggedRequest]:
        """Requests completed since the last take (or the start), in arrival order.

        Each is returned once; requests still running come with a later take. A client
        that has received its responses finds them all in the next take.
        """
        return self._log.take()

    def stop_request_log(self) -> list[LoggedRequest]:
        """Stop recording; return the completed requests not taken yet."""
        return self._log.stop()

    # -- addressing ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not running")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def upstream_url(self) -> str:
        return self._upstream_url

    def merge_storage_options(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` fsspec/s3fs options (deep-copied) redirected to this proxy."""
        options = copy.deepcopy(dict(base))
        client_kwargs = dict(options.get("client_kwargs") or {})
        client_kwargs["endpoint_url"] = self.endpoint_url
        options["client_kwargs"] = client_kwargs
        options.pop("endpoint_url", None)  # s3fs also accepts it top-level; it would win
        return options

    @property
    def storage_options(self) -> dict[str, Any]:
        """The upstream's fsspec/s3fs options, pointed at this proxy.

        Only available when the proxy was built from an endpoint object (which carries
        credentials); with a bare URL use ``merge_storage_options``.
        """
        if self._upstream_options is None:
            raise RuntimeError(
                "the proxy was created from a bare URL; use merge_storage_options(options)"
            )
        return self.merge_storage_options(self._upstream_options)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving, drop in-flight requests, and join the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(15.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.endpoint_url if self._port is not None else "stopped"
        return f"LatencyProxy({where} -> {self._upstream_url}, delay={self._delay})"

    # -- event-loop side -------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _start(self, port: int) -> None:
        self._session = aiohttp.ClientSession(
            # No limit: the proxy must not cap the client's concurrency it is measuring.
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
            # Relay bytes and headers exactly as they are: no transparent gunzip, no headers
            # the client did not send, no cookies remembered between unrelated requests.
            auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "Content-Type", "User-Agent"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application()
        if self._control_endpoints:
            # Registered before the catch-all, so these are never forwarded nor counted.
            app.router.add_get(f"{CONTROL_PREFIX}/stats", self._handle_stats)
            app.router.add_post(f"{CONTROL_PREFIX}/reset", self._handle_reset)
            app.router.add_post(f"{CONTROL_PREFIX}/log/start", self._handle_log_start)
            app.router.add_post(f"{CONTROL_PREFIX}/log/take", self._handle_log_take)
            app.router.add_post(f"{CONTROL_PREFIX}/log/stop", self._handle_log_stop)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: when a client gives up (timeout), its handler stops too instead
        # of sleeping out a SLOW fault or streaming a body nobody reads.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, port)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats().to_json())

    async def _handle_reset(self, request: web.Request) -> web.Response:
        self.reset_stats()
        return web.json_response(self.stats().to_json())

    async def _handle_log_start(self, request: web.Request) -> web.Response:
        self.start_request_log()
        return web.json_response({"recording": True})

    def _log_response(self, entries: list[LoggedRequest]) -> web.Response:
        return web.json_response(
            {"requests": [e.to_json() for e in entries], "dropped": self._log.dropped}
        )

    async def _handle_log_take(self, request: web.Request) -> web.Response:
        return self._log_response(self.take_request_log())

    async def _handle_log_stop(self, request: web.Request) -> web.Response:
        return self._log_response(self.stop_request_log())

    def _admit(self, request: web.Request) -> tuple[FaultKind | None, int]:
        method = request.method.upper()
        with self._lock:
            counters = self._counters
            counters.requests += 1
            counters.by_method[method] += 1
            if method == "GET" and _range_of(request) is not None:
                counters.range_gets += 1
            self._in_flight += 1
            counters.max_in_flight = max(counters.max_in_flight, self._in_flight)
            self._request_seq += 1
            return self._draw_fault(method, request.path), self._request_seq

    def _draw_fault(self, method: str, path: str) -> FaultKind | None:
        config = self._faults
        if not config.applies_to(method, path):
            return None
        if self._forced:
            return self._forced.popleft()
        draw = self._rng.random()
        threshold = 0.0
        for kind in DRAW_ORDER:
            threshold += config.probability(kind)
            if draw < threshold:
                return kind
        return None

    def _count(
        self,
        *,
        body_bytes: int = 0,
        status: int | None = None,
        fault: FaultKind | None = None,
        delay: float = 0.0,
        flight: _Flight | None = None,
    ) -> None:
        entry = flight.entry if flight is not None else None
        if entry is not None:  # only the proxy's loop thread writes an entry
            entry.body_bytes += body_bytes
            if status is not None:
                entry.status = status
        with self._lock:
            counters = self._counters
            counters.response_bytes += body_bytes
            counters.delay_seconds += delay
            if status is not None:
                counters.by_status[status] += 1
            if fault is not None:
                counters.faults[fault] += 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        fault, seq = self._admit(request)
        flight = _Flight(
            self,
            self._log.open(
                request.method.upper(),
                request.path,
                request.query_string,
                _range_of(request),
                arrived,
            ),
        )
        try:
            delay = self._delay
            if delay > 0:
                await asyncio.sleep(delay)
                self._count(delay=delay)
            gate = self._gate
            if gate is not None:
                await gate.wait()
            if fault is FaultKind.RESET:
                return self._reset(request)
            if fault in ERROR_RESPONSES:
                return self._error_response(request, fault, seq, flight)
            if fault is FaultKind.SLOW:
                self._count(fault=fault)
                await asyncio.sleep(self._faults.slow_seconds)
            truncate = self._faults.truncate_fraction if fault is FaultKind.TRUNCATE else None
            return await self._forward(request, truncate, flight)
        except ConnectionError:
            # The client went away mid-response; nothing is left to send it.
            return web.StreamResponse()
        finally:
            flight.land()

    def _reset(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0 turns close() into a real RST ("connection reset by peer") rather
                # than an orderly FIN, as a crashing or overloaded server would produce.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._count(fault=FaultKind.RESET)
            transport.abort()
        # aiohttp tries to send this, finds the transport closed, and drops it silently.
        return web.StreamResponse()

    def _error_response(
        self, request: web.Request, fault: FaultKind, seq: int, flight: _Flight
    ) -> web.Response:
        status, reason, code, message = ERROR_RESPONSES[fault]
        request_id = f"rangestream-proxy-{seq}"
        body = s3_error(code, message, request.path, request_id)
        sends_body = request.method.upper() != "HEAD"
        self._count(
            body_bytes=len(body) if sends_body else 0, status=status, fault=fault, flight=flight
        )
        return web.Response(
            status=status,
            reason=reason,
            body=body,
            headers={"Content-Type": "application/xml", "x-amz-request-id": request_id},
        )

    async def _forward(
        self, request: web.Request, truncate_fraction: float | None, flight: _Flight
    ) -> web.StreamResponse:
        assert self._session is not None
        # raw_path keeps the client's exact percent-encoding, which SigV4's canonical URI uses;
        # encoded=True stops yarl from re-quoting it.
        url = URL(self._upstream_base + request.raw_path, encoded=True)
        headers = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _HOP_BY_HOP
        )
        data = request.content.iter_chunked(_CHUNK_SIZE) if request.body_exists else None
        try:
            upstream_cm = self._session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            )
            upstream = await upstream_cm.__aenter__()
        except aiohttp.ClientError as exc:
            body = f"rangestream proxy: upstream {self._upstream_url} failed: {exc!r}".encode()
            self._count(body_bytes=len(body), status=502, flight=flight)
            return web.Response(status=502, body=body, content_type="text/plain")
        try:
            return await self._relay(request, upstream, truncate_fraction, flight)
        finally:
            # Releasing a partly read response closes that upstream connection (not reused).
            await upstream_cm.__aexit__(None, None, None)

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        truncate_fraction: float | None,
        flight: _Flight,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                response.headers.add(name, value)
        sends_body = request.method.upper() != "HEAD"
        length = upstream.content_length
        cut: int | None = None
        if truncate_fraction is not None and sends_body and length:
            cut = min(int(length * truncate_fraction), length - 1)
            self._count(fault=FaultKind.TRUNCATE)
        self._count(status=upstream.status, flight=flight)
        if flight.entry is not None:
            flight.entry.served = served_range(upstream.headers.get("Content-Range"))
        if not sends_body or length == 0:
            # prepare() sends the headers at once, and they are the whole response here: a
            # client may be done before this thread runs again.
            flight.land()
        await response.prepare(request)
        sent = 0
        while sends_body and (cut is None or sent < cut):
            try:
                chunk = await upstream.content.read(_CHUNK_SIZE)
            except aiohttp.ClientError:
                # The upstream body broke off: pass the breakage on instead of inventing an
                # ending, so the client sees exactly what a direct connection would show.
                cut = sent
                break
            if not chunk:
                break
            piece = chunk if cut is None else chunk[: cut - sent]
            self._count(body_bytes=len(piece), flight=flight)
            if sent + len(piece) == (length if cut is None else cut):
                flight.land()  # the client may be done as soon as this piece arrives
            await response.write(piece)
            sent += len(piece)
        flight.land()
        if cut is not None:
            # close() flushes what was written, then FINs: the client got the announced
            # Content-Length but the body ends early.
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a proxy in this process until SIGTERM/SIGINT; print its endpoint URL first.

    The first stdout line is the endpoint (``http://host:port``), flushed at once, so a
    parent started with ``--port 0`` learns the port without racing for a free one.
    """
    parser = argparse.ArgumentParser(
        prog="python -m testkit.proxy",
        description="A latency-adding, counting S3 proxy, with its counters served over HTTP "
        f"at {CONTROL_PREFIX}/stats (GET) and {CONTROL_PREFIX}/reset (POST).",
    )
    parser.add_argument("--upstream", required=True, help="http(s) URL of the S3 server")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added per request")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LatencyProxy(
        args.upstream,
        delay=args.delay_ms / 1000.0,
        host=args.host,
        port=args.port,
        control_endpoints=True,
    ) as proxy:
        print(proxy.endpoint_url, flush=True)
        while not stop.wait(3600):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
