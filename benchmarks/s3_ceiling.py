"""The S3 ceiling: each system's own GETs replayed by a bare client at its concurrency.

While a system is measured over S3, the latency proxy logs every request it makes (object
key, byte range served, status; see ``testkit.request_log``), cut at the timing loop's
boundaries: the warm-up, then each timed repeat. After every system has run, this module
replays each recorded sequence with a lean client, GET for GET, on the same objects:

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
  the replay's windows/s is "the windows of that repeat, in the time their GETs alone take".
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


def replay_one(
    recording: dict[str, Any], endpoint: S3Endpoint, objects_root: Path
) -> dict[str, Any]:
    """Replay one recorded measurement with each client; its figures per repeat."""
    log = load_log(Path(recording["log"]))
    phases = log["phases"]
    warmup, repeats = phases[0], phases[1:]
    warm_gets, _ = replayable(warmup, endpoint.bucket)
    repeat_gets: list[list[Get]] = []
    left = 0
    for phase in repeats:
        gets, others = replayable(phase, endpoint.bucket)
        repeat_gets.append(gets)
        left += others
    windows = [int(w) for w in recording["windows"]]
    total_gets = sum(len(g) for g in repeat_gets)
    lanes = lanes_for(
        int(recording["concurrency"]),
        total_gets,
        sum(windows),
        bool(recording.get("own_concurrency")),
        recording.get("mean_in_flight"),
    )
    out: dict[str, Any] = {
        key: recording[key] for key in ("system", "label", "workload", "concurrency")
    }
    out.update(
        lanes=lanes,
        windows=windows,
        gets=[len(g) for g in repeat_gets],
        bytes=[sum(x.size for x in g) for g in repeat_gets],
        left_out=left,
        verified=None,
        clients={},
    )
    if total_gets == 0:
        return out
    for name in CLIENTS:
        loop = asyncio.new_event_loop()
        client = make_client(name, endpoint)
        try:
            loop.run_until_complete(client.connect())
            if out["verified"] is None:
                first = next(g for g in repeat_gets if g)
                out["verified"] = _verify(client, first, objects_root, loop)
            loop.run_until_complete(_replay(client, _warm_up(warm_gets, repeat_gets, lanes), lanes))
            seconds, cpu = [], []
            for gets in repeat_gets:
                c0, t0 = cpu_seconds(), time.perf_counter()
                loop.run_until_complete(_replay(client, gets, lanes))
                seconds.append(time.perf_counter() - t0)
                cpu.append(cpu_seconds() - c0)
            out["clients"][name] = {"seconds": seconds, "cpu_s": cpu}
        except Exception as exc:  # reported in the table, never hidden
            traceback.print_exc()
            out["clients"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            loop.run_until_complete(client.close())
            loop.close()
    return out


def replay(spec: dict[str, Any], write: Any) -> dict[str, Any]:
    """Worker mode ``replay``: every recording of the run, results written after each."""
    endpoint = S3Endpoint(**spec["endpoint"])
    objects_root = Path(spec["objects_root"])
    report: dict[str, Any] = {"replays": []}
    for recording in spec["recordings"]:
        try:
            report["replays"].append(replay_one(recording, endpoint, objects_root))
        except Exception as exc:
            traceback.print_exc()
            report["replays"].append(
                {
                    **{k: recording[k] for k in ("system", "label", "workload", "concurrency")},
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
        write(report)
    return report


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
