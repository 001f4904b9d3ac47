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
import shutil
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


def main() -> None:
    from rangestream import StreamNumpyFormat, StreamStorage
    from rangestream.io.cache import summarize_cache
    from testkit import LatencyProxy, SeaweedFSServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8_000_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2)
    arguments = parser.parse_args()
    dtype = np.dtype([("tokens", "<i4")])
    tokens = np.arange(arguments.tokens, dtype="<i4") % 50_000
    work = Path(tempfile.mkdtemp(prefix="rs-cache-bench-"))
    rows: dict[str, list[dict[str, float]]] = {}
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
                plain = StreamStorage(url, StreamNumpyFormat(dtype), storage_options=proxied)
                proxy.reset_stats()
                seconds, windows = _epoch(_loader(plain))
                rows.setdefault("s3", []).append(
                    {"wps": windows / seconds, "gets": proxy.stats().method("GET")}
                )
                cache = work / f"cache{repeat}"
                cached = StreamStorage(url, StreamNumpyFormat(dtype), storage_options=proxied,
                                       cache_dir=str(cache), cache_bytes="8G")  # fmt: skip
                loader = _loader(cached)
                for epoch in ("e1", "e2"):
                    proxy.reset_stats()
                    seconds, windows = _epoch(loader)
                    rows.setdefault(f"s3+cache {epoch}", []).append(
                        {"wps": windows / seconds, "gets": proxy.stats().method("GET")}
                    )
                del loader
                used = windows * WINDOW * dtype.itemsize
                rows.setdefault("cache bytes per byte used", []).append(
                    {"wps": 0, "gets": summarize_cache(cache).bytes / used}
                )
    shutil.rmtree(work, ignore_errors=True)
    summary = {
        name: {key: float(np.median([r[key] for r in runs])) for key in ("wps", "gets")}
        for name, runs in rows.items()
    }
    print(json.dumps({"tokens": arguments.tokens, "latency_ms": arguments.latency_ms,
                      "rows": summary, "runs": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
