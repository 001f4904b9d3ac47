"""One peer's cached loader, two shuffled epochs over S3 (a child of ``cache_epochs``).

Run by ``python -m benchmarks.cache_epochs`` (LitData in this interpreter, MosaicML in
``benchmarks/.work/venv-mosaic``): it imports only numpy, boto3 and the peer, so the same
file runs in either environment. Protocol on stdout/stdin, one JSON line each:
``{"ready": epoch}`` then it waits for a line (the parent resets the proxy's counters), then
``{"epoch": n, "seconds": s, "windows": w, "exact": bool, "disk_bytes": b}``.

The data is the parent's token stream (``np.arange(tokens) % 50_000``) cut into samples of
2,049 tokens, the closest either peer comes to windows (neither reads across samples):

- ``litdata``: ``optimize`` with ``TokensLoader`` (chunks of ``PEER_CHUNK_BYTES``), read by
  ``StreamingDataLoader(StreamingDataset(s3 url, cache_dir, TokensLoader(2049)),
  batch_size=8, num_workers=2, shuffle=True)``; whole chunks are downloaded to the cache.
- ``mosaic``: ``MDSWriter`` shards of ``PEER_CHUNK_BYTES``, samples ``ndarray:int32:2049``,
  read by ``StreamingDataLoader(StreamingDataset(remote, local, shuffle=True,
  batch_size=8), batch_size=8, num_workers=2)``; whole shards are downloaded to ``local``.

A row is exact when it is 2,049 consecutive tokens of the stream starting at a multiple of
2,049 (the stream's values wrap at 50,000, so the check is on consecutive differences and
the first value's place), and the epoch is exact when it yields every sample once.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = 2049
BATCH = 8
WORKERS = 2
#: as ``benchmarks.config.PEER_CHUNK_BYTES`` (4 MiB objects less 64 KiB); not imported, so
#: the MosaicML environment needs nothing of the harness
PEER_CHUNK_BYTES = 4 * 1024 * 1024 - 64 * 1024
VOCAB = 50_000


def _stream(tokens: int) -> np.ndarray:
    return (np.arange(tokens, dtype=np.int64) % VOCAB).astype("<i4")


def _litdata_part(path: str, part: int) -> np.ndarray:
    """One input of LitData's ``optimize``: a run of whole samples (picklable, top level)."""
    tokens = np.load(path, mmap_mode="r")
    per = WINDOW * 64
    return np.array(tokens[part * per : (part + 1) * per])


def _upload(args: argparse.Namespace, local: Path, prefix: str) -> None:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=args.endpoint, aws_access_key_id=args.key,
        aws_secret_access_key=args.secret, region_name=args.region,
    )  # fmt: skip
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), args.bucket, f"{prefix}/{path.relative_to(local)}")


def _litdata(args: argparse.Namespace, work: Path, stream: np.ndarray) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
    from litdata.streaming import downloader

    # LitData's obstore client has no allow_http setting: see benchmarks/systems/litdata_systems
    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"
    os.environ.setdefault("AWS_ALLOW_HTTP", "true")
    source = work / "stream.npy"
    np.save(source, stream[: len(stream) // WINDOW * WINDOW])
    parts = -(-(len(stream) // WINDOW) // 64)
    per_chunk = PEER_CHUNK_BYTES // (WINDOW * 4)
    optimize(
        functools.partial(_litdata_part, str(source)), list(range(parts)), str(work / "data"),
        num_workers=1, chunk_size=WINDOW * per_chunk, item_loader=TokensLoader(), verbose=False,
    )  # fmt: skip
    _upload(args, work / "data", "litdata")
    dataset = StreamingDataset(
        f"s3://{args.bucket}/litdata", cache_dir=str(work / "cache"),
        item_loader=TokensLoader(block_size=WINDOW),
        storage_options={"endpoint_url": args.proxy, "aws_access_key_id": args.key,
                         "aws_secret_access_key": args.secret, "region_name": args.region},
    )  # fmt: skip
    # fork: the allow_http option set above reaches the workers (a spawned worker
    # imports LitData afresh, without it)
    return StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, shuffle=True,
                               multiprocessing_context="fork")  # fmt: skip


def _mosaic(args: argparse.Namespace, work: Path, stream: np.ndarray) -> Any:
    # ``import streaming`` imports streaming.vision (torchvision, which cannot import beside
    # the CPU torch): see benchmarks/systems/mosaic_systems.py
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming
    from streaming.base.util import clean_stale_shared_memory

    columns = {"tokens": f"ndarray:int32:{WINDOW}"}
    with streaming.MDSWriter(out=str(work / "data"), columns=columns,
                             size_limit=PEER_CHUNK_BYTES) as writer:  # fmt: skip
        for k in range(len(stream) // WINDOW):
            writer.write({"tokens": np.array(stream[k * WINDOW : (k + 1) * WINDOW])})
    _upload(args, work / "data", "mosaic")
    os.environ.update({"S3_ENDPOINT_URL": args.proxy, "AWS_ACCESS_KEY_ID": args.key,
                       "AWS_SECRET_ACCESS_KEY": args.secret,
                       "AWS_DEFAULT_REGION": args.region})  # fmt: skip
    clean_stale_shared_memory()
    dataset = streaming.StreamingDataset(
        remote=f"s3://{args.bucket}/mosaic", local=str(work / "cache"), shuffle=True,
        batch_size=BATCH,
    )  # fmt: skip
    return streaming.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)


def _rows(batch: Any) -> np.ndarray:
    tokens = batch["tokens"] if isinstance(batch, dict) else batch
    array = tokens.numpy() if hasattr(tokens, "numpy") else np.asarray(tokens)
    return array.reshape(-1, WINDOW)


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=("litdata", "mosaic"), required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--endpoint", required=True, help="the S3 server (uploads)")
    parser.add_argument("--proxy", required=True, help="the counting proxy (reads)")
    parser.add_argument("--key", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    stream = _stream(args.tokens)
    loader = (_litdata if args.system == "litdata" else _mosaic)(args, work, stream)
    samples = len(stream) // WINDOW
    steps = np.arange(WINDOW)
    inverse = pow(WINDOW, -1, VOCAB)  # 2049 and 50_000 are coprime
    for epoch in (1, 2):
        print(json.dumps({"ready": epoch}), flush=True)
        sys.stdin.readline()
        started = time.perf_counter()
        seen = np.zeros(samples, dtype=np.int64)
        exact = True
        for batch in loader:
            rows = _rows(batch)
            firsts = rows[:, 0].astype(np.int64)
            exact &= bool((rows == (firsts[:, None] + steps) % VOCAB).all())
            # sample k starts with k * 2049 % 50_000: k = first * inverse(2049) % 50_000,
            # one k per first value while there are at most 50_000 samples (checked below)
            for k in (firsts * inverse % VOCAB).tolist():
                if k < samples:
                    seen[k] += 1
                else:
                    exact = False
        seconds = time.perf_counter() - started
        exact = exact and samples <= VOCAB and bool((seen == 1).all())
        print(json.dumps({"epoch": epoch, "seconds": seconds, "windows": int(seen.sum()),
                          "exact": exact, "disk_bytes": _disk_bytes(work / "cache")}),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
