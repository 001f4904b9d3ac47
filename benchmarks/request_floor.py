"""The fewest GETs per window each token layout allows: the geometry behind the
``s3torchconnector`` rows (issue 30), computed exactly from what is stored.

A range GET reads bytes of one object, so over objects that do not overlap a window costs at
least one GET per object it touches, whatever the reader does:

- **random windows**: ``1 +`` the fraction of windows that straddle an object end. With
  objects of at most 4 MiB both layouts store the token workload in 20 objects (19 ends), so
  the expected figure is the same for both; which of the *measured* windows (the first few
  thousand of the list, from the harness's cursor) straddle an end depends on where the ends
  lie, which is what separates the two rows.
- **in order, in stretches** (``rangestream-loader``): a stretch of consecutive windows is
  one range per object its bytes lie in. Consecutive windows share a token (``next_token``),
  so every object end lies inside a window and the two reads either side of a stretch
  boundary both read the object that boundary lies in: GETs per epoch = objects + reads - 1
  (the lead-in batches are reads too), wherever the stretch boundaries are put. Stretches that
  end at object ends change nothing; fewer GETs need longer stretches (more read-ahead
  memory), stretches split across workers and stitched, or objects that overlap.
- **``s3torch-iterable``**: one GET per object and a LIST per worker per epoch; the windows
  that straddle an object end are not emitted (an equivalent job, not the same one).

``python -m benchmarks.request_floor [--quick]`` prints the figures for the prepared data.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.config import FULL_SIZES, LOADER_BATCH, LOADER_WORKERS, QUICK_SIZES, WORK_DIR
from benchmarks.systems.s3torch_systems import OBJECT_TOKENS


def rangestream_object_ends(
    url: str | Path, storage_options: dict[str, Any] | None = None
) -> tuple[np.ndarray, int]:
    """Global token positions where one stored stream block (one object) ends and the next
    begins, and the stream's length, read from the dataset's manifest and block layout."""
    from rangestream import StreamStorage

    storage = StreamStorage(str(url), storage_options=storage_options or {})
    opened = storage.default_opening.get_sync()
    ends: list[int] = []
    base = 0
    for shard in opened.shard_ids:
        length = opened.shard_length("stream", shard)
        block_rows = opened.array(shard, "stream").layout.block_rows
        ends.extend(base + b for b in range(block_rows, length, block_rows))
        base += length
        ends.append(base)
    return np.asarray(ends[:-1], dtype=np.int64), base


def fixed_object_ends(total: int, per_object: int = OBJECT_TOKENS) -> np.ndarray:
    """Object ends of a stream cut into objects of ``per_object`` tokens (s3torch's)."""
    return np.arange(per_object, total, per_object, dtype=np.int64)


def objects_touched(ends: np.ndarray, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Objects that tokens ``[first, stop)`` lie in (``stop > first``), per range."""
    return np.searchsorted(ends, stop - 1, side="right") - np.searchsorted(ends, first, "right") + 1


def random_gets(ends: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """GETs each window at ``starts`` costs at the least: the objects it touches."""
    starts = np.asarray(starts, dtype=np.int64)
    return objects_touched(ends, starts, starts + length)


@dataclass(frozen=True)
class InOrder:
    """GETs of one in-order epoch read in stretches, per window emitted."""

    windows: int
    gets: int
    stretches: int

    @property
    def per_window(self) -> float:
        return self.gets / self.windows


def in_order_epoch(
    ends: np.ndarray,
    total: int,
    length: int,
    stride: int,
    batch: int,
    workers: int,
    stretch_steps: int,
) -> InOrder:
    """The loader's epoch in sequence order (its lead-in and stretches, as
    :meth:`EpochPlan.worker_stretches` deals them): each stretch one range per object."""
    from rangestream.loader.orders.sequence_plan import EpochPlan

    windows = (total - length) // stride + 1
    plan = EpochPlan(num_samples=windows, batch_size=batch)
    steps = sorted(
        (r.start, r.stop)
        for w in range(workers)
        for r in plan.worker_stretches(w, workers, stretch_steps)
    )
    first = np.array([a * batch * stride for a, _ in steps], dtype=np.int64)
    stop = np.array([(b * batch - 1) * stride + length for _, b in steps], dtype=np.int64)
    gets = int(objects_touched(ends, first, stop).sum())
    return InOrder(windows=plan.num_steps * batch, gets=gets, stretches=len(steps))


def whole_objects_epoch(total: int, length: int, stride: int, workers: int) -> InOrder:
    """``s3torch-iterable``: every object in one GET, a LIST per worker; the windows that
    lie inside one object, the only ones it emits."""
    windows = 0
    for base in range(0, total, OBJECT_TOKENS):
        end = min(base + OBJECT_TOKENS, total)
        first = -(-base // stride) * stride
        if end - length >= first:
            windows += (end - length - first) // stride + 1
    objects = -(-total // OBJECT_TOKENS)
    return InOrder(windows=windows, gets=objects + workers, stretches=objects)


def report(quick: bool, prefixes: Sequence[int] = (1000, 5000, 20000)) -> list[str]:
    """Markdown lines: both layouts' object ends, random windows' and an in-order epoch's
    GETs per window."""
    from rangestream.loader.reading.sequential import MAX_STRETCH_STEPS, STRETCH_READ_BYTES

    sizes = QUICK_SIZES if quick else FULL_SIZES
    tag = "quick" if quick else "full"
    ends, total = rangestream_object_ends(WORK_DIR / "prepared" / tag / "rangestream/tokens/ds")
    fixed = fixed_object_ends(total)
    length, stride = sizes.window_tokens, sizes.window_stride
    starts = np.load(WORK_DIR / "data" / tag / "tokens" / "windows_random.npy")
    order = (1 + np.arange(len(starts))) % len(starts)  # the harness's Cursor(start=1)
    lines = [
        f"tokens: {total:,}; object ends: rangestream {len(ends)}, s3torch {len(fixed)}; "
        f"expected GETs per random window for both: "
        f"{1 + len(ends) * (length - 1) / (total - length + 1):.5f} (rangestream), "
        f"{1 + len(fixed) * (length - 1) / (total - length + 1):.5f} (s3torch)",
        "",
        "| random windows (harness order) | rangestream GETs/window | s3torch GETs/window |",
        "|---|--:|--:|",
    ]
    ours, theirs = (
        random_gets(ends, starts[order], length),
        random_gets(fixed, starts[order], length),
    )
    for n in [*prefixes, len(starts)]:
        lines.append(f"| first {n:,} | {ours[:n].mean():.5f} | {theirs[:n].mean():.5f} |")
    steps = max(1, min(MAX_STRETCH_STEPS, STRETCH_READ_BYTES // (stride * 4 * LOADER_BATCH)))
    lines += ["", "| in-order epoch | windows | GETs | GETs/window |", "|---|--:|--:|--:|"]
    for label, k in (("rangestream-loader (as built)", 1), ("stretches 2x as long", 2)):
        epoch = in_order_epoch(ends, total, length, stride, LOADER_BATCH, LOADER_WORKERS, k * steps)
        lines.append(
            f"| {label}: {epoch.stretches} reads of up to {k * steps} steps | "
            f"{epoch.windows:,} | {epoch.gets} | {epoch.per_window:.5f} |"
        )
    s3t = whole_objects_epoch(total, length, stride, LOADER_WORKERS)
    lines.append(
        f"| s3torch-iterable: whole objects + {LOADER_WORKERS} LISTs, straddling windows "
        f"dropped | {s3t.windows:,} | {s3t.gets} | {s3t.per_window:.5f} |"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.request_floor")
    parser.add_argument("--quick", action="store_true", help="the --quick run's data")
    args = parser.parse_args(argv)
    print("\n".join(report(args.quick)))


if __name__ == "__main__":
    main()
