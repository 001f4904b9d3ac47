"""Requests and bytes per window on S3, GCS and Azure, the same data on each (emulators).

Run: ``python -m benchmarks.cloud_requests``. Starts SeaweedFS (S3), gcp-storage-emulator
(GCS) and Azurite (Azure) on loopback, writes the same datasets to each (a 3M-token
stream, 2,000 documents, 60 temporal records of 64-dim float32 frames) and reads the same
requests through a counting proxy: 2048-token random windows, random documents, 64-frame
temporal windows. Prints one row per service and workload: the open (requests, bytes),
then the reads (requests, range GETs, whole-object GETs, bytes, bytes per payload byte).
Counts only: emulators say nothing about the services' latency or throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream import (
    DocumentPickleFormat,
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    TemporalArrayStorage,
)
from rangestream.io.conditional_writes import SINGLE_WRITER_ANY_ENV
from testkit import LatencyProxy, SeaweedFSServer
from testkit.azurite import Azurite
from testkit.gcs_emulator import GcsEmulator

BUCKET = "rangestream-bench"
TOKENS = np.dtype([("tokens", "<i4")])
WINDOW, WINDOWS = 2048, 64
DOCUMENTS, DOCUMENT_READS = 2000, 64
RECORDS, FRAMES, FRAME_READS = 60, 64, 64


@dataclass
class Service:
    """One emulator: its name, URL scheme and how to reach it (directly, or via a proxy)."""

    name: str
    url: str
    options: Callable[[str], dict[str, Any]]
    endpoint_url: str


@dataclass
class Row:
    service: str
    workload: str
    open_requests: int
    open_bytes: int
    requests: int
    range_gets: int
    whole_gets: int
    response_bytes: int
    payload_bytes: int

    @property
    def per_payload(self) -> float:
        return self.response_bytes / self.payload_bytes


@contextlib.contextmanager
def services() -> Iterator[list[Service]]:
    with SeaweedFSServer() as weed, GcsEmulator() as gcs, Azurite() as azurite:
        weed.create_bucket(BUCKET)
        gcs.create_bucket(BUCKET)
        azurite.create_container(BUCKET)
        base = weed.storage_options
        yield [
            Service("s3 (SeaweedFS)", f"s3://{BUCKET}",
                    lambda url: {**base, "client_kwargs": {**base.get("client_kwargs", {}),
                                                          "endpoint_url": url}},
                    weed.endpoint_url),
            Service("gcs (emulator)", f"gs://{BUCKET}", GcsEmulator.storage_options_for,
                    gcs.endpoint_url),
            Service("azure (Azurite)", f"az://{BUCKET}", Azurite.storage_options_for,
                    azurite.endpoint_url),
        ]  # fmt: skip


def write_all(service: Service, prefix: str, seed: int) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    options = service.options(service.endpoint_url)
    urls = {kind: f"{service.url}/{prefix}/{kind}" for kind in ("stream", "documents", "temporal")}
    stream = StreamStorage(urls["stream"], StreamNumpyFormat(TOKENS), storage_options=options)
    with stream.sync_writer() as writer:
        for shard in range(4):
            writer.append(shard, {"tokens": rng.integers(0, 50_000, 750_000, dtype="<i4")})
    documents = DocumentStorage(urls["documents"], DocumentPickleFormat(),
                                storage_options=options)  # fmt: skip
    with documents.sync_writer() as writer:
        for i in range(DOCUMENTS):
            writer.append(i % 4, {"i": i, "tokens": rng.integers(0, 50_000, 50 + i % 900)})
    temporal = TemporalArrayStorage(urls["temporal"], storage_options=options)
    with temporal.sync_writer() as writer:
        for i in range(RECORDS):
            frames = 200 + 37 * i
            writer.append(i % 4, {"features": rng.random((frames, 64), dtype=np.float32)})
    return urls


def measure(service: Service, urls: dict[str, str], seed: int) -> list[Row]:
    rows = []
    with LatencyProxy(service.endpoint_url, delay=0.0) as proxy:
        options = service.options(proxy.endpoint_url)
        rng = np.random.default_rng(seed)
        for workload, opened, read in (
            ("token windows", lambda: StreamStorage(urls["stream"], storage_options=options),
             lambda reader: _windows(reader, rng)),
            ("documents", lambda: DocumentStorage(urls["documents"], DocumentPickleFormat(),
                                                  storage_options=options),
             lambda reader: _documents(reader, rng)),
            ("temporal windows", lambda: TemporalArrayStorage(urls["temporal"],
                                                              storage_options=options),
             lambda storage: _frames(storage, rng)),
        ):  # fmt: skip
            proxy.reset_stats()
            storage = opened()
            with contextlib.ExitStack() as stack:
                if workload == "temporal windows":
                    target: Any = storage
                    _ = storage.frame_counts[0]
                else:
                    target = stack.enter_context(storage.sync_reader())
                    _ = target.num_shards
                opening = proxy.stats()
                proxy.reset_stats()
                proxy.start_request_log()
                payload = read(target)
                stats, log = proxy.stats(), proxy.stop_request_log()
            rows.append(Row(
                service.name, workload, opening.requests, opening.response_bytes,
                stats.requests, stats.range_gets,
                sum(1 for entry in log if entry.method == "GET" and entry.range is None),
                stats.response_bytes, payload,
            ))  # fmt: skip
    return rows


def _windows(reader: Any, rng: np.random.Generator) -> int:
    total = reader.total_length
    for start in rng.integers(0, total - WINDOW, WINDOWS):
        reader.read(int(start), WINDOW)
    return WINDOWS * WINDOW * TOKENS.itemsize


def _documents(reader: Any, rng: np.random.Generator) -> int:
    payload = 0
    for index in rng.integers(0, DOCUMENTS, DOCUMENT_READS):
        document = reader.read(int(index))
        payload += int(np.asarray(document["tokens"]).nbytes)
    return payload


def _frames(storage: Any, rng: np.random.Generator) -> int:
    counts = np.asarray(storage.frame_counts)
    for record in rng.integers(0, RECORDS, FRAME_READS):
        start = int(rng.integers(0, counts[record] - FRAMES))
        storage.read_window(int(record), start=start, frames=FRAMES)
    return FRAME_READS * FRAMES * 64 * 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cloud_requests",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    # the GCS emulator ignores ifGenerationMatch: its commits need one writer declared
    os.environ[SINGLE_WRITER_ANY_ENV] = "1"
    rows: list[Row] = []
    with services() as found:
        for service in found:
            urls = write_all(service, f"bench-{uuid.uuid4().hex[:8]}", arguments.seed)
            rows += measure(service, urls, arguments.seed + 1)
    header = (f"{'service':<16} {'workload':<17} {'open req':>8} {'open B':>8} {'requests':>8} "
              f"{'range':>6} {'whole':>6} {'bytes':>10} {'B/payload B':>11}")  # fmt: skip
    print(header)
    for row in rows:
        print(f"{row.service:<16} {row.workload:<17} {row.open_requests:>8} {row.open_bytes:>8} "
              f"{row.requests:>8} {row.range_gets:>6} {row.whole_gets:>6} "
              f"{row.response_bytes:>10} {row.per_payload:>11.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
