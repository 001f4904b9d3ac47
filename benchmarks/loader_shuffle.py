"""Shuffled (and sequential) DataLoader epochs, rangestream against LitData, local and S3.

Run: ``python -m benchmarks.loader_shuffle`` (``--tokens``, ``--repeats``, ``--only``,
``--latency-ms``, ``--systems``, ``--pythonpath DIR`` to measure another checkout's
``src``; ``--epochs N`` plays N epochs with one loader and reports each epoch's first batch
and the microseconds per window over all of them, epoch boundaries included;
``--workers`` and ``--persistent on|off`` set the loader's workers for A/B runs).

Every system loads windows of 2,049 tokens (2,048 and the next) of one int32 token stream in
batches of 8 with two DataLoader workers, as one rank of a training job, for one epoch:

- ``rs-seq``, ``rs-window``, ``rs-block``: ``StatefulDataLoader.from_storage`` with
  ``shuffle=False``, ``"window"`` (the per-window shuffle) and ``"block"``;
- ``litdata``: LitData's ``StreamingDataLoader(StreamingDataset(shuffle=True))`` over the same
  tokens ``optimize``-d into 4 MB chunks with ``TokensLoader`` (``cold``: empty cache, as a
  job starts; LitData downloads whole chunks to local disk, counted).

Each system runs in its own fresh interpreter (so no import or connection is shared) and
reports: the time from ``iter(loader)`` to the first batch, windows per second after the first
200 batches, and over S3 the GET requests the 20 ms latency proxy counted per window.
Local rows read the prepared files directly. Repeats alternate the systems.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

TOKEN = np.dtype("<i4")
WINDOW = 2049
BATCH = 8
WORKERS = 2
WARMUP_BATCHES = 200
LITDATA_CHUNK_BYTES = 4_000_000
SYSTEMS = ("rs-seq", "rs-window", "rs-block", "litdata")


def _litdata_chunk(path: str, tokens_per_chunk: int, total: int, i: int) -> np.ndarray:
    stream = np.memmap(path, TOKEN, "r")
    return np.array(stream[i * tokens_per_chunk : min((i + 1) * tokens_per_chunk, total)])


def prepare(work: Path, tokens: int, litdata: bool) -> None:
    """The rangestream dataset and LitData's optimized copy of the same tokens."""
    from rangestream import StreamNumpyFormat, StreamStorage

    raw = work / "tokens.i32"
    (np.arange(tokens, dtype=np.int64) % (2**31 - 1)).astype(TOKEN).tofile(raw)
    storage = StreamStorage(str(work / "rs"), StreamNumpyFormat(np.dtype([("tokens", TOKEN)])))
    data = np.memmap(raw, TOKEN, "r")
    with storage.sync_writer() as writer:
        for shard, part in enumerate(np.array_split(np.arange(tokens), 4)):
            writer.append(shard, {"tokens": np.asarray(data[part[0] : part[-1] + 1])})
    if litdata:
        from litdata import TokensLoader, optimize

        per_chunk = max(1, LITDATA_CHUNK_BYTES // (WINDOW * TOKEN.itemsize)) * WINDOW
        optimize(
            functools.partial(_litdata_chunk, str(raw), per_chunk, tokens),
            list(range(-(-tokens // per_chunk))),
            str(work / "litdata"),
            chunk_size=per_chunk,
            item_loader=TokensLoader(),
            num_workers=1,
            verbose=False,
        )


def _rs_loader(
    system: str, url: str, storage_options: dict[str, Any] | None, options: dict[str, Any]
) -> Any:
    from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage

    kwargs: dict[str, Any] = {}
    if storage_options:
        kwargs = {"storage_options": storage_options, "max_concurrency": 64}
    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("tokens", TOKEN)])), **kwargs)
    shuffle = {"rs-seq": False, "rs-window": True, "rs-block": "block"}[system]
    if system == "rs-window" and storage_options:
        shuffle = "window"
    return StatefulDataLoader.from_storage(
        storage, sequence_length=WINDOW - 1, next_token=True, batch_size=BATCH,
        shuffle=shuffle, **options,
    )  # fmt: skip


