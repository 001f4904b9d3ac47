"""The S3 ceiling: each system's own GETs replayed by a bare client at its concurrency.

While a system is measured over S3, the latency proxy logs every request it makes (object
key, byte range served, status; see ``testkit.request_log``), cut at the timing loop's
boundaries: the warm-up, then each timed repeat. Right after each repeat (while the
measuring worker waits, before its next repeat) this module replays that repeat's sequence
with lean clients in a process of its own (the replay service), GET for GET, on the same
objects, so system and replay see the same machine (on a shared machine, a replay minutes
later moved the ratios by about ±30%):

- the same keys and the same byte ranges (an open-ended or suffix ``Range`` replays as the
  absolute range the server answered; a GET without ``Range`` replays whole), in the
  recorded order, so the server sees the same objects at the same mix of sizes: a SeaweedFS
  range GET costs with the size of the object it reads, not only of the range
  (docs/design.md), which synthetic objects cannot reproduce;
- at the same concurrency: ``c`` windows in flight with a window's GETs together, i.e.
  ``round(c x GETs per window)`` GETs in flight; systems that choose their own concurrency
  (DataLoaders with prefetching workers) are replayed at the mean number of requests the
  proxy saw in flight during their repeats (their time in flight over the repeats' time,
  rounded up): the load they put on the server on average, where their peak is a burst;
- repeat by repeat: the warm-up untimed, then each repeat's GETs timed on their own, so
  the replay's windows/s is "the windows of that repeat, in the time their GETs alone take",
  and the ratio is taken per repeat (its median and spread are reported). The in-flight
  count is taken per repeat too (its GETs per window, or the proxy's mean in flight).
  The untimed warm-up also keeps the replay's GETs in flight long enough to open its whole
  connection pool, as the system's own warm-up and open did for it.

Two clients, so the ceiling is not one client's artefact: aiohttp signing with botocore's
SigV4 (the Python cost a signing client pays per request) and obstore (Rust). Requests
other than successful object GETs (listings, HEADs, errors) are not replayed and are
counted. A system's *ratio* is its windows/s over the better replay's, repeat for repeat the
same GETs: 1.0 means it is as fast as its own GETs allow here; a system that serves most
windows from a local cache spends little of its time in GETs and shows a small ratio.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.measure import cpu_seconds
from benchmarks.s3env import S3Endpoint
from benchmarks.systems.base import run_lanes

CLIENTS = ("aiohttp", "obstore")
VERIFY_GETS = 3  # GETs per recording compared byte for byte with the prepared files


@dataclass(frozen=True)
class Get:
    """One object GET to replay: ``[start, stop)`` of ``key``, or the whole object."""

    key: str
    start: int | None  # None: a GET without Range
    stop: int | None
    size: int  # body bytes the recorded response carried

    @property
    def ranged(self) -> bool:
        return self.start is not None


def replayable(entries: list[dict[str, Any]], bucket: str) -> tuple[list[Get], int]:
    """The successful object GETs of ``entries`` in order, and how many others were left.

    ``entries`` are the proxy's log entries as JSON (``LoggedRequest.to_json``).
    """
    gets: list[Get] = []
    left = 0
    for e in entries:
        path = str(e["path"]).lstrip("/")
        got_bucket, _, key = path.partition("/")
        status = e.get("status")
        if e["method"] != "GET" or not key or got_bucket != bucket or status not in (200, 206):
            left += 1
            continue
        served = e.get("served")
        if status == 206 and served:
            gets.append(Get(key, int(served[0]), int(served[1]), int(e["body_bytes"])))
        else:
            gets.append(Get(key, None, None, int(e["body_bytes"])))
    return gets, left


def peak_in_flight(entries: list[dict[str, Any]]) -> int:
    """Most requests of ``entries`` in flight at once (from arrival and finish times)."""
    events = sorted(
        [(float(e["arrived"]), 1) for e in entries] + [(float(e["finished"]), -1) for e in entries],
        key=lambda ev: (ev[0], ev[1]),  # a finish before an arrival at the same instant
    )
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def mean_in_flight(entries: list[dict[str, Any]], seconds: float) -> float:
    """Requests of ``entries`` in flight on average over ``seconds`` (Little's law)."""
    busy = sum(float(e["finished"]) - float(e["arrived"]) for e in entries)
    return busy / seconds if seconds > 0 else 0.0


def save_log(path: Path, phases: list[list[dict[str, Any]]], meta: dict[str, Any]) -> None:
    """Write the recorded phases (warm-up first, then one per timed repeat)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "phases": phases}))


def load_log(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def lanes_for(
    concurrency: int, gets: int, windows: int, own_concurrency: bool, mean: float | None
) -> int:
    """GETs in flight for the replay: ``c`` windows' worth, or the system's observed mean."""
    if own_concurrency:
        return max(1, math.ceil(mean or 0))
    per_window = gets / windows if windows else 0.0
    return max(1, round(concurrency * per_window))


# --------------------------------------------------------------------------- clients


class Client(ABC):
    """A lean S3 client doing nothing but the GETs it is given."""

    name: str

    def __init__(self, endpoint: S3Endpoint) -> None:
        self.endpoint = endpoint

    @abstractmethod
    async def connect(self) -> None: ...

    async def close(self) -> None:
        return None

    @abstractmethod
    async def get(self, g: Get) -> Any:
        """The body of ``g``; raises when it is not exactly ``g.size`` bytes."""


def _check_size(g: Get, size: int) -> None:
    if size != g.size:
        raise OSError(f"GET {g.key} [{g.start}, {g.stop}): {size} bytes, expected {g.size}")


class AiohttpClient(Client):
    """aiohttp + botocore SigV4: signing costs Python CPU, as in any boto-family client."""

    name = "aiohttp"

    async def connect(self) -> None:
        import aiohttp
        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials

        ep = self.endpoint
        self._base = f"{ep.proxy_url}/{ep.bucket}"
        self._signer = S3SigV4Auth(Credentials(ep.access_key, ep.secret_key), "s3", ep.region)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=120),
            auto_decompress=False,
        )

    async def close(self) -> None:
        await self._session.close()

    async def get(self, g: Get) -> bytes:
        from botocore.awsrequest import AWSRequest

        url = f"{self._base}/{g.key}"
        headers = {"Range": f"bytes={g.start}-{g.stop - 1}"} if g.stop is not None else {}
        req = AWSRequest(method="GET", url=url, headers=headers)
        self._signer.add_auth(req)
        async with self._session.get(url, headers=dict(req.headers.items())) as resp:
            if resp.status != (206 if g.ranged else 200):
                raise OSError(f"GET {url}: HTTP {resp.status}: {await resp.text()}")
            body = await resp.read()
        _check_size(g, len(body))
        return body


class ObstoreClient(Client):
    """obstore (Rust ``object_store``): the leanest client available from PyPI."""

    name = "obstore"

    async def connect(self) -> None:
        from obstore.store import S3Store

        ep = self.endpoint
        config: Any = {
            "endpoint": ep.proxy_url,
            "access_key_id": ep.access_key,
            "secret_access_key": ep.secret_key,
            "region": ep.region,
            "virtual_hosted_style_request": False,
        }
        client: Any = {"allow_http": True, "pool_max_idle_per_host": "1024", "timeout": "120s"}
        self._store = S3Store(ep.bucket, config=config, client_options=client)

    async def get(self, g: Get) -> Any:
        import obstore

        if g.stop is not None:
            data = await obstore.get_range_async(self._store, g.key, start=g.start, end=g.stop)
        else:
            data = await (await obstore.get_async(self._store, g.key)).bytes_async()
        _check_size(g, len(data))
        return data  # obstore.Bytes: a zero-copy buffer, what a lean reader would keep


def make_client(name: str, endpoint: S3Endpoint) -> Client:
    return {"aiohttp": AiohttpClient, "obstore": ObstoreClient}[name](endpoint)


async def _replay(client: Client, gets: list[Get], lanes: int) -> int:
    async def one(i: int) -> int:
        return len(await client.get(gets[i]))

    return await run_lanes(range(len(gets)), lanes, one)


# --------------------------------------------------------------------------- the worker


def _warm_up(warm: list[Get], repeats: list[list[Get]], lanes: int) -> list[Get]:
    """The recorded warm-up, topped up from the repeats' GETs (cycled) to at least
    ``2 x lanes`` GETs: every lane then opens its connection before the timed part."""
    pool = [g for gets in repeats for g in gets] or warm
    extra = max(0, 2 * lanes - len(warm))
    return warm + [pool[i % len(pool)] for i in range(extra)] if pool else warm


def _verify(client: Client, gets: list[Get], objects_root: Path, loop: Any) -> bool:
    """The first GETs' bytes against the prepared files they were uploaded from."""
    for g in gets[:VERIFY_GETS]:
        body = bytes(loop.run_until_complete(client.get(g)))
        with open(objects_root / g.key, "rb") as f:
            if g.start is not None:
                f.seek(g.start)
                expected = f.read(g.stop - g.start)  # type: ignore[operator]
            else:
                expected = f.read()
        if body != expected:
            return False
    return True


class ReplaySession:
    """The replay of one measurement, repeat by repeat, as the system's repeats finish.

    The system's warm-up phase arrives first (untimed, kept to warm the clients up), then
    each timed repeat's phase: its GETs are replayed at once by each client, timed, while
    the measuring worker waits, so the replay sees the machine the repeat just saw. The
    clients (and their connection pools) live for the whole measurement.
    """

    def __init__(self, meta: dict[str, Any], endpoint: S3Endpoint, objects_root: Path) -> None:
        self.endpoint = endpoint
        self.objects_root = objects_root
        self.warm: list[Get] = []
        self.warmed_lanes = 0
        self.loops: dict[str, Any] = {}
        self.clients: dict[str, Client] = {}
        self.out: dict[str, Any] = {
            key: meta[key] for key in ("system", "label", "workload", "concurrency")
        }
        self.own_concurrency = bool(meta.get("own_concurrency"))
        self.out.update(
            lanes=[], windows=[], gets=[], bytes=[], left_out=0, verified=None,
            clients={name: {"seconds": [], "cpu_s": []} for name in CLIENTS},
        )  # fmt: skip

    def warm_up(self, entries: list[dict[str, Any]]) -> None:
        self.warm, left = replayable(entries, self.endpoint.bucket)
        self.out["left_out"] += left

    def _client(self, name: str) -> Client | None:
        figures = self.out["clients"][name]
        if "error" in figures:
            return None
        if name not in self.clients:
            loop = asyncio.new_event_loop()
            client = make_client(name, self.endpoint)
            self.loops[name], self.clients[name] = loop, client
            loop.run_until_complete(client.connect())
        return self.clients[name]

    def repeat(self, entries: list[dict[str, Any]], windows: int, seconds: float) -> dict[str, Any]:
        """Replay one timed repeat's GETs with each client; its figures."""
        gets, left = replayable(entries, self.endpoint.bucket)
        lanes = (
            max(1, math.ceil(mean_in_flight(entries, seconds)))
            if self.own_concurrency
            else lanes_for(int(self.out["concurrency"]), len(gets), windows, False, None)
        )
        out = self.out
        out["left_out"] += left
        for key, value in (
            ("lanes", lanes), ("windows", windows), ("gets", len(gets)),
            ("bytes", sum(g.size for g in gets)),
        ):  # fmt: skip
            out[key].append(value)
        figures: dict[str, Any] = {}
        for name in CLIENTS:
            mine = out["clients"][name]
            try:
                client = self._client(name)
                if client is None:
                    continue
                loop = self.loops[name]
                if gets and out["verified"] is None:
                    out["verified"] = _verify(client, gets, self.objects_root, loop)
                if gets and lanes > self.warmed_lanes:
                    # every lane opens its connection before the timed part
                    loop.run_until_complete(
                        _replay(client, _warm_up(self.warm, [gets], lanes), lanes)
                    )
                c0, t0 = cpu_seconds(), time.perf_counter()
                if gets:
                    loop.run_until_complete(_replay(client, gets, lanes))
                mine["seconds"].append(time.perf_counter() - t0)
                mine["cpu_s"].append(cpu_seconds() - c0)
                figures[name] = windows / mine["seconds"][-1] if gets else None
            except Exception as exc:  # reported in the table, never hidden
                traceback.print_exc()
                mine["error"] = f"{type(exc).__name__}: {exc}"
        if gets:
            self.warmed_lanes = max(self.warmed_lanes, lanes)
        return {"gets": len(gets), "lanes": lanes, "rates": figures}

    def close(self) -> dict[str, Any]:
        for name, client in self.clients.items():
            loop = self.loops[name]
            try:
                loop.run_until_complete(client.close())
            finally:
                loop.close()
        self.clients, self.loops = {}, {}
        return self.out


def serve(spec: dict[str, Any], write: Any) -> dict[str, Any]:
    """Worker mode ``replay-service``: replay sessions for the measuring workers, one at a time.

    Listens on loopback (its port written to ``spec["port_file"]``); a connection carries
    JSON lines: ``begin`` (the measurement's names and its warm-up phase), ``repeat`` (one
    timed repeat's phase, its windows and seconds; answered once replayed), ``end``
    (answered with the measurement's replay figures). A measuring worker in any interpreter
    talks to it with the standard library (:class:`InlineReplay`).
    """
    endpoint = S3Endpoint(**spec["endpoint"])
    objects_root = Path(spec["objects_root"])
    report: dict[str, Any] = {"sessions": 0}
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_file = Path(spec["port_file"])
        port_file.write_text(str(server.getsockname()[1]))
        while True:
            conn, _ = server.accept()
            session: ReplaySession | None = None
            with conn, conn.makefile("rwb") as stream:
                try:
                    for line in stream:
                        msg = json.loads(line)
                        answer: dict[str, Any] = {}
                        if msg["op"] == "begin":
                            session = ReplaySession(msg["meta"], endpoint, objects_root)
                            session.warm_up(msg["entries"])
                        elif msg["op"] == "repeat" and session is not None:
                            answer = session.repeat(
                                msg["entries"], int(msg["windows"]), float(msg["seconds"])
                            )
                        elif msg["op"] == "end" and session is not None:
                            answer = session.close()
                            session = None
                            report["sessions"] += 1
                            write(report)
                        stream.write(json.dumps(answer).encode() + b"\n")
                        stream.flush()
                except (OSError, ValueError):
                    traceback.print_exc()  # a worker killed mid-session: serve the next
                finally:
                    if session is not None:
                        session.close()


class InlineReplay:
    """The measuring worker's side of a replay session (standard library only).

    Passed to the proxy recorder as its ``after_cut``: the first phase (the warm-up) opens
    the session, every later one (a timed repeat) is replayed before the next repeat starts.
    """

    def __init__(self, address: str, meta: dict[str, Any]) -> None:
        self._meta = meta
        self._begun = False
        self._error: str | None = None
        self._sock: socket.socket | None = None
        try:
            host, _, port = address.rpartition(":")
            self._sock = socket.create_connection((host, int(port)), timeout=600)
            self._stream = self._sock.makefile("rwb")
        except OSError as exc:  # the row is still measured; its ceiling says why it is absent
            self._error = f"replay service unreachable: {type(exc).__name__}: {exc}"

    def _ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._stream.write(json.dumps(msg).encode() + b"\n")
        self._stream.flush()
        line = self._stream.readline()
        if not line:
            raise OSError("the replay service closed the connection")
        return json.loads(line)  # type: ignore[no-any-return]

    def __call__(self, entries: list[dict[str, Any]], windows: int, seconds: float) -> None:
        if self._error is not None:
            return
        try:
            if not self._begun:
                self._ask({"op": "begin", "meta": self._meta, "entries": entries})
                self._begun = True
                return
            self._ask({"op": "repeat", "entries": entries, "windows": windows, "seconds": seconds})
        except (OSError, ValueError) as exc:
            self._error = f"replay failed: {type(exc).__name__}: {exc}"

    def finish(self) -> dict[str, Any]:
        """The measurement's replay figures (``replay_rate``), or an ``error`` entry."""
        try:
            if self._error is None and self._begun:
                return self._ask({"op": "end"})
        except (OSError, ValueError) as exc:
            self._error = f"replay failed: {type(exc).__name__}: {exc}"
        finally:
            if self._sock is not None:
                self._stream.close()
                self._sock.close()
        names = ("system", "label", "workload", "concurrency")
        return {**{k: self._meta[k] for k in names}, "error": self._error or "no repeats"}


# --------------------------------------------------------------------------- figures


def replay_rate(replay: dict[str, Any], client: str) -> float | None:
    """Median over repeats (with GETs) of the repeat's windows per second of its replay."""
    figures = replay.get("clients", {}).get(client, {})
    seconds = figures.get("seconds")
    if not seconds:
        return None
    rates = sorted(
        w / s for w, s, g in zip(replay["windows"], seconds, replay["gets"], strict=True) if g and s
    )
    if not rates:
        return None
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def best_replay(replay: dict[str, Any]) -> tuple[str, float] | None:
    """The faster client and its replay windows/s, or None when nothing was replayed."""
    rates = [(c, r) for c in CLIENTS if (r := replay_rate(replay, c)) is not None]
    return max(rates, key=lambda cr: cr[1]) if rates else None


def repeat_ratios(replay: dict[str, Any], system_rates: list[float]) -> list[float]:
    """Per timed repeat, the system's windows/s over its own GETs' faster replay of it.

    ``system_rates`` are the system's repeats in order (``Measurement.samples``); repeats
    without GETs (served from a cache) have no ratio.
    """
    clients = replay.get("clients", {})
    out = []
    pairs = zip(replay.get("windows", []), replay.get("gets", []), strict=True)
    for k, (windows, gets) in enumerate(pairs):
        if not gets or k >= len(system_rates):
            continue
        rates = [
            windows / secs[k]
            for c in CLIENTS
            if len(secs := clients.get(c, {}).get("seconds", [])) > k and secs[k] > 0
        ]
        if rates:
            out.append(system_rates[k] / max(rates))
    return out
