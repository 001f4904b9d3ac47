"""Shuffle quality from the emitted order, the same figures for every system.

Run: ``python -m benchmarks.shuffle_quality`` (``--tokens``, ``--epochs``, ``--no-litdata``).

Every system emits the windows of one token stream (token ``i`` has value ``i``, so a window's
first token is its source position) as one rank with two DataLoader workers and batches of 8
would see them. From that order alone:

- ``same 4 MiB pairs``: over the batches, the mean fraction of pairs of windows of one batch
  whose first bytes lie in the same 4 MiB neighbourhood of the source (``byte // 4 MiB``);
- ``consecutive distance``: the distance in the source between consecutive windows of the
  emitted stream, as a fraction of the dataset (median, and the share under 4 MiB);

against an ideal uniform shuffle of the same windows. Systems: today's window shuffle,
the block shuffle at several (buffer runs K, run size), and LitData 0.2.76's
``StreamingDataset(shuffle=True)`` over a dataset of the same tokens in 4 MB chunks, run for
real through its ``StreamingDataLoader`` (2 workers, batches of 8). The block shuffle's
requests per window come from the exact request arithmetic (:class:`WindowGeometry`) over
4 MiB blocks of 1 KiB chunks, for this dataset and for a larger one with many readers.
Each figure is the mean over ``--epochs`` epochs, with the spread (min-max) in brackets.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rangestream.layout.block import ArrayLayout
from rangestream.loader.shuffle import (
    BlockShuffle,
    EpochPosition,
    WindowGeometry,
    WindowShuffle,
    buffer_runs_for,
    run_windows_for,
    simulate_epoch,
)

TOKEN = np.dtype("<i4")
WINDOW = 2049  # tokens per window: 2,048 and the next token
STRIDE = 2048
NEIGHBOURHOOD = 4 << 20
BATCH = 8
WORKERS = 2
LITDATA_CHUNK_BYTES = 4_000_000  # "4 MB" chunks
LITDATA_RESIDENT_CHUNKS = 3  # the chunk being read and max_pre_download=2 more per worker
LAYOUT = ArrayLayout.for_sizes(TOKEN, (), chunk_bytes=1024, block_bytes=4 << 20)
GRID = [(k, run) for run in (1 << 20, 2 << 20, 4 << 20) for k in (1, 2, 3, 4, 8, 16)]


def geometry(tokens: int, shards: int = 1) -> WindowGeometry:
    bounds = np.linspace(0, tokens, shards + 1).astype(np.int64)
    return WindowGeometry(
        stream_bounds=tuple(bounds.tolist()),
        block_rows=LAYOUT.block_rows,
        chunk_rows=LAYOUT.chunk_rows,
        stored_chunk_bytes=LAYOUT.stored_chunk_nbytes,
        stride=STRIDE,
        window_length=WINDOW,
    )


# -- emitted orders: lists of batches of source byte offsets ---------------------------------


def rangestream_batches(order: BlockShuffle | WindowShuffle, epoch: int) -> list[np.ndarray]:
    position = EpochPosition.start(world_size=1, batch_size=BATCH, num_workers=WORKERS)
    batches = simulate_epoch(order, epoch, position)
    return [batches[key] * STRIDE * TOKEN.itemsize for key in sorted(batches)]


def uniform_batches(num_windows: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng(epoch).permutation(num_windows) * STRIDE * TOKEN.itemsize
    steps = num_windows // BATCH
    return list(order[: steps * BATCH].reshape(steps, BATCH))


def _litdata_chunk(path: str, tokens_per_chunk: int, total: int, i: int) -> np.ndarray:
    stream = np.memmap(path, TOKEN, "r")
    return np.array(stream[i * tokens_per_chunk : min((i + 1) * tokens_per_chunk, total)])


def litdata_batches(tokens: int, epochs: int, work: Path) -> list[list[np.ndarray]]:
    """LitData's own loader over the same tokens: the batches of ``epochs`` epochs."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

    raw = work / "tokens.i32"
    np.arange(tokens, dtype=TOKEN).tofile(raw)
    per_chunk = max(1, LITDATA_CHUNK_BYTES // (WINDOW * TOKEN.itemsize)) * WINDOW
    out = work / "litdata"
    optimize(
        functools.partial(_litdata_chunk, str(raw), per_chunk, tokens),
        list(range(-(-tokens // per_chunk))),
        str(out),
        chunk_size=per_chunk,
        item_loader=TokensLoader(),
        num_workers=1,
        verbose=False,
    )
    dataset = StreamingDataset(
        str(out),
        cache_dir=str(work / "cache"),
        item_loader=TokensLoader(block_size=WINDOW),
        shuffle=True,
        seed=42,
    )
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    epochs_out = []
    for _ in range(epochs):  # each iteration of the loader is the next epoch
        batches = [batch[:, 0].numpy().astype(np.int64) * TOKEN.itemsize for batch in loader]
        epochs_out.append([b for b in batches if len(b) == BATCH])
    return epochs_out


# -- figures -------------------------------------------------------------------------------


def figures(batches: list[np.ndarray], dataset_bytes: int) -> dict[str, float]:
    stacked = np.stack(batches)
    hood = stacked // NEIGHBOURHOOD
    same = (hood[:, :, None] == hood[:, None, :]).sum(axis=(1, 2)) - BATCH
    pairs = float(same.mean() / (BATCH * (BATCH - 1)))
    stream = stacked.reshape(-1)
    distance = np.abs(np.diff(stream))
    return {
        "same_pairs": pairs,
        "median_distance": float(np.median(distance) / dataset_bytes),
        "near_neighbours": float(np.mean(distance < NEIGHBOURHOOD)),
    }


def summarise(per_epoch: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    return {
        key: (
            float(np.mean([e[key] for e in per_epoch])),
            min(e[key] for e in per_epoch),
            max(e[key] for e in per_epoch),
        )
        for key in per_epoch[0]
    }


def requests_per_window(
    shuffle: BlockShuffle, geo: WindowGeometry, world: int, workers: int, epoch: int = 0
) -> tuple[float, float]:
    """Requests per window and bytes read per window byte, over every reader of an epoch."""
    position = EpochPosition.start(world_size=world, batch_size=BATCH, num_workers=workers)
    windows = requests = read_bytes = 0
    for rank in range(world):
        for worker in range(workers):
            plan = shuffle.worker_plan(epoch, position, rank=rank, worker_id=worker)
            for group in plan.groups():
                windows += len(group.windows)
                for read in group.reads:
                    ranges = geo.ranges(np.asarray(read.request_windows))
                    requests += len(ranges)
                    read_bytes += int((ranges[:, 3] - ranges[:, 2]).sum())
    payload = windows * WINDOW * TOKEN.itemsize
    return requests / max(windows, 1), read_bytes / max(payload, 1)


def _cell(value: tuple[float, float, float], digits: int = 3) -> str:
    mean, low, high = value
    if high - low < 10 ** -(digits + 1):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64_000_000, help="tokens in the stream")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per system")
    parser.add_argument("--no-litdata", action="store_true", help="skip LitData's run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    geo = geometry(args.tokens, shards=4)
    n = geo.num_windows
    dataset_bytes = args.tokens * TOKEN.itemsize
    rows: list[dict[str, Any]] = []

    def measure(
        name: str, memory: str, make: Callable[[int], list[np.ndarray]], **extra: Any
    ) -> None:
        started = time.perf_counter()
        per_epoch = [figures(make(epoch), dataset_bytes) for epoch in range(args.epochs)]
        rows.append({"system": name, "memory": memory, **summarise(per_epoch), **extra})
        print(f"  {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)

    print(f"{n} windows of {WINDOW} tokens, {dataset_bytes / 2**20:.0f} MiB", file=sys.stderr)
    measure("uniform (ideal)", "-", lambda e: uniform_batches(n, e))
    measure("window shuffle (today)", "-",
            lambda e: rangestream_batches(WindowShuffle(n, seed=0), e))  # fmt: skip
    for k, run_bytes in GRID:
        r = run_windows_for(geo, run_bytes)
        shuffle = BlockShuffle(n, seed=0, run_windows=r, buffer_runs=k)
        here = requests_per_window(shuffle, geo, 1, WORKERS)
        measure(
            f"block K={k}, runs of {run_bytes >> 20} MiB ({r} windows)",
            f"{k * r * STRIDE * TOKEN.itemsize / 2**20:.0f} MiB",
            functools.partial(rangestream_batches, shuffle),
            requests=here,
        )
    if not args.no_litdata:
        with tempfile.TemporaryDirectory(prefix="shuffle-quality-") as work:
            started = time.perf_counter()
            epochs = litdata_batches(args.tokens, args.epochs, Path(work))
            per_epoch = [figures(b, dataset_bytes) for b in epochs]
            print(f"  litdata: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        resident = LITDATA_RESIDENT_CHUNKS * LITDATA_CHUNK_BYTES / 2**20
        rows.append({
            "system": "LitData 0.2.76 StreamingDataset(shuffle=True), 4 MB chunks",
            "memory": f"{LITDATA_CHUNK_BYTES / 2**20:.1f} MiB mixed, {resident:.1f} MiB held",
            **summarise(per_epoch),
        })  # fmt: skip

    print(f"\n`python -m benchmarks.shuffle_quality --tokens {args.tokens} --epochs {args.epochs}`")
    print(
        f"({n} windows of {WINDOW} tokens, {dataset_bytes / 2**20:.0f} MiB; one rank, "
        f"{WORKERS} workers, batches of {BATCH}; mean over {args.epochs} epochs [min-max])\n"
    )
    print("| order | mixed per worker | same 4 MiB pairs in a batch | median distance of "
          "consecutive windows (of the dataset) | consecutive within 4 MiB | requests / "
          "window | bytes read / byte |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        requests = row.get("requests")
        print(
            f"| {row['system']} | {row['memory']} | {_cell(row['same_pairs'])} | "
            f"{_cell(row['median_distance'])} | {_cell(row['near_neighbours'])} | "
            + (f"{requests[0]:.4f} | {requests[1]:.2f} |" if requests else "- | - |")
        )

    layouts = ((1, 2), (8, 4), (64, 8))
    print(
        "\nRequests per window (bytes read per payload byte), every reader of one epoch; "
        "`auto` is `buffer_runs_for(n, R, ranks x workers, most=8)`:\n"
    )
    print("| dataset | K, run | " + " | ".join(f"{w} ranks x {nw} workers" for w, nw in layouts)
          + " |")  # fmt: skip
    print("|---|---|" + "---|" * len(layouts))
    scale: dict[str, list[tuple[float, float]]] = {}
    for tokens, shards in ((12_000_000, 4), (2_000_000_000, 16)):
        big = geometry(tokens, shards)
        for k, run_bytes in [(4, 4 << 20), (8, 4 << 20), (16, 4 << 20), (8, 2 << 20), (0, 4 << 20)]:
            r = run_windows_for(big, run_bytes)
            cells = []
            for w, nw in layouts:
                chosen = k or buffer_runs_for(big.num_windows, r, w * nw, most=8)
                shuffle = BlockShuffle(big.num_windows, 0, r, chosen)
                cells.append(requests_per_window(shuffle, big, w, nw))
            name = f"K={k or 'auto'}, {run_bytes >> 20} MiB"
            scale[f"{tokens} {name}"] = cells
            print(f"| {tokens / 1e6:,.0f}M tokens | {name} | "
                  + " | ".join(f"{c[0]:.4f} ({c[1]:.2f}x)" for c in cells) + " |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "scale": scale}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
