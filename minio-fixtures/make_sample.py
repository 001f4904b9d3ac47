"""Regenerate ``minio-fixtures/sample-tokens``: a small token dataset written by rangestream.

Run from the repository root: ``python minio-fixtures/make_sample.py``. The output is
deterministic in content (seeded), so the fixture can be checked in and mirrored into the
MinIO bucket by ``init.sh``. Read it back with ``StreamStorage("s3://rangestream/
sample-tokens", StreamNumpyFormat(SAMPLE_DTYPE), storage_options=...)``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from rangestream import StreamNumpyFormat, StreamStorage

SAMPLE_DTYPE = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])
OUT = Path(__file__).resolve().parent / "sample-tokens"


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    rng = np.random.default_rng(2026)
    storage = StreamStorage(OUT, StreamNumpyFormat(SAMPLE_DTYPE), block_bytes=64 * 1024)
    with storage.sync_writer() as writer:
        for shard in range(3):
            for _ in range(40):
                n = int(rng.integers(50, 400))
                writer.append(
                    shard,
                    {
                        "tokens": rng.integers(0, 32_000, n, dtype="<i4"),
                        "loss_mask": (rng.random(n) < 0.8).astype("u1"),
                    },
                )
    with storage.sync_reader() as reader:
        print(f"wrote {OUT}: {reader.num_shards} shards, {reader.total_length} tokens")


if __name__ == "__main__":
    main()