def _litdata_loader(work: Path, endpoint: dict[str, Any] | None) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    cache = work / f"litdata-cache-{os.getpid()}"
    shutil.rmtree(cache, ignore_errors=True)
    if endpoint:
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # the proxy is http://
        source = f"s3://{endpoint['bucket']}/{endpoint['prefix']}/litdata"
        options = {
            "endpoint_url": endpoint["proxy_url"],
            "aws_access_key_id": endpoint["access_key"],
            "aws_secret_access_key": endpoint["secret_key"],
            "region_name": endpoint["region"],
        }
    else:
        source, options = str(work / "litdata"), None
    dataset = StreamingDataset(
        source, cache_dir=str(cache), item_loader=TokensLoader(block_size=WINDOW),
        shuffle=True, seed=42, storage_options=options,
    )  # fmt: skip
    return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)


def measure_one(
    system: str, work: Path, endpoint: dict[str, Any] | None, settings: dict[str, Any]
) -> dict[str, Any]:
    """``settings["epochs"]`` epochs of ``system`` with one loader: each epoch's first
    batch, steady windows/s of the first epoch, microseconds per window over all epochs
    (epoch boundaries included), and over S3 requests and bytes read per window."""
    options: dict[str, Any] = {"num_workers": settings.get("workers", WORKERS)}
    if settings.get("persistent") in ("on", "off"):
        options["persistent_workers"] = settings["persistent"] == "on"
    if system == "litdata":
        loader = _litdata_loader(work, endpoint)
    elif endpoint:
        url = f"s3://{endpoint['bucket']}/{endpoint['prefix']}/rs"
        storage_options = {
            "key": endpoint["access_key"], "secret": endpoint["secret_key"],
            "client_kwargs": {"endpoint_url": endpoint["proxy_url"],
                              "region_name": endpoint["region"]},
            "config_kwargs": {"max_pool_connections": 64},
        }  # fmt: skip
        loader = _rs_loader(system, url, storage_options, options)
    else:
        loader = _rs_loader(system, str(work / "rs"), None, options)
    if endpoint:
        _reset_proxy(endpoint)
    firsts: list[float] = []
    windows = 0
    steady_from = 0.0
    steady_windows = 0
    first_epoch_end = 0.0
    first_epoch_windows = 0
    began = time.perf_counter()
    for epoch in range(int(settings.get("epochs", 1))):
        started = time.perf_counter()
        for number, batch in enumerate(loader):
            rows = batch.shape[0] if hasattr(batch, "shape") else batch["tokens"].shape[0]
            windows += rows
            if number == 0:
                firsts.append(time.perf_counter() - started)
            if epoch == 0 and number == WARMUP_BATCHES:
                steady_from, steady_windows = time.perf_counter(), windows
        if epoch == 0:
            first_epoch_end, first_epoch_windows = time.perf_counter(), windows
    ended = time.perf_counter()
    result: dict[str, Any] = {
        "system": system,
        "windows": windows,
        "first_batch_s": firsts[0],
        "later_first_batch_s": firsts[1:],
        "windows_per_s": (first_epoch_windows - steady_windows) / (first_epoch_end - steady_from)
        if steady_from
        else first_epoch_windows / (first_epoch_end - began),
        "us_per_window": (ended - began) / max(windows, 1) * 1e6,
    }
    if len(firsts) > 1:
        result["later_first_batch_max_s"] = max(firsts[1:])
    if endpoint:
        gets, nbytes = _proxy_counts(endpoint)
        result["requests_per_window"] = gets / max(windows, 1)
        result["bytes_per_byte"] = nbytes / max(windows * WINDOW * TOKEN.itemsize, 1)
    if system == "litdata":
        cache = work / f"litdata-cache-{os.getpid()}"
        result["local_disk_mb"] = (
            sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 1e6
        )
        shutil.rmtree(cache, ignore_errors=True)
    return result


