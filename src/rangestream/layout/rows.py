"""Reading rows of sharded arrays: row ranges to byte ranges, as read programs.

A read names row ranges of one or more arrays. The program first fetches, in one round,
the chunk indexes of blocks it has not seen (cached afterwards), then, in one more round,
the byte runs holding the rows, and returns each range's rows as a contiguous array.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from rangestream.errors import CorruptDataError, OutOfRangeError
from rangestream.io.range_reader import ReadProgram
from rangestream.io.ranges import ByteRequest, RangeRequest, SuffixRequest
from rangestream.layout.block import (
    ArrayLayout,
    check_chunks,
    chunk_byte_runs,
    decode_chunks,
    parse_block_index,
)

#: A read spanning more blocks than this first fetches the inner chunk holding its last
#: row. Lengths and offsets come from stored metadata; if they are damaged or hostile
#: (a heap "of 10**15 bytes"), the read then fails on one small request instead of first
#: building a plan of a few hundred bytes per block it believes in.
PROBE_BLOCKS = 64


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


class ArrayCache:
    """Arrays by key, least recently used evicted first once ``max_bytes`` is exceeded.

    Readers keep small index structures here (a shard's document offsets, its coarse run
    index, recent chunks of runs) so repeated reads skip a round of requests.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()

    def get(self, key: Hashable) -> np.ndarray | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, value: np.ndarray) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = value
        self.nbytes += value.nbytes
        while self.nbytes > self.max_bytes and len(self._entries) > 1:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def __len__(self) -> int:
        return len(self._entries)


def read_rows(
    ranges: Sequence[RowRange],
    cache: BlockIndexCache,
    *,
    describe: Callable[[str], str] = str,
    verify_checksums: bool = True,
) -> ReadProgram[list[np.ndarray]]:
    """Program returning, for each range, its rows as a uint8 array ``(rows, row_nbytes)``.

    Every returned array is writable and owns its memory (one copy out of the fetched
    bytes, which also drops the checksum trailers).
    """
    far = [r for r in ranges if _spans_many_blocks(r)]
    if far:
        yield from _probe_last_rows(far, cache, describe, verify_checksums)
    # (range number, block key, layout, first row in block, stop row in block)
    pieces: list[tuple[int, str, ArrayLayout, int, int]] = []
    for number, row_range in enumerate(ranges):
        layout = row_range.layout
        start, stop = row_range.start, row_range.stop
        if not 0 <= start <= stop <= row_range.length:
            raise OutOfRangeError(
                f"rows [{start}, {stop}) outside {row_range.array_key} of length {row_range.length}"
            )
        block_rows = layout.block_rows
        row = start
        while row < stop:
            block = row // block_rows
            base = block * block_rows
            end = min(stop, base + block_rows)
            key = layout.block_key(row_range.array_key, block)
            pieces.append((number, key, layout, row - base, end - base))
            row = end

    missing: dict[str, ArrayLayout] = {}
    for _, key, layout, _a, _b in pieces:
        if not layout.dense_chunks and key not in missing and cache.get(key) is None:
            missing[key] = layout
    if missing:
        keys = list(missing)
        raws = yield [SuffixRequest(key, missing[key].index_nbytes) for key in keys]
        for key, raw in zip(keys, raws, strict=True):
            where = f"{describe(key)} chunk index"
            cache.put(key, parse_block_index(missing[key], raw, where))

    requests: list[ByteRequest] = []
    plan: list[tuple[int, ArrayLayout, str, int, int, int, int]] = []
    for number, key, layout, local_start, local_stop in pieces:
        first_chunk = local_start // layout.chunk_rows
        last_chunk = (local_stop - 1) // layout.chunk_rows
        if layout.dense_chunks:
            stored = layout.stored_chunk_nbytes
            runs = [(first_chunk * stored, (last_chunk + 1) * stored, first_chunk, last_chunk)]
        else:
            index = cache.get(key)
            if index is None:  # evicted between rounds by a tiny cache
                raise CorruptDataError(f"block index cache too small for one read ({key})")
            runs = chunk_byte_runs(layout, index, first_chunk, last_chunk, describe(key))
        plan.append((number, layout, key, local_start, local_stop, len(requests), len(runs)))
        for run_start, run_end, _first, _last in runs:
            requests.append(RangeRequest(key, run_start, run_end))

    datas = (yield requests) if requests else []
    outputs: list[list[np.ndarray]] = [[] for _ in ranges]
    for number, layout, key, local_start, local_stop, first_request, run_count in plan:
        bodies = []
        for request_number in range(first_request, first_request + run_count):
            request = requests[request_number]
            bodies.append(
                decode_chunks(
                    layout,
                    datas[request_number],
                    _where(describe, key, request),
                    verify=verify_checksums,
                )
            )
        body = bodies[0] if run_count == 1 else np.concatenate(bodies)
        skip = (local_start % layout.chunk_rows) * layout.row_nbytes
        nbytes = (local_stop - local_start) * layout.row_nbytes
        flat = body.reshape(-1)  # copies unless the read was a single chunk
        rows = flat[skip : skip + nbytes]
        if not rows.flags.writeable:
            rows = rows.copy()
        outputs[number].append(rows.reshape(-1, layout.row_nbytes))
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


def _where(describe: Callable[[str], str], key: str, request: ByteRequest) -> Callable[[], str]:
    """The place of a request, for error messages; built only when an error is raised."""
    assert isinstance(request, RangeRequest)
    return lambda: f"{describe(key)} bytes [{request.start}, {request.end})"


def _spans_many_blocks(row_range: RowRange) -> bool:
    start, stop, block_rows = row_range.start, row_range.stop, row_range.layout.block_rows
    return (
        0 <= start < stop <= row_range.length
        and (stop - 1) // block_rows - start // block_rows >= PROBE_BLOCKS
    )


def _probe_last_rows(
    ranges: list[RowRange],
    cache: BlockIndexCache,
    describe: Callable[[str], str],
    verify_checksums: bool,
) -> ReadProgram[None]:
    """Prove that the block holding each range's last row exists and holds that row.

    Dense blocks: fetch (and verify) the inner chunk of the last row; a missing or short
    object raises ``MissingObjectError`` or ``TruncatedObjectError``. Other blocks: fetch
    their chunk index (kept in the cache for the read that follows) and check the chunk.
    """
    requests: list[ByteRequest] = []
    for row_range in ranges:
        layout = row_range.layout
        block, row = divmod(row_range.stop - 1, layout.block_rows)
        key = layout.block_key(row_range.array_key, block)
        if layout.dense_chunks:
            chunk = row // layout.chunk_rows
            stored = layout.stored_chunk_nbytes
            requests.append(RangeRequest(key, chunk * stored, (chunk + 1) * stored))
        else:
            requests.append(SuffixRequest(key, layout.index_nbytes))
    datas = yield requests
    for row_range, request, data in zip(ranges, requests, datas, strict=True):
        layout = row_range.layout
        if isinstance(request, RangeRequest):
            if verify_checksums:
                check_chunks(layout, data, _where(describe, request.key, request))
            continue
        index = parse_block_index(layout, data, f"{describe(request.key)} chunk index")
        cache.put(request.key, index)
        chunk = ((row_range.stop - 1) % layout.block_rows) // layout.chunk_rows
        chunk_byte_runs(layout, index, chunk, chunk, describe(request.key))
