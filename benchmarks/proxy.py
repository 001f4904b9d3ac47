"""A delaying, counting HTTP/1.1 proxy in front of the local S3 server.

This machine has no netem, so S3's first-byte latency is simulated here: every request is
held for a fixed delay before it is forwarded. The proxy also counts requests and bytes, the
exact figures behind "requests per window" and "bytes fetched per payload byte".

It runs as its own process (``python -m benchmarks.proxy``) so that its CPU time is not
charged to the client being measured, and every client (whatever its interpreter) reads the
counters the same way: ``GET /__bench__/stats`` on the proxy port, answered by the proxy
itself, never forwarded and never counted.

Only what S3 clients send is supported: HTTP/1.1 requests with ``Content-Length`` or
chunked bodies (``Expect: 100-continue`` included), one request at a time per connection
(no pipelining), responses with ``Content-Length``, chunked bodies or no body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STATS_PATH = b"/__bench__/stats"
COPY_BLOCK = 256 * 1024


@dataclass
class Counters:
    """Totals since the proxy started; clients take differences between two snapshots."""

    requests: int = 0
    get_requests: int = 0
    head_requests: int = 0
    put_requests: int = 0
    other_requests: int = 0
    response_body_bytes: int = 0
    response_header_bytes: int = 0
    request_body_bytes: int = 0
    errors: int = 0
    connections: int = 0
    open_connections: int = 0


class _Closed(Exception):
    """The peer closed the connection between two requests: a normal end."""


def _parse_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Closed from exc
        raise


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> int:
    left = n
    while left:
        block = await reader.read(min(left, COPY_BLOCK))
        if not block:
            raise ConnectionError("peer closed inside a body")
        writer.write(block)
        left -= len(block)
        if writer.transport.get_write_buffer_size() > 4 * COPY_BLOCK:
            await writer.drain()
    return n


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    """Forward a chunked body verbatim; return the number of payload bytes in it."""
    payload = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        writer.write(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while True:  # trailers end with an empty line
                line = await reader.readuntil(b"\r\n")
                writer.write(line)
                if line == b"\r\n":
                    return payload
        await _copy_exact(reader, writer, size + 2)
        payload += size


async def _copy_body(
    headers: dict[bytes, bytes],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    until_close: bool,
) -> int:
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return await _copy_chunked(reader, writer)
    if b"content-length" in headers:
        return await _copy_exact(reader, writer, int(headers[b"content-length"]))
    if not until_close:
        return 0
    total = 0
    while block := await reader.read(COPY_BLOCK):
        writer.write(block)
        total += len(block)
    return total


class LatencyProxy:
    """Forward each client connection to its own upstream connection, delaying each request."""

    def __init__(self, upstream_host: str, upstream_port: int, latency_s: float) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency_s = latency_s
        self.counters = Counters()
        self.started = time.time()

    async def handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        c = self.counters
        c.connections += 1
        c.open_connections += 1
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(creader)
                request_line, headers = _parse_head(head)
                method, _, rest = request_line.partition(b" ")
                target = rest.rsplit(b" ", 1)[0]
                if target.startswith(STATS_PATH):
                    self._answer_stats(cwriter)
                    await cwriter.drain()
                    continue
                c.requests += 1
                if method == b"GET":
                    c.get_requests += 1
                elif method == b"HEAD":
                    c.head_requests += 1
                elif method == b"PUT":
                    c.put_requests += 1
                else:
                    c.other_requests += 1
                await asyncio.sleep(self.latency_s)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                ureader, uwriter = upstream
                uwriter.write(head)
                has_body = b"content-length" in headers or b"transfer-encoding" in headers
                if has_body and headers.get(b"expect", b"").lower() == b"100-continue":
                    rhead = await _read_head(ureader)
                    status_line, rheaders = _parse_head(rhead)
                    cwriter.write(rhead)
                    if not status_line.split(b" ")[1].startswith(b"100"):
                        # Final answer before the body: forward it and drop the connection,
                        # since the client may or may not send the body now.
                        await self._finish_response(method, rheaders, ureader, cwriter, rhead)
                        break
                    await cwriter.drain()
                if has_body:
                    # (never `c.x += await ...`: the read of c.x would precede the await and
                    # lose the updates other connections make meanwhile)
                    sent = await _copy_body(headers, creader, uwriter, False)
                    c.request_body_bytes += sent
                await uwriter.drain()
                while True:
                    rhead = await _read_head(ureader)
                    status_line, rheaders = _parse_head(rhead)
                    if status_line.split(b" ")[1].startswith(b"1"):
                        cwriter.write(rhead)  # interim response (100 Continue)
                        continue
                    break
                cwriter.write(rhead)
                keep = await self._finish_response(method, rheaders, ureader, cwriter, rhead)
                await cwriter.drain()
                if not keep or headers.get(b"connection", b"").lower() == b"close":
                    break
        except _Closed:
            pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            c.errors += 1
        finally:
            c.open_connections -= 1
            for w in (cwriter, upstream[1] if upstream else None):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()

    async def _finish_response(
        self,
        method: bytes,
        rheaders: dict[bytes, bytes],
        ureader: asyncio.StreamReader,
        cwriter: asyncio.StreamWriter,
        rhead: bytes,
    ) -> bool:
        """Forward the body of a response; return whether the connection may be reused."""
        c = self.counters
        c.response_header_bytes += len(rhead)
        close = rheaders.get(b"connection", b"").lower() == b"close"
        status = int(_parse_head(rhead)[0].split(b" ")[1])
        if method != b"HEAD" and status not in (204, 304):
            delimited = b"content-length" in rheaders or b"transfer-encoding" in rheaders
            got = await _copy_body(rheaders, ureader, cwriter, not delimited)
            c.response_body_bytes += got
            close = close or not delimited
        return not close

    def _answer_stats(self, writer: asyncio.StreamWriter) -> None:
        body = json.dumps(
            {
                **asdict(self.counters),
                "latency_s": self.latency_s,
                "uptime_s": time.time() - self.started,
            }
        ).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )


async def _serve(args: argparse.Namespace) -> None:
    host, _, port = args.upstream.rpartition(":")
    proxy = LatencyProxy(host, int(port), args.latency_ms / 1000.0)
    server = await asyncio.start_server(
        proxy.handle, args.host, args.port, limit=1 << 20, backlog=1024
    )
    bound = server.sockets[0].getsockname()[1]
    if args.ready_file:
        Path(args.ready_file).write_text(json.dumps({"port": bound}))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--upstream", required=True, help="host:port of the S3 server")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--ready-file", help="written with the bound port once listening")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
