"""Two block-shuffled epochs over S3 (+20 ms per request) with the node-local byte cache.

Run: ``python -m benchmarks.cache_epochs`` (``--tokens``, ``--latency-ms``, ``--repeats``).

One int32 token stream, windows of 2,049 tokens in batches of 8, two DataLoader workers
(fork), ``shuffle="block"``, as one rank. Rows, each in this interpreter, repeats alternated:

- ``local``: the same dataset on local disk (mapped reads; never cached);
- ``s3``: one epoch over the proxy without a cache;
- ``s3+cache e1`` / ``e2``: a fresh cache directory, the first epoch (cold) then the second.

Reports windows/s over the whole epoch (workers' start included), the GETs the proxy counted,
and for the cache the bytes its entries take per byte of windows used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = 2049
BATCH = 8


def _loader(storage: Any) -> Any:
    from rangestream import StatefulDataLoader

    return StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW - 1, batch_size=BATCH, num_workers=2, shuffle="block",
        shuffle_seed=1, multiprocessing_context="fork", drop_last=False,
    )  # fmt: skip


def _epoch(loader: Any) -> tuple[float, int]:
    started = time.perf_counter()
    windows = 0
    for batch in loader:
        windows += len(batch["tokens"])
    return time.perf_counter() - started, windows


def _peer(system: str, tokens: int, server: Any, proxy: Any, work: Path) -> dict[str, Any]:
    """Two epochs of a peer's cached loader (``cache_peers``, LitData here, MosaicML in its
    own virtualenv), GETs counted at the proxy between its ``ready`` and ``epoch`` lines."""
    from benchmarks.environment import mosaic_python

    python = sys.executable if system == "litdata" else str(mosaic_python())
    endpoint = server.endpoint
    command = [python, "-m", "benchmarks.cache_peers", "--system", system, "--tokens", str(tokens),
               "--endpoint", endpoint.endpoint_url, "--proxy", proxy.endpoint_url,
               "--key", endpoint.access_key, "--secret", endpoint.secret_key,
               "--region", endpoint.region, "--bucket", "bench", "--work", str(work)]  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=root, env={**os.environ, "PYTHONPATH": root})  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    rows: dict[str, Any] = {}
    for line in child.stdout:
        message = json.loads(line)
        if "ready" in message:
            proxy.reset_stats()
            child.stdin.write("go\n")
            child.stdin.flush()
            continue
        gets = proxy.stats().method("GET")
        windows = message["windows"]
        rows[f"{system} e{message['epoch']}"] = [{
            "wps": windows / message["seconds"], "gets": gets, "exact": message["exact"],
        }]  # fmt: skip
        rows[f"{system} disk bytes per byte used"] = [
            {"wps": 0, "gets": message["disk_bytes"] / max(1, windows * WINDOW * 4)}
        ]
    child.wait()
    return rows


def main() -> None:
    from rangestream import StreamNumpyFormat, StreamStorage
    from rangestream.io.cache import summarize_cache
    from testkit import LatencyProxy, SeaweedFSServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default="litdata,mosaic",
                        type=lambda text: [p for p in text.split(",") if p])  # fmt: skip
    arguments = parser.parse_args()
    dtype = np.dtype([("tokens", "<i4")])
    tokens = np.arange(arguments.tokens, dtype="<i4") % 50_000
    work = Path(tempfile.mkdtemp(prefix="rs-cache-bench-"))
    rows: dict[str, list[dict[str, float]]] = {}
    ratios: list[float] = []
    with SeaweedFSServer() as server:
        server.create_bucket("bench")
        url = "s3://bench/cache-epochs"
        for where, options in ((str(work / "local"), {}), (url, server.storage_options)):
            storage = StreamStorage(where, StreamNumpyFormat(dtype), storage_options=options)
            with storage.sync_writer(overwrite=True) as writer:
                writer.append(0, {"tokens": tokens[: len(tokens) // 2]})
                writer.append(1, {"tokens": tokens[len(tokens) // 2 :]})
        with LatencyProxy(server.endpoint, delay=arguments.latency_ms / 1000) as proxy:
            proxied = proxy.merge_storage_options(server.storage_options)
            for repeat in range(arguments.repeats):
                local = StreamStorage(str(work / "local"), StreamNumpyFormat(dtype))
                seconds, windows = _epoch(_loader(local))
                rows.setdefault("local", []).append({"wps": windows / seconds, "gets": 0})
                # no cache and a cold cache alternate which goes first (drift on a shared
                # machine falls on both): the cold epoch's cost is their ratio per repeat
                pair: dict[str, float] = {}
                for kind in ("s3", "cache") if repeat % 2 == 0 else ("cache", "s3"):
                    if kind == "s3":
                        plain = StreamStorage(url, StreamNumpyFormat(dtype),
                                              storage_options=proxied)  # fmt: skip
                        proxy.reset_stats()
                        seconds, windows = _epoch(_loader(plain))
                        pair["s3"] = seconds
                        rows.setdefault("s3", []).append(
                            {"wps": windows / seconds, "gets": proxy.stats().method("GET")}
                        )
                        continue
                    cache = work / f"cache{repeat}"
                    cached = StreamStorage(url, StreamNumpyFormat(dtype), storage_options=proxied,
                                           cache_dir=str(cache), cache_bytes="8G")  # fmt: skip
                    loader = _loader(cached)
                    for epoch in ("e1", "e2"):
                        proxy.reset_stats()
                        seconds, windows = _epoch(loader)
                        if epoch == "e1":
                            pair["cache"] = seconds
                        rows.setdefault(f"s3+cache {epoch}", []).append(
                            {"wps": windows / seconds, "gets": proxy.stats().method("GET")}
                        )
                    del loader
                    used = windows * WINDOW * dtype.itemsize
                    rows.setdefault("cache bytes per byte used", []).append(
                        {"wps": 0, "gets": summarize_cache(cache).bytes / used}
                    )
                ratios.append(pair["cache"] / pair["s3"])
            for system in arguments.peers:
                rows.update(_peer(system, arguments.tokens, server, proxy, work / system))
    shutil.rmtree(work, ignore_errors=True)
    summary = {
        name: {key: float(np.median([r[key] for r in runs])) for key in ("wps", "gets")}
        | ({"exact": all(r["exact"] for r in runs)} if "exact" in runs[0] else {})
        for name, runs in rows.items()
    }
    cold = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios),
            "ratios": ratios} if ratios else {}  # fmt: skip
    print(json.dumps({"tokens": arguments.tokens, "latency_ms": arguments.latency_ms,
                      "cold_over_no_cache_seconds": cold, "load": os.getloadavg(),
                      "rows": summary, "runs": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
