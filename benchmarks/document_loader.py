"""Shuffled documents through the loader over S3: runs of documents against one by one.

Run: ``python -m benchmarks.document_loader`` (``--documents``, ``--repeats``,
``--latency-ms``).

Documents of 200 to 4,000 random bytes (8 shards) are written to a local SeaweedFS and read
through the latency proxy (20 ms a request by default) by
``StatefulDataLoader.from_storage(..., batch_size=16, num_workers=2)`` with
``shuffle="block"`` (runs of about 4 MiB of consecutive documents, the default over object
storage) and ``shuffle="window"`` (one document at a time), alternating, one whole epoch per
repeat. Reported: documents/s over the epoch (median and range), time to the first batch,
and the workers' exact requests per document and bytes fetched per payload byte.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def documents_and_io(samples: list[bytes]) -> tuple[int, int, int, Any]:
    """A batch's documents counted, with this worker's I/O totals so far."""
    from rangestream.io import process_io_stats

    return len(samples), sum(len(sample) for sample in samples), os.getpid(), process_io_stats()


def epoch(storage: Any, shuffle: str) -> dict[str, float]:
    from rangestream import StatefulDataLoader

    loader = StatefulDataLoader.from_storage(
        storage, documents_and_io, batch_size=16, num_workers=2, shuffle=shuffle
    )
    started = time.perf_counter()
    first = None
    documents = payload = 0
    io: dict[int, Any] = {}
    for count, nbytes, pid, stats in loader:
        if first is None:
            first = time.perf_counter() - started
        documents += count
        payload += nbytes
        io[pid] = stats
    seconds = time.perf_counter() - started
    return {
        "documents_per_s": documents / seconds,
        "first_batch_s": first or 0.0,
        "requests_per_document": sum(s.requests for s in io.values()) / documents,
        "bytes_per_payload_byte": sum(s.bytes for s in io.values()) / payload,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.s3env import S3Environment
    from rangestream import DocumentStorage
    from rangestream.types import DocumentStorageFormat

    class Raw(DocumentStorageFormat[bytes, bytes]):
        def pack(self, data: bytes) -> bytes:
            return data

        def unpack(self, encoded_data: Any, shard: int) -> bytes:
            return bytes(encoded_data)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=40_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    sizes = rng.integers(200, 4000, args.documents)
    with (
        tempfile.TemporaryDirectory(prefix="document-loader-") as tmp,
        S3Environment(Path(tmp), args.latency_ms) as environment,
    ):
        endpoint = environment.endpoint
        assert endpoint is not None
        options = {"key": endpoint.access_key, "secret": endpoint.secret_key}
        url = f"s3://{endpoint.bucket}/documents"
        writing = DocumentStorage(
            url, Raw(), storage_options={**options, "endpoint_url": endpoint.direct_url}
        )
        with writing.sync_writer() as writer:
            for i, size in enumerate(sizes.tolist()):
                writer.append(i * 8 // len(sizes), rng.bytes(size))
        storage = DocumentStorage(
            url, Raw(), storage_options={**options, "endpoint_url": endpoint.proxy_url}
        )
        results: dict[str, list[dict[str, float]]] = {"block": [], "window": []}
        for repeat in range(args.repeats):
            for shuffle in ("block", "window")[:: 1 - 2 * (repeat % 2)]:
                results[shuffle].append(epoch(storage, shuffle))
    print(f"{args.documents:,} documents, {sizes.sum() / 1e6:.1f} MB, "
          f"{args.latency_ms:g} ms a request, {args.repeats} epochs each\n")  # fmt: skip
    print("| shuffle | documents/s | first batch | requests / document | bytes / payload byte |")
    print("| --- | --: | --: | --: | --: |")
    for shuffle, rows in results.items():
        rates = [row["documents_per_s"] for row in rows]
        first = statistics.median(row["first_batch_s"] for row in rows)
        print(
            f"| {shuffle} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) | {first * 1e3:.0f} ms | "
            f"{statistics.median(row['requests_per_document'] for row in rows):.4f} | "
            f"{statistics.median(row['bytes_per_payload_byte'] for row in rows):.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