def _reset_proxy(endpoint: dict[str, Any]) -> None:
    request = urllib.request.Request(endpoint["stats_url"].replace("stats", "reset"),
                                     method="POST")  # fmt: skip
    urllib.request.urlopen(request, timeout=10).close()


def _proxy_counts(endpoint: dict[str, Any]) -> tuple[int, int]:
    """GET requests and response bytes the proxy counted since its last reset."""
    with urllib.request.urlopen(endpoint["stats_url"], timeout=10) as response:
        stats = json.loads(response.read())
    return int(stats["requests_by_method"].get("GET", 0)), int(stats["response_bytes"])


def _run_child(
    system: str,
    work: Path,
    endpoint: dict[str, Any] | None,
    pythonpath: str,
    settings: dict[str, Any],
) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "-m", "benchmarks.loader_shuffle", "--child", system,
            "--work", str(work), "--endpoint", json.dumps(endpoint),
            "--settings", json.dumps(settings)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode:
        raise RuntimeError(f"{system} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(rows: list[dict[str, Any]], key: str, digits: int) -> str:
    values = [row[key] for row in rows if key in row]
    if not values:
        return "-"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=12_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="local,s3")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--pythonpath", default="", help="measure rangestream from this src")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per loader")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--persistent", choices=("default", "on", "off"), default="default")
    parser.add_argument("--child")
    parser.add_argument("--work")
    parser.add_argument("--endpoint")
    parser.add_argument("--settings", default="{}")
    args = parser.parse_args(argv)
    if args.child:
        endpoint = json.loads(args.endpoint) if args.endpoint else None
        settings = json.loads(args.settings)
        print(json.dumps(measure_one(args.child, Path(args.work), endpoint, settings)))
        return 0
    settings = {"epochs": args.epochs, "workers": args.workers, "persistent": args.persistent}
    systems = args.systems.split(",")
    with tempfile.TemporaryDirectory(prefix="loader-shuffle-") as tmp:
        work = Path(tmp)
        prepare(work, args.tokens, "litdata" in systems)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        places = args.only.split(",")
        env_context: Any = None
        endpoint = None
        if "s3" in places:
            from benchmarks.s3env import S3Environment

            env_context = S3Environment(work, args.latency_ms)
            ep = env_context.start()
            prefix = "loader-shuffle"
            env_context.upload_dir(work / "rs", f"{prefix}/rs")
            if "litdata" in systems:
                env_context.upload_dir(work / "litdata", f"{prefix}/litdata")
            env_context.warm(prefix)
            endpoint = {
                "proxy_url": ep.proxy_url, "stats_url": ep.stats_url, "bucket": ep.bucket,
                "access_key": ep.access_key, "secret_key": ep.secret_key,
                "region": ep.region, "prefix": prefix,
            }  # fmt: skip
        try:
            for _ in range(args.repeats):
                for place in places:
                    for system in systems:
                        if place == "local" and system == "rs-block":
                            continue
                        if place == "s3" and system == "rs-seq":
                            continue
                        result = _run_child(system, work, endpoint if place == "s3" else None,
                                            args.pythonpath, settings)  # fmt: skip
                        print(place, json.dumps(result), flush=True)
                        results.setdefault((place, system), []).append(result)
        finally:
            if env_context is not None:
                env_context.close()
    print(
        "\n| place | system | first batch (s) | later epochs' first batch, worst (s) "
        "| windows/s | µs/window, all epochs | requests/window | bytes/byte | local disk MB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (place, system), rows in results.items():
        cells = [
            _cell(rows, "first_batch_s", 3),
            _cell(rows, "later_first_batch_max_s", 3),
            _cell(rows, "windows_per_s", 0),
            _cell(rows, "us_per_window", 1),
            _cell(rows, "requests_per_window", 4),
            _cell(rows, "bytes_per_byte", 3),
            _cell(rows, "local_disk_mb", 1),
        ]
        print(f"| {place} | {system} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
