"""Opening a dataset, and its first read, as records and shards grow.

Run: ``python -m benchmarks.scale.open_cost --label after [--quick] [--s3] [--max-records N]``.

Series, for every kind: records ``10^3 .. 10^7`` in one shard, and shards ``1 .. 10^5`` of
one record each (past 1,000 shards, the shards beyond the first thousand are listed by a part
manifest without objects: opening reads only the root and the index, and the first read
touches shard 0; temporal shards are all written, up to 10^3). Per point: requests and
bytes of the open and of the first read (exact), memory traced over the open and the
first read (held afterwards, and peak), in a fresh process after a warm-up open of another
dataset of the kind (so imports are not counted), and the time of an open and of an open
plus first read (median and range over repeats). ``--s3`` adds the same over a local
SeaweedFS behind a proxy that adds 20 ms to every request.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from benchmarks.scale import harness

RECORDS = (10**3, 10**4, 10**5, 10**6, 10**7)
SHARDS = (1, 10, 100, 10**3, 10**4, 10**5)
REAL_SHARDS = 1000
TEMPORAL_MAX_SHARDS = 10**3


def measure(kind: str, url: str, warm_url: str, repeats: int, options: dict[str, Any]) -> dict:
    """Traced memory, counts and times of opening ``url`` (run in a fresh process)."""
    import tracemalloc

    def reader() -> Any:
        return harness.storage(kind, url, **options).sync_reader()

    warm = harness.storage(kind, warm_url, **options).sync_reader()
    with warm:
        harness.first_read(kind, warm)
    gc.collect()
    tracemalloc.start()
    opened = reader()
    opened.__enter__()
    held_open, peak_open = tracemalloc.get_traced_memory()
    at_open = opened.stats
    tracemalloc.reset_peak()
    harness.first_read(kind, opened)
    held_first, peak_first = tracemalloc.get_traced_memory()
    spent = opened.stats - at_open
    tracemalloc.stop()
    opened.close()

    def open_only() -> None:
        r = reader()
        r.__enter__()
        r.close()

    def open_and_read() -> None:
        r = reader()
        r.__enter__()
        harness.first_read(kind, r)
        r.close()

    return {
        "open_requests": at_open.requests,
        "open_bytes": at_open.bytes,
        "first_requests": spent.requests,
        "first_bytes": spent.bytes,
        "held_open_bytes": held_open,
        "peak_open_bytes": peak_open,
        "held_first_bytes": held_first,
        "peak_first_bytes": peak_first,
        "open_seconds": harness.timed(open_only, repeats),
        "open_first_seconds": harness.timed(open_and_read, repeats),
    }


def point(kind: str, url: str, warm_url: str, repeats: int, options: dict | None = None) -> dict:
    return harness.in_subprocess(
        "benchmarks.scale.open_cost:measure", kind, url, warm_url, repeats, options or {}
    )


def run(label: str, quick: bool, s3: bool, max_records: int = RECORDS[-1]) -> dict:
    records = [n for n in (RECORDS[:3] if quick else RECORDS) if n <= max_records]
    shards = SHARDS[:5] if quick else SHARDS
    data = harness.work_dir(label, "open")
    result: dict[str, Any] = {"library": harness.code_version(), "records": {}, "shards": {}}
    for kind in harness.KINDS:
        warm = str(data / f"{kind}-warm")
        harness.write_records(kind, warm, 3, 1)
        for n in records:
            url = str(data / f"{kind}-records-{n}")
            began = time.perf_counter()
            harness.write_records(kind, url, n, 1)
            written = time.perf_counter() - began
            row = point(kind, url, warm, 5 if n < 10**6 else 3)
            row["write_seconds"] = written
            result["records"].setdefault(kind, {})[str(n)] = row
            print(kind, "records", n, _line(row), flush=True)
            harness.shutil.rmtree(url)
        for n in shards:
            if kind == "temporal" and n > TEMPORAL_MAX_SHARDS:
                continue
            url = str(data / f"{kind}-shards-{n}")
            began = time.perf_counter()
            if kind == "temporal" or n <= REAL_SHARDS:
                harness.write_records(kind, url, n, n)
            else:
                harness.write_claimed(kind, url, n, REAL_SHARDS)
            written = time.perf_counter() - began
            row = point(kind, url, warm, 5)
            row["write_seconds"] = written
            result["shards"].setdefault(kind, {})[str(n)] = row
            print(kind, "shards", n, _line(row), flush=True)
            harness.shutil.rmtree(url)
    if s3:
        result["s3"] = run_s3(label, quick)
    return result


def run_s3(label: str, quick: bool) -> dict:
    """Open and first read over SeaweedFS behind a 20 ms proxy, for a few points."""
    from benchmarks.s3env import S3Environment

    out: dict[str, Any] = {}
    with S3Environment(harness.work_dir(label, "s3env"), latency_ms=20.0) as env:
        endpoint = env.endpoint
        assert endpoint is not None
        options = {
            "storage_options": {
                "key": endpoint.access_key,
                "secret": endpoint.secret_key,
                "client_kwargs": {
                    "endpoint_url": endpoint.proxy_url,
                    "region_name": endpoint.region,
                },
            }
        }
        direct = {
            "key": endpoint.access_key,
            "secret": endpoint.secret_key,
            "client_kwargs": {"endpoint_url": endpoint.direct_url, "region_name": endpoint.region},
        }
        for kind in ("stream", "document"):
            warm = f"s3://{endpoint.bucket}/{label}/{kind}-warm"
            harness.write_claimed(kind, warm, 1, 1, direct)
            for n in (1, 10**3) if quick else (1, 10**3, 10**5):
                url = f"s3://{endpoint.bucket}/{label}/{kind}-shards-{n}"
                harness.write_claimed(kind, url, n, min(n, 10), direct)
                row = point(kind, url, warm, 5, options)
                out.setdefault(kind, {})[str(n)] = row
                print("s3", kind, "shards", n, _line(row), flush=True)
        for n in (10**3,) if quick else (10**3, 10**6):
            kind = "temporal"
            warm = f"s3://{endpoint.bucket}/{label}/temporal-warm"
            harness.write_records(kind, warm, 3, 1, storage_options=direct)
            url = f"s3://{endpoint.bucket}/{label}/temporal-records-{n}"
            harness.write_records(kind, url, n, 1, storage_options=direct)
            row = point(kind, url, warm, 3, options)
            out.setdefault("temporal-records", {})[str(n)] = row
            print("s3 temporal records", n, _line(row), flush=True)
    return out


def _line(row: dict) -> str:
    return (
        f"open {row['open_requests']} req {row['open_bytes']} B "
        f"{row['open_seconds']['median'] * 1e3:.2f} ms held {row['held_open_bytes'] / 1e6:.2f} MB "
        f"peak {row['peak_open_bytes'] / 1e6:.2f} MB | first {row['first_requests']} req "
        f"{row['first_bytes']} B held {row['held_first_bytes'] / 1e6:.2f} MB "
        f"open+first {row['open_first_seconds']['median'] * 1e3:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--max-records", type=int, default=RECORDS[-1])
    args = parser.parse_args()
    result = run(args.label, args.quick, args.s3, args.max_records)
    print(harness.save(args.label, "open", result))


if __name__ == "__main__":
    main()
