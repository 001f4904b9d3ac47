"""Temporal datasets at scale, narrow windows, and the costs on the local hot path.

Run: ``python -m benchmarks.temporal_index [--records 1000,100000,10000000] [--part P]``
(``P``: ``scale``, ``overfetch``, ``hot``, ``willneed``; all by default). Standalone: it
writes its own data under a temporary directory and prints plain tables.

- ``scale``: open + first window of a dataset of N one-field records (one byte a frame):
  requests, bytes, memory held (tracemalloc) and wall time, then 2,000 random windows
  (index requests, memory held). Written in seconds by a bulk encoder (one ``append``
  per shard appends every record of it).
- ``overfetch``: bytes fetched by windows of 1, 2, 16 and 64 frames of each field of a
  LitData-style record, from exact counters (also runs against an older rangestream:
  ``PYTHONPATH=<old>/src`` gives the "before" numbers).
- ``hot``: a bare loop of random 64-frame local windows (features + the small group):
  the compiled copier's guard against truncation (SIGBUS), against no guard and against
  an ``fstat`` per copy.
- ``draws``: the loader's window draws over N records of 1..40 frames (windows of 16
  frames, record sampling), drawn from the record index by range against the exact
  per-record draw (every record's count read once and kept), in the same run: set-up
  time and memory, then microseconds and index requests per window (batches of 8).
- ``worker``: a DataLoader worker drawing 800 windows of 3 frames over N records of
  1, 2, 3, 1, ... frames (written in shards of at most 10^7 records): what the loader's
  process reads to count the epoch, and the worker's memory held and requests by kind.
- ``willneed``: random 64 KiB windows out of mapped files after evicting their pages
  (``posix_fadvise(DONTNEED)``), with and without ``madvise(MADV_WILLNEED)`` on the
  window's pages first.
"""

from __future__ import annotations

import argparse
import copy
import mmap
import os
import tempfile
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import numpy as np

from rangestream import TemporalArrayStorage

PARTS = ("scale", "overfetch", "hot", "willneed", "draws", "worker")


# -- scale -----------------------------------------------------------------------------------
def _bulk_storage_class() -> type:
    from rangestream.storage.core.kind import ShardEncoder
    from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

    class BulkEncoder(ShardEncoder):
        def __init__(self, schema: Any) -> None:
            self.array = schema.groups[0].array

        def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
            counts = np.asarray(data, dtype=np.int64)
            first = lengths[self.array]
            ends = first + np.cumsum(counts)
            values = (np.arange(first, int(ends[-1])) % 251).astype(np.uint8)
            return {self.array: values, RECORD_ROWS: np.stack([ends - counts, ends], axis=1)}

    class Bulk(TemporalArrayStorage):
        def bind_record(self, data: Any) -> Any:
            bound = copy.copy(self)
            bound._bound = TemporalSchema.from_record({"x": np.zeros(1, np.uint8)})
            return bound

        def shard_encoder(self) -> Any:
            return BulkEncoder(self._bound)

    return Bulk


