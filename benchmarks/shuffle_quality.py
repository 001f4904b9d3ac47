"""Shuffle quality from the emitted order, the same figures for every system.

Part of the benchmark: ``python -m benchmarks run`` writes these figures as a table of
``docs/benchmarks.md`` (``--no-shuffle-quality`` leaves them out, ``--only shuffle-quality``
measures only them). Standalone: ``python -m benchmarks.shuffle_quality`` (``--tokens``,
``--epochs``, ``--no-litdata``) prints the table and the block shuffle's request arithmetic
at larger scales.

Every system emits the windows of one token stream in which token ``i`` has value ``i``, so
a window's first token is its source position, as one rank with two DataLoader workers and
batches of 8 sees them. Each system's order is written to a file by the system itself (in its
own interpreter: MosaicML runs in its virtualenv), then one function computes, from those
orders alone and identically for every system:

- ``same 4 MiB pairs``: over the batches, the mean fraction of pairs of windows of one batch
  whose first bytes lie in the same 4 MiB neighbourhood of the source (``byte // 4 MiB``);
- ``consecutive distance``: the distance in the source between consecutive windows of the
  emitted stream, as a fraction of the dataset (median, and the share under 4 MiB);

against an ideal uniform shuffle of the same windows. Orders: rangestream's window shuffle
through its ``StatefulDataLoader`` (``shuffle="window"``); the block shuffle at several
(buffer runs K, run size) through the same loader (``shuffle="block"``); LitData 0.2.76's
``StreamingDataLoader`` over ``StreamingDataset(shuffle=True)`` in 4 MB chunks; MosaicML
Streaming 0.13's ``StreamingDataLoader`` over ``StreamingDataset(shuffle=True)`` (its
defaults: ``py1e``, a shuffle block of 262,144 samples). Each figure is the mean over the
epochs, with the spread (min-max) in brackets.

Module level imports numpy only: the MosaicML emitter runs in an interpreter without
rangestream.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TOKEN = np.dtype("<i4")
WINDOW = 2049  # tokens per window: 2,048 and the next token
STRIDE = 2048
NEIGHBOURHOOD = 4 << 20
BATCH = 8
WORKERS = 2
SEED = 0
LITDATA_CHUNK_BYTES = 4_000_000  # "4 MB" chunks
LITDATA_RESIDENT_CHUNKS = 3  # the chunk being read and max_pre_download=2 more per worker
MOSAIC_SHARD_BYTES = 4_000_000
#: (buffer runs K, run bytes) of the block shuffle rows: K=3 of 4 MiB holds what LitData
#: holds per worker (12 MiB), K=8 is the default, K=16 the next step, 2 MiB runs the cheap end
BLOCK_CONFIGS = ((3, 4 << 20), (8, 4 << 20), (16, 4 << 20), (3, 2 << 20))
DASH = "\u2013"

Batches = list[np.ndarray]  # one epoch: batches of source byte offsets, in emitted order


@dataclass(frozen=True)
class Order:
    """One system whose emitted order is measured."""

    name: str
    label: str
    interpreter: str  # "main" or "mosaic" (the MosaicML virtualenv)
    emitted_by: str  # "loader" (its DataLoader), "order module" or "reference"


def _block_name(k: int, run_bytes: int) -> str:
    return f"rangestream-block-k{k}-{run_bytes >> 20}mib"


ORDERS: tuple[Order, ...] = (
    Order("uniform", "uniform shuffle (ideal)", "main", "reference"),
    Order("rangestream-window", "rangestream window shuffle", "main", "loader"),
    *(
        Order(
            _block_name(k, run),
            f"rangestream block shuffle, K={k}, runs of {run >> 20} MiB",
            "main",
            "loader",
        )
        for k, run in BLOCK_CONFIGS
    ),
    Order("litdata", "LitData 0.2.76, 4 MB chunks", "main", "loader"),
    Order("mosaic", "MosaicML Streaming 0.13, py1e (defaults)", "mosaic", "loader"),
)
BY_NAME = {o.name: o for o in ORDERS}


def num_windows(tokens: int) -> int:
    return (tokens - WINDOW) // STRIDE + 1


# -- the data every loader reads: token i has value i ------------------------------------------


def _positions(work: Path, tokens: int) -> Path:
    raw = work / "tokens.i32"
    if not raw.exists() or raw.stat().st_size != tokens * TOKEN.itemsize:
        work.mkdir(parents=True, exist_ok=True)
        np.arange(tokens, dtype=TOKEN).tofile(raw)
    return raw


def _prepared(target: Path, key: str, write: Callable[[Path], None]) -> Path:
    """``target`` written once by ``write`` and reused while ``key`` is unchanged."""
    marker = target / ".prepared.json"
    if marker.exists() and json.loads(marker.read_text()).get("key") == key:
        return target
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    write(target)
    marker.write_text(json.dumps({"key": key}))
    return target


# -- emitters: each returns the batches of every epoch and what the order holds in memory ------


def _emit_uniform(tokens: int, epochs: int, work: Path) -> tuple[list[Batches], dict[str, Any]]:
    n = num_windows(tokens)
    out = []
    for epoch in range(epochs):
        order = np.random.default_rng([SEED, epoch]).permutation(n) * STRIDE * TOKEN.itemsize
        steps = n // BATCH
        out.append(list(order[: steps * BATCH].reshape(steps, BATCH)))
    return out, {"memory": DASH, "reads": DASH}


def _rangestream_storage(tokens: int, work: Path) -> Any:
    """The token stream as a rangestream dataset of four shards (prepared once)."""
    import rangestream as rs
    from rangestream.layout.manifest import FORMAT_VERSION

    raw = _positions(work, tokens)
    dtype = np.dtype([("tokens", TOKEN)])

    def write(target: Path) -> None:
        stream = np.memmap(raw, TOKEN, "r")
        storage = rs.StreamStorage(str(target / "ds"), rs.StreamNumpyFormat(dtype))
        with storage.sync_writer() as w:
            for shard, part in enumerate(np.array_split(np.arange(tokens), 4)):
                w.append(shard, {"tokens": np.array(stream[part[0] : part[-1] + 1])})

    target = _prepared(work / "rangestream", f"{tokens}-{FORMAT_VERSION}", write)
    return rs.StreamStorage(str(target / "ds"), rs.StreamNumpyFormat(dtype))


def _loader_epochs(storage: Any, epochs: int, **options: Any) -> list[Batches]:
    """Each epoch's batches of source byte offsets, as rangestream's DataLoader emits them."""
    import rangestream as rs

    loader = rs.StatefulDataLoader.from_storage(
        storage,
        sequence_length=WINDOW - 1,
        next_token=True,
        batch_size=BATCH,
        num_workers=WORKERS,
        shuffle_seed=SEED,
        **options,
    )
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append([np.asarray(b["tokens"][:, 0], dtype=np.int64) * TOKEN.itemsize for b in loader])
    return out


def _emit_rangestream_window(
    tokens: int, epochs: int, work: Path
) -> tuple[list[Batches], dict[str, Any]]:
    storage = _rangestream_storage(tokens, work)
    out = _loader_epochs(storage, epochs, shuffle="window")
    return out, {"memory": DASH, "reads": "one range request per window"}


def geometry(tokens: int, shards: int = 1) -> Any:
    """The request arithmetic of a stream of ``tokens`` over 4 MiB blocks of 1 KiB chunks."""
    from rangestream.layout.block import ArrayLayout
    from rangestream.loader.orders.block_shuffle import WindowGeometry

    layout = ArrayLayout.for_sizes(TOKEN, (), chunk_bytes=1024, block_bytes=4 << 20)
    bounds = np.linspace(0, tokens, shards + 1).astype(np.int64)
    return WindowGeometry(
        stream_bounds=tuple(bounds.tolist()),
        block_rows=layout.block_rows,
        chunk_rows=layout.chunk_rows,
        stored_chunk_bytes=layout.stored_chunk_nbytes,
        stride=STRIDE,
        window_length=WINDOW,
    )


def requests_per_window(
    shuffle: Any, geo: Any, world: int, workers: int, epoch: int = 0
) -> tuple[float, float]:
    """Requests per window and bytes read per window byte, over every reader of an epoch."""
    from rangestream.loader.orders.block_shuffle import EpochPosition

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


def _emit_block(
    k: int, run_bytes: int, tokens: int, epochs: int, work: Path
) -> tuple[list[Batches], dict[str, Any]]:
    """The block shuffle's order as the DataLoader emits it (``shuffle="block"``), with runs
    of ``run_bytes`` and ``K`` runs per buffer; its reads from the order module's request
    arithmetic over 4 MiB blocks (exact: the loader reads each run's span with one range
    request per block it touches)."""
    from rangestream.loader.orders.block_shuffle import BlockShuffle, run_windows_for

    geo = geometry(tokens, shards=4)
    run = run_windows_for(geo, run_bytes)
    storage = _rangestream_storage(tokens, work)
    out = _loader_epochs(storage, epochs, shuffle="block", run_windows=run, buffer_runs=k)
    shuffle = BlockShuffle(geo.num_windows, seed=SEED, run_windows=run, buffer_runs=k)
    requests, read = requests_per_window(shuffle, geo, 1, WORKERS)
    return out, {
        "memory": f"{k * run * STRIDE * TOKEN.itemsize / 2**20:.0f} MiB",
        "reads": f"{requests:.4f} requests / window, {read:.2f} bytes read / byte",
    }


def _litdata_chunk(path: str, tokens_per_chunk: int, total: int, i: int) -> np.ndarray:
    stream = np.memmap(path, TOKEN, "r")
    return np.array(stream[i * tokens_per_chunk : min((i + 1) * tokens_per_chunk, total)])


def _emit_litdata(tokens: int, epochs: int, work: Path) -> tuple[list[Batches], dict[str, Any]]:
    """LitData's own loader over the same tokens: the batches of ``epochs`` epochs."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

    raw = _positions(work, tokens)
    per_chunk = max(1, LITDATA_CHUNK_BYTES // (WINDOW * TOKEN.itemsize)) * WINDOW

    def write(target: Path) -> None:
        optimize(
            functools.partial(_litdata_chunk, str(raw), per_chunk, tokens),
            list(range(-(-tokens // per_chunk))),
            str(target / "data"),
            chunk_size=per_chunk,
            item_loader=TokensLoader(),
            num_workers=1,
            verbose=False,
        )

    target = _prepared(work / "litdata", str(tokens), write)
    cache = work / "litdata-cache"
    shutil.rmtree(cache, ignore_errors=True)
    dataset = StreamingDataset(
        str(target / "data"),
        cache_dir=str(cache),
        item_loader=TokensLoader(block_size=WINDOW),
        shuffle=True,
        seed=42,
    )
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    out = []
    for _ in range(epochs):  # each iteration of the loader is the next epoch
        batches = [batch[:, 0].numpy().astype(np.int64) * TOKEN.itemsize for batch in loader]
        out.append([b for b in batches if len(b) == BATCH])
    resident = LITDATA_RESIDENT_CHUNKS * LITDATA_CHUNK_BYTES / 2**20
    return out, {
        "memory": f"{LITDATA_CHUNK_BYTES / 2**20:.1f} MiB mixed, {resident:.1f} MiB held",
        "reads": "one 4 MB chunk at a time (whole-chunk downloads)",
    }


def _emit_mosaic(tokens: int, epochs: int, work: Path) -> tuple[list[Batches], dict[str, Any]]:
    """MosaicML's own loader, its default shuffle (``py1e``), over 2049-token samples."""
    from benchmarks.systems.mosaic_systems import _import_streaming

    streaming = _import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    raw = _positions(work, tokens)

    def write(target: Path) -> None:
        stream = np.memmap(raw, TOKEN, "r")
        columns = {"tokens": f"ndarray:int32:{WINDOW}"}
        with streaming.MDSWriter(
            out=str(target / "mds"), columns=columns, size_limit=MOSAIC_SHARD_BYTES
        ) as writer:
            for k in range(tokens // WINDOW):
                writer.write({"tokens": np.array(stream[k * WINDOW : (k + 1) * WINDOW])})

    target = _prepared(work / "mosaic", str(tokens), write)
    clean_stale_shared_memory()
    dataset = streaming.StreamingDataset(
        local=str(target / "mds"), shuffle=True, shuffle_seed=SEED, batch_size=BATCH
    )
    loader = streaming.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
    out = []
    for _ in range(epochs):  # each iteration is the dataset's next epoch
        batches = [
            np.asarray(batch["tokens"][:, 0], dtype=np.int64) * TOKEN.itemsize for batch in loader
        ]
        out.append([b for b in batches if len(b) == BATCH])
    samples = tokens // WINDOW
    # its default shuffle block, max(4e6 / canonical nodes, 2^18) samples, spans the dataset
    whole = samples <= 1 << 18
    return out, {
        "memory": f"the whole dataset ({samples:,} samples; default shuffle block >= 262,144)"
        if whole
        else "its default shuffle block (>= 262,144 samples)",
        "reads": "whole shards, kept on local disk",
    }


def _emitter(name: str) -> Callable[[int, int, Path], tuple[list[Batches], dict[str, Any]]]:
    for k, run in BLOCK_CONFIGS:
        if name == _block_name(k, run):
            return functools.partial(_emit_block, k, run)
    return {
        "uniform": _emit_uniform,
        "rangestream-window": _emit_rangestream_window,
        "litdata": _emit_litdata,
        "mosaic": _emit_mosaic,
    }[name]


def emit(name: str, tokens: int, epochs: int, work: Path) -> dict[str, Any]:
    """Run ``name``'s system, save its emitted order to ``work/orders/``; return its facts."""
    started = time.perf_counter()
    epochs_out, facts = _emitter(name)(tokens, epochs, work)
    orders = work / "orders"
    orders.mkdir(parents=True, exist_ok=True)
    np.savez(orders / f"{name}.npz", *[np.stack(batches) for batches in epochs_out])
    facts = {**facts, "seconds": time.perf_counter() - started}
    (orders / f"{name}.json").write_text(json.dumps(facts))
    return facts


# -- figures: from the emitted orders, the same for every system --------------------------------


def figures(batches: np.ndarray, dataset_bytes: int) -> dict[str, float]:
    """The quality figures of one epoch (``batches``: steps x batch source byte offsets)."""
    hood = batches // NEIGHBOURHOOD
    batch = batches.shape[1]
    same = (hood[:, :, None] == hood[:, None, :]).sum(axis=(1, 2)) - batch
    pairs = float(same.mean() / (batch * (batch - 1)))
    distance = np.abs(np.diff(batches.reshape(-1)))
    return {
        "same_pairs": pairs,
        "median_distance": float(np.median(distance) / dataset_bytes),
        "near_neighbours": float(np.mean(distance < NEIGHBOURHOOD)),
    }


def _summary(per_epoch: list[dict[str, float]]) -> dict[str, list[float]]:
    """Mean, min and max over epochs of each figure."""
    return {
        key: [
            float(np.mean([e[key] for e in per_epoch])),
            min(e[key] for e in per_epoch),
            max(e[key] for e in per_epoch),
        ]
        for key in per_epoch[0]
    }


def quality(
    tokens: int, epochs: int, work: Path, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    """The section of the results: one row per order found in ``work/orders/``."""
    errors = errors or {}
    dataset_bytes = tokens * TOKEN.itemsize
    windows = num_windows(tokens)
    rows: list[dict[str, Any]] = []
    for order in ORDERS:
        row: dict[str, Any] = {
            "name": order.name,
            "label": order.label,
            "emitted_by": order.emitted_by,
        }
        path = work / "orders" / f"{order.name}.npz"
        if order.name in errors or not path.exists():
            row["error"] = errors.get(order.name, "no order emitted")
            rows.append(row)
            continue
        with np.load(path) as saved:
            epochs_saved = [saved[key] for key in saved.files]
        facts = json.loads((work / "orders" / f"{order.name}.json").read_text())
        row.update(facts)
        row.update(_summary([figures(batches, dataset_bytes) for batches in epochs_saved]))
        row["batches"] = [int(batches.shape[0]) for batches in epochs_saved]
        rows.append(row)
    return {
        "tokens": tokens,
        "epochs": epochs,
        "windows": windows,
        "dataset_mib": dataset_bytes / 2**20,
        "rows": rows,
    }


def _cell(value: list[float], digits: int = 3) -> str:
    mean, low, high = value
    if high - low < 10 ** -(digits + 1):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}{DASH}{high:.{digits}f}]"


def render(section: dict[str, Any]) -> list[str]:
    """The markdown table of a :func:`quality` section."""
    lines = [
        "| order | emitted by | mixed per worker | same 4 MiB pairs in a batch | consecutive "
        "windows within 4 MiB | median distance of consecutive windows (of the dataset) "
        "| reads |",
        "|---|---|---|--:|--:|--:|---|",
    ]
    for row in section["rows"]:
        if "error" in row:
            lines.append(
                f"| {row['label']} | {row['emitted_by']} | **not measured**: "
                f"{str(row['error'])[:160]} |" + f" {DASH} |" * 4
            )
            continue
        lines.append(
            f"| {row['label']} | {row['emitted_by']} | {row['memory']} | "
            f"{_cell(row['same_pairs'])} | {_cell(row['near_neighbours'])} | "
            f"{_cell(row['median_distance'])} | {row['reads']} |"
        )
    return lines


# -- standalone ---------------------------------------------------------------------------------


def _scale_table() -> list[str]:
    """Requests per window of the block shuffle for many readers (request arithmetic)."""
    from rangestream.loader.orders.block_shuffle import (
        BlockShuffle,
        buffer_runs_for,
        run_windows_for,
    )

    layouts = ((1, 2), (8, 4), (64, 8))
    lines = [
        "Requests per window (bytes read per payload byte), every reader of one epoch; "
        "`auto` is `buffer_runs_for(n, R, ranks x workers, most=8)`:",
        "",
        "| dataset | K, run | "
        + " | ".join(f"{w} ranks x {nw} workers" for w, nw in layouts)
        + " |",
        "|---|---|" + "---|" * len(layouts),
    ]
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
            lines.append(
                f"| {tokens / 1e6:,.0f}M tokens | {name} | "
                + " | ".join(f"{c[0]:.4f} ({c[1]:.2f}x)" for c in cells)
                + " |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64_000_000, help="tokens in the stream")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per system")
    parser.add_argument("--no-litdata", action="store_true", help="skip LitData's run")
    parser.add_argument("--work", type=Path, help="where data and orders go (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    from benchmarks.config import WORK_DIR

    work = args.work or WORK_DIR / "shuffle" / "standalone"
    errors: dict[str, str] = {}
    print(f"{num_windows(args.tokens)} windows of {WINDOW} tokens", file=sys.stderr)
    for order in ORDERS:
        if order.interpreter != "main" or (args.no_litdata and order.name == "litdata"):
            errors[order.name] = "not run here (`python -m benchmarks run` runs every order)"
            continue
        facts = emit(order.name, args.tokens, args.epochs, work)
        print(f"  {order.name}: {facts['seconds']:.1f} s", file=sys.stderr)
    section = quality(args.tokens, args.epochs, work, errors)
    print(f"\n`python -m benchmarks.shuffle_quality --tokens {args.tokens} --epochs {args.epochs}`")
    print(
        f"({section['windows']} windows of {WINDOW} tokens, {section['dataset_mib']:.0f} MiB; "
        f"one rank, {WORKERS} workers, batches of {BATCH}; mean over {args.epochs} epochs "
        "[min-max])\n"
    )
    print("\n".join(render(section)))
    print()
    print("\n".join(_scale_table()))
    if args.json:
        args.json.write_text(json.dumps(section, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
