"""What mixing costs in the loader: CPU per sample and requests, against one source.

Run: ``python -m benchmarks.mixed_loader`` (``--windows``, ``--repeats``).

Both loaders read the same number of shuffled 2,049-token windows from local disk in one
process (``num_workers=0``, so every microsecond of the loader is in this process's CPU
time), batches of 8:

- ``single``: ``from_storage`` over one storage of ``2 * W`` windows, per-window shuffle;
- ``mixed``: ``from_storages({a: 0.5, b: 0.5})`` over two storages of ``W`` windows each
  (the same tokens split in two), each source shuffled per window by the mixture.

Reported: CPU seconds per sample for a whole epoch (median and range over alternating
repeats), the difference, and requests per sample from the loader's own counters
(``source_stats``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

WINDOW = 2049


def _write(url: str, tokens: np.ndarray) -> object:
    from rangestream import StreamNumpyFormat, StreamStorage

    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    return storage


def epoch_cpu(loader: object) -> tuple[float, int, int]:
    """CPU seconds of one epoch, samples, requests."""
    started = time.process_time()
    samples = 0
    for batch in loader:  # type: ignore[attr-defined]
        samples += batch["tokens"].shape[0]
    cpu = time.process_time() - started
    requests = sum(s["requests"] for s in loader.source_stats().values())  # type: ignore[attr-defined]
    return cpu, samples, requests


def main(argv: list[str] | None = None) -> int:
    from rangestream import StatefulDataLoader

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4000, help="windows per mixed source")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mixed-loader-") as tmp:
        work = Path(tmp)
        half = args.windows * (WINDOW - 1)
        tokens = np.arange(2 * half + 1, dtype=np.int64).astype("<i4")
        whole = _write(str(work / "whole"), tokens)
        a = _write(str(work / "a"), tokens[: half + 1])
        b = _write(str(work / "b"), tokens[half:])
        common = {"sequence_length": WINDOW - 1, "next_token": True, "batch_size": 8,
                  "num_workers": 0, "shuffle": "window", "rank": 0, "world_size": 1}  # fmt: skip
        results: dict[str, list[tuple[float, int, int]]] = {"single": [], "mixed": []}
        for repeat in range(args.repeats + 1):
            single = StatefulDataLoader.from_storage(whole, **common)
            mixed = StatefulDataLoader.from_storages(
                {a: 0.5, b: 0.5}, names={a: "a", b: "b"},
                **{**common, "shuffle": True},
            )  # fmt: skip
            for name, loader in (("single", single), ("mixed", mixed))[:: 1 - 2 * (repeat % 2)]:
                measured = epoch_cpu(loader)
                if repeat:  # the first round warms the page cache and the imports
                    results[name].append(measured)
    per_sample = {name: [cpu / n for cpu, n, _ in rows] for name, rows in results.items()}
    print("| loader | samples | CPU us / sample | requests / sample |")
    print("| --- | --- | --- | --- |")
    for name, rows in results.items():
        values = [1e6 * v for v in per_sample[name]]
        cpu = f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
        print(f"| {name} | {rows[0][1]} | {cpu} | {rows[0][2] / rows[0][1]:.4f} |")
    differences = [1e6 * (m - s) for m, s in zip(per_sample["mixed"], per_sample["single"],
                                                  strict=True)]  # fmt: skip
    print(f"\nmixed - single, per repeat pair: median {statistics.median(differences):.2f} us "
          f"per sample (range {min(differences):.2f} to {max(differences):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
