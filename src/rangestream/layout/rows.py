"""Reading rows of sharded arrays: row ranges to byte ranges, as read programs.

A read names row ranges of one or more arrays. The program first fetches, in one round,
the chunk indexes of blocks it has not seen (cached afterwards), then, in one more round,
the byte runs holding the rows, and returns each range's rows as a contiguous array.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rangestream.errors import CorruptDataError
from rangestream.io.range_reader import ReadProgram
from rangestream.io.ranges import ByteRequest, RangeRequest, SuffixRequest
from rangestream.layout.block import (
    ArrayLayout,
    chunk_byte_runs,
    decode_chunks,
    parse_block_index,
)


@dataclass(frozen=True, slots=True)
class RowRange:
    """Rows ``[start, stop)`` of the array stored under ``array_key`` (length ``length``)."""

    array_key: str
    layout: ArrayLayout
    length: int
    start: int
    stop: int


class BlockIndexCache:
    """Parsed chunk indexes of recently used blocks, least recently used evicted first.

    A block index is 16 bytes per inner chunk (64 KiB for 4096 chunks); caching them is
    what makes a window inside a known block cost one request.
    """

    def __init__(self, max_blocks: int = 512) -> None:
        self.max_blocks = max_blocks
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, key: str) -> np.ndarray | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, index: np.ndarray) -> None:
        self._entries[key] = index
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_blocks:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def read_rows(
    ranges: Sequence[RowRange],
    cache: BlockIndexCache,
    *,
    describe: object = str,
    verify_checksums: bool = True,
) -> ReadProgram[list[np.ndarray]]:
    """Program returning, for each range, its rows as a uint8 array ``(rows, row_nbytes)``."""
    pieces: list[
        tuple[int, str, ArrayLayout, int, int, int]
    ] = []  # (range, key, layout, block, a, b)
    for number, row_range in enumerate(ranges):
        layout = row_range.layout
        if not 0 <= row_range.start <= row_range.stop <= row_range.length:
            raise IndexError(
                f"rows [{row_range.start}, {row_range.stop}) outside {row_range.array_key} "
                f"of length {row_range.length}"
            )
        row = row_range.start
        while row < row_range.stop:
            block = row // layout.block_rows
            block_end = min(row_range.stop, (block + 1) * layout.block_rows)
            key = layout.block_key(row_range.array_key, block)
            pieces.append((number, key, layout, block, row, block_end))
            row = block_end

    missing: dict[str, ArrayLayout] = {}
    for _, key, layout, *_rest in pieces:
        if not layout.dense_chunks and cache.get(key) is None and key not in missing:
            missing[key] = layout
    if missing:
        keys = list(missing)
        raws = yield [SuffixRequest(key, missing[key].index_nbytes) for key in keys]
        for key, raw in zip(keys, raws, strict=True):
            cache.put(key, parse_block_index(missing[key], raw, f"{describe(key)} chunk index"))  # type: ignore[operator]

    requests: list[ByteRequest] = []
    plan: list[tuple[int, ArrayLayout, str, int, int, list[tuple[int, int, int]]]] = []
    for number, key, layout, block, row, block_end in pieces:
        local_start = row - block * layout.block_rows
        local_stop = block_end - block * layout.block_rows
        first_chunk = local_start // layout.chunk_rows
        last_chunk = (local_stop - 1) // layout.chunk_rows
        if layout.dense_chunks:
            stored = layout.stored_chunk_nbytes
            runs = [(first_chunk * stored, (last_chunk + 1) * stored, first_chunk, last_chunk)]
        else:
            index = cache.get(key)
            if index is None:  # evicted between rounds by a tiny cache
                raise CorruptDataError(f"block index cache too small for one read ({key})")
            where = describe(key)  # type: ignore[operator]
            runs = chunk_byte_runs(layout, index, first_chunk, last_chunk, str(where))
        run_requests = []
        for start, end, run_first, _run_last in runs:
            run_requests.append((len(requests), run_first, end - start))
            requests.append(RangeRequest(key, start, end))
        plan.append((number, layout, key, local_start, local_stop, run_requests))

    datas = (yield requests) if requests else []
    outputs: list[list[np.ndarray]] = [[] for _ in ranges]
    for number, layout, key, local_start, local_stop, run_requests in plan:
        parts = []
        for request_number, _run_first, _nbytes in run_requests:
            request = requests[request_number]
            assert isinstance(request, RangeRequest)
            where = f"{describe(key)} bytes [{request.start}, {request.end})"  # type: ignore[operator]
            parts.append(
                decode_chunks(layout, datas[request_number], where, verify=verify_checksums)
            )
        chunk_rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        row_bytes = chunk_rows.reshape(-1, layout.row_nbytes)
        skip = local_start - (local_start // layout.chunk_rows) * layout.chunk_rows
        outputs[number].append(row_bytes[skip : skip + (local_stop - local_start)])
    results = []
    for number, row_range in enumerate(ranges):
        found = outputs[number]
        if not found:
            results.append(np.empty((0, row_range.layout.row_nbytes), dtype=np.uint8))
        elif len(found) == 1:
            results.append(found[0])
        else:
            results.append(np.concatenate(found))
    return results
