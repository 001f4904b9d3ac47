"""Shuffled document reads as the dataset grows to 10^7 documents, in 4 or 1,000 shards.

Run: ``python -m benchmarks.scale.documents --label after [--documents N] [--shards 4,1000]``.

Documents of 512..1535 bytes (1 KiB on average, random bytes, seeded) are written to a
local dataset; one reader then reads them in a seeded uniform random order, in batches of
64 (``read_many``, as a loader's worker does), and every reply is checked against the
bytes written. Reported per segment of the read sequence (the first 10^3 reads, up to 10^4,
10^5, 10^6): requests and bytes fetched per document (exact counters, by array) against the
documents' own bytes, and microseconds per document; and the memory the reader holds at the
end (traced). Counts do not depend on the store, so these are also the S3 requests.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scale import harness

BATCH = 64
CHECKPOINTS = (10**3, 10**4, 10**5, 10**6)


def document(i: int) -> bytes:
    """Document ``i``: 512..1535 bytes, a function of ``i`` alone (checkable on read)."""
    size = 512 + (i * 2654435761) % 1024
    return np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8).tobytes()


def document_size(i: int) -> int:
    return 512 + (i * 2654435761) % 1024


def write(url: str, documents: int, shards: int) -> float:
    storage = harness.storage("document", url)
    per_shard = -(-documents // shards)
    pool = [document(i) for i in range(4096)]  # bytes drawn once; sizes vary per document
    began = time.perf_counter()
    with storage.sync_writer(overwrite=True) as writer:
        for i in range(documents):
            writer.append(i // per_shard, pool[i % 4096][: document_size(i)])
    return time.perf_counter() - began


def expected(i: int) -> bytes:
    return document(i % 4096)[: document_size(i)]


def measure(url: str, documents: int, reads: int) -> dict:
    import tracemalloc

    storage = harness.storage("document", url)
    order = np.random.default_rng(1).permutation(documents)[:reads]
    segments = [c for c in CHECKPOINTS if c <= reads] or [reads]
    out: dict[str, Any] = {"segments": {}}
    with storage.sync_reader() as reader:
        assert len(reader) == documents
        gc.collect()
        tracemalloc.start()
        done, previous = 0, reader.stats
        payload, began = 0, time.perf_counter()
        for end in segments:
            while done < end:
                batch = [int(i) for i in order[done : min(end, done + BATCH)]]
                for i, data in zip(batch, reader.read_many(batch), strict=True):
                    if data != expected(i):
                        raise AssertionError(f"document {i} differs from what was written")
                    payload += len(data)
                done += len(batch)
            now, stats = time.perf_counter(), reader.stats
            spent = stats - previous
            count = end - (0 if not out["segments"] else int(list(out["segments"])[-1]))
            out["segments"][str(end)] = {
                "documents": count,
                "requests_per_document": spent.requests / count,
                "bytes_per_document": spent.bytes / count,
                "payload_per_document": payload / count,
                "bytes_over_payload": spent.bytes / payload,
                "by_array": {k: v / count for k, v in spent.bytes_by_key_kind.items()},
                "requests_by_array": {k: v / count for k, v in spent.by_key_kind.items()},
                "us_per_document_traced": (now - began) / count * 1e6,
            }
            print(end, out["segments"][str(end)], flush=True)
            previous, payload, began = stats, 0, time.perf_counter()
        out["held_bytes"], out["peak_bytes"] = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        total = reader.stats
        out["open_requests"] = 1
        out["total_requests"] = total.requests
    return out


def run(label: str, documents: int, shard_counts: list[int], reads: int) -> dict:
    data = harness.work_dir(label, "documents")
    result: dict[str, Any] = {"library": harness.code_version(), "documents": documents}
    for shards in shard_counts:
        url = str(data / f"docs-{documents}-{shards}")
        if not Path(url, "zarr.json").exists():
            seconds = write(url, documents, shards)
            print("written", documents, shards, f"{seconds:.0f} s", flush=True)
        files, logical, allocated = harness.directory_bytes(Path(url))
        row = harness.in_subprocess("benchmarks.scale.documents:measure", url, documents, reads)
        row.update(stored_files=files, stored_bytes=logical, allocated_bytes=allocated)
        result[str(shards)] = row
        harness.shutil.rmtree(url)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--documents", type=int, default=10**7)
    parser.add_argument("--shards", default="1000,4")
    parser.add_argument("--reads", type=int, default=10**6)
    args = parser.parse_args()
    shards = [int(s) for s in args.shards.split(",")]
    result = run(args.label, args.documents, shards, args.reads)
    print(harness.save(args.label, f"documents-{args.documents}", result))


if __name__ == "__main__":
    main()