def scale(records: list[int], root: str) -> None:
    print("records | write s | open+first: requests, bytes, held MiB, ms | 2,000 random: "
          "index requests, held MiB")  # fmt: skip
    bulk = _bulk_storage_class()
    for count in records:
        path = os.path.join(root, f"scale-{count}")
        counts = 1 + np.arange(count, dtype=np.int64) % 3
        started = time.perf_counter()
        storage = bulk(path)
        with storage.sync_writer() as writer:
            writer.append(0, counts)
        written = time.perf_counter() - started
        del counts
        tracemalloc.start()
        started = time.perf_counter()
        reader = TemporalArrayStorage(path)
        reader.read_window(count // 2, 0, 1)
        elapsed = time.perf_counter() - started
        first = reader.stats
        held = tracemalloc.get_traced_memory()[0]
        rng = np.random.default_rng(1)
        for record in rng.integers(0, count, 2000).tolist():
            reader.read_window(record, 0, 1)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        index = (reader.stats - first).by_key_kind.get("record_rows", 0)
        print(f"{count:>10,} | {written:6.1f} | {first.requests}, {first.bytes:,}, "
              f"{held / 2**20:.2f}, {elapsed * 1e3:.1f} | {index}, "
              f"{after / 2**20:.2f}")  # fmt: skip


# -- over-fetch ----------------------------------------------------------------------------------
def overfetch(root: str) -> None:
    rng = np.random.default_rng(2)
    frames = 600
    record = {
        "features": rng.standard_normal((frames, 256)).astype(np.float32),
        "clock": np.arange(frames, dtype=np.float64),
        "valid": rng.random(frames) > 0.5,
        "pose": rng.standard_normal((frames, 7)).astype(np.float32),
    }
    payload = {name: value[0].nbytes for name, value in record.items()}
    for label, groups in (("separate", None), ("grouped", [["clock", "valid", "pose"]])):
        path = os.path.join(root, f"overfetch-{label}")
        storage = TemporalArrayStorage(path, groups)
        with storage.sync_writer() as writer:
            writer.append(0, record)
        storage = TemporalArrayStorage(path)
        storage.read_window(0, 0, 1, ["clock"])  # opens, reads the index
        print(f"\n{label} fields: mean bytes fetched / payload bytes over 64 starts")
        print("field    | 1 frame | 2 frames | 16 frames | 64 frames")
        fields = ["clock", "valid", "pose", "features"]
        for name in fields:
            cells = []
            for length in (1, 2, 16, 64):
                spent = 0
                for start in range(100, 164):
                    before = storage.stats.copy()
                    storage.read_window(0, start, length, [name])
                    spent += (storage.stats - before).bytes
                mean = spent / 64
                cells.append(f"{mean:,.0f} / {payload[name] * length:,}")
            print(f"{name:8} | " + " | ".join(cells))
        spent = 0
        for start in range(100, 164):  # a cold window of every field: clock, valid, pose
            before = storage.stats.copy()
            storage.read_window(0, start, 1, ["clock", "valid", "pose"])
            spent += (storage.stats - before).bytes
        print(f"1 frame of clock+valid+pose: {spent / 64:,.0f} B for 37 B")


# -- the hot path: the size check ------------------------------------------------------------
def _windows(storage: TemporalArrayStorage, count: int, frames: int, seed: int) -> list[Any]:
    counts = np.asarray(storage.frame_counts)
    rng = np.random.default_rng(seed)
    records = rng.integers(0, len(counts), count)
    starts = [int(rng.integers(0, int(counts[r]) - frames + 1)) for r in records]
    return list(zip(records.tolist(), starts, strict=True))


def _records(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(count):
        frames = int(rng.integers(300, 1500))
        out.append({
            "features": rng.standard_normal((frames, 256)).astype(np.float32),
            "clock": np.arange(frames, dtype=np.float64),
            "valid": rng.random(frames) > 0.5,
            "pose": rng.standard_normal((frames, 7)).astype(np.float32),
        })  # fmt: skip
    return out


def _loop(storage: TemporalArrayStorage, windows: list[Any], fields: list[str]) -> float:
    """CPU seconds per window (the machine is shared: CPU time is steadier than wall time)."""
    read = storage.read_window
    started = time.process_time()
    for record, start in windows:
        read(record, start, 64, fields)
    return (time.process_time() - started) / len(windows)


def hot(root: str) -> None:
    """The guard against truncation on the hot path, against its alternatives: the copier
    called through a wrapper without ``size_now`` (no guard, no check: the floor, plus the
    wrapper's call), and the same wrapper asking the file's size first (an ``fstat`` per
    copy, the design the guard replaced)."""
    from rangestream.layout import copy as row_copy

    path = os.path.join(root, "hot")
    storage = TemporalArrayStorage(path, [["clock", "valid", "pose"]])
    with storage.sync_writer() as writer:
        for number, record in enumerate(_records(200)):
            writer.append(number % 4, record)
    fields = ["features", "pose"]
    compiled = row_copy.copy_piece

    def unguarded(*args: Any) -> int:
        return compiled(*args[:9])  # type: ignore[no-any-return]

    def fstat_first(*args: Any) -> int:
        args[9]()  # the file's size now, as the per-copy check asked it
        return compiled(*args[:9])  # type: ignore[no-any-return]

    variants = {"guarded": compiled, "unguarded": unguarded, "fstat": fstat_first}
    results: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(5):
        order = list(variants) if repeat % 2 else list(reversed(variants))
        for name in order:
            row_copy.copy_piece = variants[name]  # bound by the executor when opened
            reader = TemporalArrayStorage(path)
            counts = np.asarray(reader.frame_counts)
            for record in range(len(counts)):  # every chunk verified: the steady state
                reader.read_window(record, 0, int(counts[record]), fields)
            windows = _windows(reader, 20000, 64, seed=repeat)
            results[name].append(_loop(reader, windows, fields))
    row_copy.copy_piece = compiled
    for name, times in results.items():
        print(f"{name:9}: {min(times) * 1e6:.2f} µs CPU per window (best of 5; all: "
              f"{', '.join(f'{t * 1e6:.2f}' for t in times)})")  # fmt: skip


# -- madvise(MADV_WILLNEED) -------------------------------------------------------------------
def willneed(root: str) -> None:
    files = []
    for number in range(16):
        path = os.path.join(root, f"willneed-{number}")
        with open(path, "wb") as handle:
            handle.write(np.random.default_rng(number).bytes(16 << 20))
        files.append(path)
    window = 64 << 10
    rng = np.random.default_rng(4)
    picks = [
        (int(rng.integers(16)), int(rng.integers(0, (16 << 20) - window))) for _ in range(3000)
    ]

    def run(advise: bool, cold: bool) -> float:
        mappings = []
        os.sync()  # dirty pages are not dropped
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            if cold:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            mappings.append(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
            os.close(fd)
        arrays = [np.frombuffer(m, dtype=np.uint8) for m in mappings]
        page = mmap.PAGESIZE
        started = time.perf_counter()
        for number, offset in picks:
            if advise:
                low = offset - offset % page
                mappings[number].madvise(mmap.MADV_WILLNEED, low, offset + window - low)
            arrays[number][offset : offset + window].copy()
        elapsed = (time.perf_counter() - started) / len(picks)
        del arrays
        for m in mappings:
            m.close()
        return elapsed

    for cold in (True, False):
        times = {False: [], True: []}
        for repeat in range(3):
            for advise in (False, True) if repeat % 2 else (True, False):
                times[advise].append(run(advise, cold))
        state = "cold (pages evicted)" if cold else "warm (page cache, new mapping)"
        print(f"{state}: plain {min(times[False]) * 1e6:.1f} µs, WILLNEED "
              f"{min(times[True]) * 1e6:.1f} µs per 64 KiB window (best of 3)")  # fmt: skip


def draws(records: list[int], root: str) -> None:
    from rangestream.loader.orders.window_sampler import WindowSampler

    print("records | draw (index: proposals a round as the sampler chooses; index-1: one) | "
          "set-up ms, held MiB | µs per window, index requests per window (batches of 8, "
          "best of 3 runs of 2,000)")  # fmt: skip
    bulk = _bulk_storage_class()
    for count in records:
        path = os.path.join(root, f"draws-{count}")
        counts = np.random.default_rng(2).integers(1, 41, size=count)
        with bulk(path).sync_writer() as writer:
            writer.append(0, counts)
        del counts
        for method in ("index", "index-1", "exact"):
            with TemporalArrayStorage(path).sync_reader() as reader:
                tracemalloc.start()
                started = time.perf_counter()
                sampler = WindowSampler(reader.frame_histogram(), 16)
                if method == "index-1":  # one proposal per counter per round
                    sampler.candidates = 1
                if method == "exact":
                    sampler.proposal = "exact"
                    sampler.draw(np.arange(1), seed=0, epoch=0, index=reader)  # reads all
                setup = time.perf_counter() - started
                held = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
                before = reader.stats.by_key_kind.get("record_rows", 0)
                times = []
                for run in range(3):
                    started = time.perf_counter()
                    for low in range(run * 2000, run * 2000 + 2000, 8):
                        sampler.draw(np.arange(low, low + 8), seed=0, epoch=0, index=reader)
                    times.append(time.perf_counter() - started)
                index = reader.stats.by_key_kind.get("record_rows", 0) - before
                runs = ", ".join(f"{t / 2000 * 1e6:.1f}" for t in times)
                print(f"{count:>10,} | {method} | {setup * 1e3:8.1f}, {held / 2**20:7.2f} | "
                      f"{min(times) / 2000 * 1e6:7.1f} (runs {runs}), "
                      f"{index / 6000:.2f}")  # fmt: skip


def _trace_memory(worker_id: int) -> None:
    tracemalloc.start()


def _worker_costs(samples: list[Any]) -> tuple[int, int, Any]:
    from rangestream.io import process_io_stats

    return len(samples), tracemalloc.get_traced_memory()[0], process_io_stats()


def worker(records: list[int], root: str) -> None:
    import itertools

    from rangestream.loader import StatefulDataLoader

    print("records | write s | loader process: requests, bytes | worker after 800 windows: "
          "held MiB, requests by kind, bytes by kind")  # fmt: skip
    bulk = _bulk_storage_class()
    for count in records:
        path = os.path.join(root, f"worker-{count}")
        started = time.perf_counter()
        with bulk(path).sync_writer() as writer:
            for shard, low in enumerate(range(0, count, 10**7)):
                high = min(count, low + 10**7)
                writer.append(shard, 1 + np.arange(low, high, dtype=np.int64) % 3)
        written = time.perf_counter() - started
        storage = TemporalArrayStorage(path)
        loader = StatefulDataLoader.from_storage(
            storage, _worker_costs, sequence_length=3, batch_size=8, num_workers=1,
            head_start=False, worker_init_fn=_trace_memory, rank=0, world_size=1,
        )  # fmt: skip
        len(loader)
        opened = storage.stats
        *_, (_size, held, stats) = itertools.islice(loader, 100)
        print(f"{count:>11,} | {written:5.1f} | {opened.requests}, {opened.bytes:,} | "
              f"{held / 2**20:.2f}, {stats.by_key_kind}, {stats.bytes_by_key_kind}")  # fmt: skip
        del loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", default="1000,100000,1000000,10000000")
    parser.add_argument("--part", action="append", choices=PARTS)
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as root:
        if "scale" in parts:
            scale([int(n) for n in args.records.split(",")], root)
        if "overfetch" in parts:
            overfetch(root)
        if "hot" in parts:
            print()
            hot(root)
        if "willneed" in parts:
            print()
            willneed(root)
        if "draws" in parts:
            print()
            draws([int(n) for n in args.records.split(",")], root)
        if "worker" in parts:
            print()
            worker([int(n) for n in args.records.split(",")], root)


if __name__ == "__main__":
    main()
