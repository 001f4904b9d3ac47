"""A writer's memory and requests as the number of shards it owns grows.

Run: ``python -m benchmarks.scale.writers --label after [--quick]``.

One writer appends records of 64 KiB to ``S`` shards in turn (round robin, the worst case
for any buffer policy) until each holds 1 MiB, a quarter of a 4 MiB block, so no block
fills before the writer closes. Reported: the peak memory traced during the appends and
the close (the buffers), the store calls the write made (puts, reads and deletes of whole
objects, counted by wrapping the local store's methods), the objects left in the dataset,
and the time. Where the writer takes a memory budget (``max_buffered_bytes``), the series
runs with the default and with 64 MiB.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections import Counter
from typing import Any

import numpy as np

from benchmarks.scale import harness

SHARDS = (10, 100, 1000)
PER_SHARD = 1 << 20
RECORD = 64 * 1024


def measure(url: str, shards: int, budget: int | None) -> dict:
    import tracemalloc

    from rangestream.io.local import LocalStore

    calls: Counter[str] = Counter()
    for name in (
        "put_sync",
        "put",
        "get_range",
        "get",
        "get_sync",
        "get_range_sync",
        "delete_prefix",
    ):
        original = getattr(LocalStore, name, None)
        if original is None:
            continue

        def wrapper(
            self: Any, *args: Any, _name: str = name, _original: Any = original, **kw: Any
        ) -> Any:
            calls[_name] += 1
            return _original(self, *args, **kw)

        setattr(LocalStore, name, wrapper)
    storage = harness.storage("document", url)
    session = storage.parallel_write(overwrite=True)
    options = {} if budget is None else {"max_buffered_bytes": budget}
    payload = np.random.default_rng(0).integers(0, 256, RECORD, dtype=np.uint8).tobytes()
    tracemalloc.start()
    began = time.perf_counter()
    with session.sync_writer(**options) as writer:
        for _ in range(PER_SHARD // RECORD):
            for shard in range(shards):
                writer.append(shard, payload)
    seconds = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    write_calls = dict(calls)
    session.commit()
    with storage.sync_reader() as reader:
        last = reader.read(len(reader) - 1)
        assert last == payload and len(reader) == shards * (PER_SHARD // RECORD)
    return {"peak_bytes": peak, "seconds": seconds, "store_calls": write_calls}


def run(label: str, quick: bool) -> dict:
    from rangestream.storage.core.writing import DatasetWriter

    budgets: list[int | None] = [None]
    if "max_buffered_bytes" in inspect.signature(DatasetWriter.__init__).parameters:
        budgets.append(64 << 20)
    data = harness.work_dir(label, "writers")
    result: dict[str, Any] = {"library": harness.code_version(), "per_shard": PER_SHARD}
    for budget in budgets:
        name = "default" if budget is None else str(budget)
        for shards in SHARDS[:2] if quick else SHARDS:
            url = str(harness.fresh_dir(data / f"w-{shards}") / "ds")
            row = harness.in_subprocess("benchmarks.scale.writers:measure", url, shards, budget)
            files, logical, _ = harness.directory_bytes(data / f"w-{shards}")
            row.update(objects=files, stored_bytes=logical)
            result.setdefault(name, {})[str(shards)] = row
            print(name, shards, row, flush=True)
            harness.shutil.rmtree(data / f"w-{shards}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(harness.save(args.label, "writers", run(args.label, args.quick)))


if __name__ == "__main__":
    main()
