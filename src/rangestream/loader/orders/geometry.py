"""Where a stream's windows lie in its blocks, and what reading some of them together costs.

The read path reads whole inner chunks of one block per range and coalesces ranges of one
block within the coalescing gap; :class:`WindowGeometry` reproduces that arithmetic, so the
block shuffle knows the request count of any set of windows before reading them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError, OutOfRangeError
from rangestream.io.range_reader import DEFAULT_COALESCE_GAP, DEFAULT_MAX_COALESCED_BYTES

__all__ = ["DEFAULT_RUN_BYTES", "WindowGeometry", "check_count", "run_windows_for"]

DEFAULT_RUN_BYTES = 4 << 20
"""Bytes of storage a run aims to cover: one 4 MiB range request (see ``docs/design.md``,
"The block shuffle: runs, buffers and regions", for the measurements behind it)."""


def check_count(owner: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise LoaderConfigError(f"{owner} {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class WindowGeometry:
    """Where the windows of a ``StreamDataset`` lie in the blocks of its ``StreamStorage``.

    The read path reads whole inner chunks of one block per range and coalesces ranges of
    one block that lie within ``coalesce_gap_bytes``; a window that crosses a block or shard
    boundary is one range per block. This object reproduces that arithmetic, so the request
    count of any set of windows read together is known before reading.

    Parameters
    ----------
    stream_bounds : sequence of int
        Cumulative element offsets of the shards: ``(0, len(shard 0), ...)`` (the storage
        reader's ``stream_bounds``); empty shards repeat a value.
    block_rows, chunk_rows : int
        Elements per block and per inner chunk (the stream array's layout).
    stored_chunk_bytes : int
        Bytes of one stored inner chunk, checksum included.
    stride, window_length : int
        Window ``i`` covers elements ``[i * stride, i * stride + window_length)``.
    coalesce_gap_bytes, max_coalesced_bytes : int
        The range reader's coalescing knobs.
    """

    stream_bounds: tuple[int, ...]
    block_rows: int
    chunk_rows: int
    stored_chunk_bytes: int
    stride: int
    window_length: int
    coalesce_gap_bytes: int = DEFAULT_COALESCE_GAP
    max_coalesced_bytes: int = DEFAULT_MAX_COALESCED_BYTES
    _bounds: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bounds = np.asarray(self.stream_bounds, dtype=np.int64)
        if bounds.ndim != 1 or bounds.size < 2 or bounds[0] != 0 or (np.diff(bounds) < 0).any():
            raise LoaderConfigError(
                "WindowGeometry stream_bounds must start at 0 and never decrease, got "
                f"{self.stream_bounds!r}"
            )
        for name in ("block_rows", "chunk_rows", "stored_chunk_bytes", "stride"):
            check_count("WindowGeometry", name, getattr(self, name), 1)
        check_count("WindowGeometry", "window_length", self.window_length, 1)
        check_count("WindowGeometry", "coalesce_gap_bytes", self.coalesce_gap_bytes, 0)
        check_count("WindowGeometry", "max_coalesced_bytes", self.max_coalesced_bytes, 1)
        if self.block_rows % self.chunk_rows:
            raise LoaderConfigError(
                f"WindowGeometry block_rows={self.block_rows} is not a multiple of "
                f"chunk_rows={self.chunk_rows}"
            )
        object.__setattr__(self, "stream_bounds", tuple(int(b) for b in bounds))
        object.__setattr__(self, "_bounds", bounds)

    @property
    def total_length(self) -> int:
        """Elements in the stream."""
        return int(self._bounds[-1])

    @property
    def num_windows(self) -> int:
        """Windows of the stream (as ``StreamDataset`` counts them)."""
        if self.total_length < self.window_length:
            return 0
        return (self.total_length - self.window_length) // self.stride + 1

    @property
    def block_bytes(self) -> int:
        """Stored bytes of a whole block's chunks."""
        return self.block_rows // self.chunk_rows * self.stored_chunk_bytes

    def ranges(self, windows: npt.ArrayLike) -> np.ndarray:
        """Range requests that one read of ``windows`` (together) makes.

        Returns
        -------
        numpy.ndarray
            ``int64`` rows ``(shard, block, first byte, end byte)`` of the coalesced
            requests, in storage order; its length is the request count.
        """
        indexes = np.unique(np.asarray(windows, dtype=np.int64).reshape(-1))
        if indexes.size and (indexes[0] < 0 or indexes[-1] >= self.num_windows):
            raise OutOfRangeError(
                f"windows must lie in [0, {self.num_windows}) for {self!r}, found "
                f"[{indexes[0]}, {indexes[-1]}]"
            )
        start = indexes * self.stride
        stop = start + self.window_length
        pieces: list[np.ndarray] = []
        bounds = self._bounds
        while start.size:
            shard = np.searchsorted(bounds, start, side="right") - 1
            local = start - bounds[shard]
            block = local // self.block_rows
            block_end = np.minimum(bounds[shard] + (block + 1) * self.block_rows, bounds[shard + 1])
            end = np.minimum(stop, block_end)
            low = local - block * self.block_rows
            high = end - bounds[shard] - block * self.block_rows
            first_chunk = low // self.chunk_rows
            end_chunk = -(-high // self.chunk_rows)
            pieces.append(np.stack([shard, block, first_chunk, end_chunk], axis=1))
            more = end < stop
            start, stop = end[more], stop[more]
        if not pieces:
            return np.zeros((0, 4), dtype=np.int64)
        rows = np.concatenate(pieces)
        rows = rows[np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))]
        stored = self.stored_chunk_bytes
        merged: list[list[int]] = []
        for shard, block, first, end in rows.tolist():
            if merged:
                last = merged[-1]
                if (
                    last[0] == shard
                    and last[1] == block
                    and first * stored <= last[3] + self.coalesce_gap_bytes
                    and max(last[3], end * stored) - last[2] <= self.max_coalesced_bytes
                ):
                    last[3] = max(last[3], end * stored)
                    continue
            merged.append([shard, block, first * stored, end * stored])
        return np.asarray(merged, dtype=np.int64).reshape(-1, 4)

    def requests(self, windows: npt.ArrayLike) -> int:
        """Range requests one read of ``windows`` makes (see :meth:`ranges`)."""
        return int(self.ranges(windows).shape[0])


def run_windows_for(geometry: WindowGeometry, run_bytes: int = DEFAULT_RUN_BYTES) -> int:
    """Windows per run so that a run covers about ``run_bytes`` of stored blocks.

    A run spans ``R * stride`` elements; the result is the largest ``R`` whose span stays
    within ``run_bytes`` worth of elements (at least 1).
    """
    rows = run_bytes * geometry.chunk_rows // geometry.stored_chunk_bytes
    return max(1, rows // geometry.stride)
