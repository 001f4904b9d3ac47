"""Random local windows as the working set of blocks grows (the mapping cache).

Run: ``python -m benchmarks.scale.mapped --label after [--quick]``.

A stream of int32 tokens in blocks of 64 KiB (so 10^4 blocks are 640 MiB and stay in the
page cache), read as random 2,049-token windows (``StreamDataset(...).sync_reader()[i]``)
whose starts lie in the first ``W`` blocks, for ``W`` from 10 to 10^4; the reference is
numpy's memmap of the same tokens in one raw file, sliced over the same span. Per point:
microseconds per window (median and range over passes, after a warm-up pass), minor page
faults per window, the blocks mapped at the end and the process's mappings
(``/proc/self/maps``).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scale import harness

BLOCK_BYTES = 64 * 1024
WINDOW = 2049
WORKING_SETS = (10, 100, 256, 1000, 3000, 10**4)
WINDOWS_PER_PASS = 100_000


def write(path: Path, blocks: int) -> tuple[int, Path]:
    """The dataset (if not there yet) and the raw file of the same tokens."""
    storage = harness.storage("stream", str(path / "ds"), block_bytes=BLOCK_BYTES)
    raw = path / "tokens.i4"
    if not (path / "ds" / "zarr.json").exists():
        tokens_per_block = storage.array_layouts()["stream"].block_rows
        total = blocks * tokens_per_block + WINDOW
        with storage.sync_writer(overwrite=True) as writer, open(raw, "wb") as out:
            step = 1 << 20
            for start in range(0, total, step):
                tokens = np.arange(start, min(total, start + step), dtype="<i4")
                writer.append(0, {"t": tokens})
                out.write(tokens.tobytes())
    return storage.array_layouts()["stream"].block_rows, raw


def measure(path: str, working_sets: list[int], passes: int) -> dict:
    from rangestream import StreamDataset

    root = Path(path)
    storage = harness.storage("stream", str(root / "ds"), block_bytes=BLOCK_BYTES)
    block_rows = storage.array_layouts()["stream"].block_rows
    tokens = np.memmap(root / "tokens.i4", dtype="<i4", mode="r")
    dataset = StreamDataset(storage, WINDOW - 1, next_token=True, stride=1)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    with dataset.sync_reader() as reader:
        for blocks in working_sets:
            starts = rng.integers(0, blocks * block_rows - WINDOW, WINDOWS_PER_PASS).tolist()

            def ours(starts: list[int] = starts) -> None:
                for start in starts:
                    reader[start]

            def memmap(starts: list[int] = starts) -> None:
                for start in starts:
                    np.array(tokens[start : start + WINDOW])

            check = reader[starts[0]]["t"]
            assert np.array_equal(check, np.arange(starts[0], starts[0] + WINDOW)), "wrong window"
            row: dict[str, Any] = {}
            for name, loop in (("rangestream", ours), ("memmap", memmap)):
                loop()  # warm: page cache, mappings, verified chunks
                times, faults = [], []
                for _ in range(passes):
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    began = time.perf_counter()
                    loop()
                    times.append((time.perf_counter() - began) / len(starts) * 1e6)
                    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    faults.append((after - before) / len(starts))
                row[name] = {"us_per_window": harness.spread(times), "faults": min(faults)}
            opened = reader.storage_reader.opened
            row["mapped_blocks"] = len(opened.mapped.maps) if opened.mapped is not None else 0
            with open("/proc/self/maps") as maps:
                row["process_mappings"] = sum(1 for _ in maps)
            out[str(blocks)] = row
            print(blocks, row, flush=True)
    return out


def run(label: str, quick: bool) -> dict:
    data = harness.work_dir(label, "mapped")
    sets = [w for w in WORKING_SETS if not quick or w <= 1000]
    write(data, max(sets))
    return {
        "library": harness.code_version(),
        "block_bytes": BLOCK_BYTES,
        "max_map_count": int(Path("/proc/sys/vm/max_map_count").read_text()),
        "points": harness.in_subprocess(
            "benchmarks.scale.mapped:measure", str(data), sets, 2 if quick else 5
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(harness.save(args.label, "mapped", run(args.label, args.quick)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
