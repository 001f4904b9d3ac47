"""Committing a write of many parts (one per writer), locally and over S3.

Run: ``python -m benchmarks.scale.commit --label after [--quick]``.

For ``P`` parts of 100 shards each (stream kind; the parts are written as writers write
them, the shards they list hold no objects: the commit reads parts, not shard data), the
time of ``session.commit()`` and the CPU time this process spent in it (all its threads:
the caller and the I/O loop; robust to other load on a shared machine where wall times
are not), median and range over three commits, on local disk and over
a local SeaweedFS, directly and behind a proxy adding 20 ms to every request; over the
proxy also its counts: requests by method and the most requests it saw in flight at once.
``local_v1``: local disk again, with parts of the first format (one JSON object per shard),
which older writers wrote and commits still read.

Each series commits over the same URL, so from its third commit on each commit also
retires the version two back (lists and deletes its objects: here its parts). The
``*_first`` series commit 1,000 parts to a fresh URL each time: a first write, which
retires nothing.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from typing import Any

from benchmarks.scale import harness

PARTS = (1, 10, 100, 1000)
SHARDS_PER_PART = 100
REPEATS = 3


def prepare(url: str, parts: int, options: dict[str, Any], part_format: int = 2) -> Any:
    """A session whose ``parts`` parts (of ``part_format``) list 100 shards each."""

    storage = harness.storage("stream", url, **options)
    session = storage.parallel_write(overwrite=True)
    lengths = harness.claim("stream")
    for part in range(parts):
        shards = range(part * SHARDS_PER_PART, (part + 1) * SHARDS_PER_PART)
        if part_format == 1:
            first = {"part_id": f"p{part}", "shards": {str(s): lengths for s in shards}}
            document = json.dumps(first).encode()
        else:
            from rangestream.storage.core.parts import part_document

            document = part_document(f"p{part}", {s: lengths for s in shards})
        harness.put(storage, f"{session.prefix}/parts/p{part}.json", document)
    return session


def series(
    where: str,
    url: str,
    options: dict[str, Any],
    stats_url: str | None,
    parts: tuple,
    part_format: int = 2,
    first_write: bool = False,
) -> dict:
    out = {}
    for count in parts:
        times, cpu, counts = [], [], None
        for repeat in range(REPEATS):
            target = f"{url}-{count}-{repeat}" if first_write else url
            session = prepare(target, count, options, part_format)
            if stats_url is not None:
                _post(stats_url.replace("/stats", "/reset"))
            began, began_cpu = time.perf_counter(), time.process_time()
            session.commit(check_objects=False)  # claimed shards: no objects
            times.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
            if stats_url is not None:
                stats = json.loads(urllib.request.urlopen(stats_url, timeout=10).read())
                methods = dict(stats["requests_by_method"])  # the reset is not counted
                counts = {
                    "requests_by_method": {k: v for k, v in methods.items() if v},
                    "max_in_flight": stats["max_in_flight"],
                }
        out[str(count)] = {
            "seconds": harness.spread(times),
            "cpu_seconds": harness.spread(cpu),
            "proxy": counts,
        }
        print(where, count, out[str(count)], flush=True)
    return out


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10).read()


def run(label: str, quick: bool, part_format: int = 2) -> dict:
    """Every series; ``part_format`` 1 measures code from before the columnar parts."""
    from benchmarks.s3env import S3Environment

    parts = PARTS[:3] if quick else PARTS
    result: dict[str, Any] = {"library": harness.code_version(), "shards_per_part": SHARDS_PER_PART}
    local = harness.fresh_dir(harness.work_dir(label, "commit") / "local")
    result["local"] = series("local", str(local / "ds"), {}, None, parts, part_format)
    result["local_v1"] = series("local_v1", str(local / "ds_v1"), {}, None, parts, part_format=1)
    with S3Environment(harness.work_dir(label, "s3env"), latency_ms=20.0) as env:
        endpoint = env.endpoint
        assert endpoint is not None
        for name, endpoint_url, stats in (
            ("s3", endpoint.direct_url, None),
            ("s3_20ms", endpoint.proxy_url, endpoint.stats_url),
        ):
            options = {
                "storage_options": {
                    "key": endpoint.access_key,
                    "secret": endpoint.secret_key,
                    "client_kwargs": {"endpoint_url": endpoint_url, "region_name": endpoint.region},
                }
            }
            url = f"s3://{endpoint.bucket}/{label}/commit-{name}"
            result[name] = series(name, url, options, stats, parts, part_format)
            if not quick:
                first = f"{name}_first"
                result[first] = series(
                    first, url, options, stats, parts[-1:], part_format, first_write=True
                )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--part-format",
        type=int,
        choices=(1, 2),
        default=2,
        help="the parts' format (1: for a baseline of code from before columnar parts)",
    )
    args = parser.parse_args()
    print(harness.save(args.label, "commit", run(args.label, args.quick, args.part_format)))


if __name__ == "__main__":
    main()
