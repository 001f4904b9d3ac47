"""``rangestream demo``: write a synthetic token dataset, stream it through a DataLoader.

It shows the whole path a training job takes: a multi-shard write with one commit, then
windows read by range requests inside DataLoader workers, with exact request and byte
counts gathered from the workers.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from rangestream.cli.options import (
    add_location_arguments,
    dataset_url,
    retry_policy,
    storage_options,
)

DEMO_DTYPE = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "demo", help="write a synthetic token dataset and stream it through a DataLoader"
    )
    add_location_arguments(parser, default_url="demo-data/tokens")
    parser.add_argument("--tokens", type=int, default=4_000_000, help="tokens to write")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run)


def _make_bucket(url: str, options: dict[str, Any]) -> None:
    """Create the bucket of an ``s3://`` URL if it is missing (MinIO starts empty)."""
    if not url.startswith("s3://"):
        return
    import s3fs

    # fsspec's instance cache keeps this sync filesystem alive until exit. A throwaway one
    # would be collected wherever the garbage collector runs next; in a thread running an
    # event loop (the writer's uploads), s3fs's finalizer then closes its session on that
    # loop instead of its own and logs "attached to a different loop".
    fs = s3fs.S3FileSystem(**options)
    bucket = url[len("s3://") :].split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)


def write_dataset(storage: Any, tokens: int, shards: int, seed: int) -> int:
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    written = 0
    with (
        storage.sync_writer(overwrite=True) as writer,
        tqdm(total=tokens, unit="tok", unit_scale=True, desc="write") as bar,
    ):
        record = 0
        while written < tokens:
            n = int(min(rng.integers(50, 4000), tokens - written))
            writer.append(
                record % shards,
                {
                    "tokens": rng.integers(0, 50_000, n, dtype="<i4"),
                    "loss_mask": (rng.random(n) < 0.9).astype("u1"),
                },
            )
            written += n
            record += 1
            bar.update(n)
    return written


def collate_with_io_stats(samples: list[Any]) -> tuple[Any, int, Any]:
    """Stack the windows and attach this worker's exact I/O totals so far."""
    from rangestream.io import process_io_stats
    from rangestream.loader import stack_collate

    return stack_collate(samples), os.getpid(), process_io_stats()


def run(arguments: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rangestream import StreamNumpyFormat, StreamStorage
    from rangestream.loader import StatefulDataLoader

    url, options = dataset_url(arguments), storage_options(arguments)
    _make_bucket(url, options)
    storage = StreamStorage(
        url, StreamNumpyFormat(DEMO_DTYPE), storage_options=options, retry=retry_policy(arguments)
    )
    started = time.perf_counter()
    total = write_dataset(storage, arguments.tokens, arguments.shards, arguments.seed)
    write_seconds = time.perf_counter() - started
    print(f"wrote {total:,} tokens in {arguments.shards} shards to {url} "
          f"in {write_seconds:.1f} s")  # fmt: skip

    # read back as a user would: the dataset describes itself, no format object
    stored = StreamStorage(url, storage_options=options, retry=retry_policy(arguments))
    loader = StatefulDataLoader.from_storage(
        stored,
        collate_with_io_stats,
        sequence_length=arguments.sequence_length,
        batch_size=arguments.batch_size,
        num_workers=arguments.num_workers,
        shuffle=True,
        shuffle_seed=arguments.seed,
    )
    per_worker: dict[int, Any] = {}
    windows = 0
    first_batch = None
    started = time.perf_counter()
    with tqdm(unit="win", desc="stream") as bar:
        for batch, pid, stats in loader:
            if first_batch is None:
                first_batch = time.perf_counter() - started
            tokens = batch["tokens"]
            windows += int(tokens.shape[0])
            per_worker[pid] = stats
            bar.update(int(tokens.shape[0]))
    seconds = time.perf_counter() - started
    requests = sum(s.requests for s in per_worker.values())
    fetched = sum(s.bytes for s in per_worker.values())
    payload = windows * arguments.sequence_length * DEMO_DTYPE.itemsize
    print(
        f"streamed {windows:,} windows of {arguments.sequence_length} tokens with "
        f"{arguments.num_workers} workers in {seconds:.2f} s: {windows / seconds:,.0f} windows/s, "
        f"{windows * arguments.sequence_length / seconds / 1e6:.1f} M tokens/s, "
        f"first batch after {first_batch or 0:.3f} s"
    )
    print(
        f"requests {requests:,} ({requests / max(windows, 1):.2f} per window), "
        f"bytes fetched {fetched:,} ({fetched / max(payload, 1):.3f} per window byte)"
    )
    return 0
