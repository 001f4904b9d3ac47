"""The cache tier over S3: two processes asking for overlapping ranges at once fetch each
byte once (counted at the proxy), and a process reads the part the other fetched."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import uuid
from pathlib import Path
from typing import Any

from support.s3 import S3Location

from rangestream.io import RangeReader, RangeRequest, open_store
from rangestream.io.cache import ByteCache
from testkit import LatencyProxy, S3Endpoint

SIZE = 64 * 1024
CONTENT = os.urandom(SIZE)
#: what each process asks: the first's two ranges are coalesced across the second's
ASKS = [[(0, 1000), (3000, 4000)], [(2000, 6000)]]


def ask(job: dict[str, Any], number: int, barrier: Any, out: Any) -> None:
    store = open_store(job["url"], job["options"])
    reader = RangeReader(store, cache=ByteCache(job["cache"], 1 << 20))
    requests = [RangeRequest(job["key"], start, end) for start, end in ASKS[number]]
    barrier.wait()
    datas = reader.fetch_sync(requests)
    exact = all(bytes(d) == CONTENT[r.start : r.end] for r, d in zip(requests, datas, strict=True))
    stats = reader.stats
    out.put((number, exact, stats.requests, stats.cache_bytes))


def test_two_processes_asking_at_once_fetch_each_byte_once(
    s3_url: S3Location, s3_server: S3Endpoint, s3_proxy: LatencyProxy, tmp_path: Path
) -> None:
    key = f"data/{uuid.uuid4().hex}/blob"
    bucket, prefix = s3_url.url.removeprefix("s3://").split("/", 1)
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=CONTENT)
    job = {"url": s3_url.url, "options": s3_proxy.merge_storage_options(s3_url.storage_options),
           "cache": str(tmp_path / "cache"), "key": key}  # fmt: skip
    s3_proxy.delay = 0.3  # both processes claim before either's GET returns
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(2), context.Queue()
    s3_proxy.start_request_log()
    processes = [context.Process(target=ask, args=(job, n, barrier, out)) for n in range(2)]
    for process in processes:
        process.start()
    results = sorted(out.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    log = [entry for entry in s3_proxy.stop_request_log() if entry.path.endswith(key)]
    assert [exact for _n, exact, _r, _b in results] == [True, True]
    spans = sorted(entry.served for entry in log if entry.served is not None)
    covered = sum(end - start for start, end in spans)
    assert covered == 6000  # [0, 6000) once: no byte by both processes
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # whoever claimed second read the other's bytes from the cache
    assert sum(served for _n, _e, _r, served in results) > 0
