"""The two executors of read programs: fetched byte ranges, and mapped local blocks.

Storage kinds describe a read as a *program*: a generator that yields steps (lists of
:class:`~rangestream.layout.pieces.RowRead` and of byte requests for small objects) and
receives, for each step, the bytes of its byte requests (``None`` for row reads, whose rows
are copied into their outputs). What to read, in which rounds, and how to decode it is the
program's; how the bytes arrive is the executor's, so sync and async readers, remote and
local datasets run the same programs (the httpx pattern: one core, two edges).

- :class:`RemoteExecutor` turns a step's pieces into byte ranges (by arithmetic for dense
  blocks, through cached chunk indexes otherwise), fetches them with the range reader
  (coalesced, bounded, retried, counted), checks each range's checksums in one pass and
  copies the rows out. Bytes that fail their checksums while the reader has a byte cache
  may come from an entry damaged since the cache checked it: the entries holding them are
  dropped (counted) and the range fetched once more before the damage is reported.
- :class:`MappedExecutor` (``mapped_executor``) serves a step on a local dense dataset from
  mapped blocks, each inner chunk checked the first time this process reads it, and counts
  exactly the requests the remote executor would have made for it. What it cannot serve (a
  missing or short block, byte requests) goes to the remote executor, whose errors name
  the damage.

The program types live in ``programs``; this module re-exports them and both executors.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from rangestream.errors import CorruptDataError
from rangestream.io.cache.byte_cache import is_cacheable_key
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ByteRequest, RangeRequest, SuffixRequest
from rangestream.layout import copy as row_copy
from rangestream.layout.block import ArrayLayout, parse_block_index
from rangestream.layout.caches import BlockIndexCache
from rangestream.layout.checksums import check_span
from rangestream.layout.mapped_executor import MappedExecutor
from rangestream.layout.pieces import (
    Piece,
    RowRead,
    direct_spans,
    indexed_spans,
    output_rows,
    pieces,
    spans_many_blocks,
)
from rangestream.layout.programs import PROBE_BLOCKS, BlockCopier, Program, Step, T

__all__ = [
    "PROBE_BLOCKS",
    "BlockCopier",
    "MappedExecutor",
    "Program",
    "RemoteExecutor",
    "Step",
]

#: Byte-level rounds of one step (the remote executor's own program).
_Rounds = Generator[list[ByteRequest], list[Any], list[Any]]


class RemoteExecutor:
    """Runs programs by fetching byte ranges through a :class:`RangeReader`.

    Parameters
    ----------
    reader
        The range reader (its store, bounds, retries and counter).
    verify
        Check every inner chunk's crc32c.
    block_indexes
        Parsed chunk indexes of non-dense blocks, kept between steps.
    """

    def __init__(
        self, reader: RangeReader, *, verify: bool, block_indexes: BlockIndexCache | None = None
    ) -> None:
        self.reader = reader
        self.verify = verify
        self.block_indexes = BlockIndexCache() if block_indexes is None else block_indexes
        self.describe = reader.store.describe

    # -- programs ---------------------------------------------------------------------
    async def run(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        try:
            step = next(program)
            while True:
                step = program.send(await self.execute(step, max_concurrency=max_concurrency))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def run_sync(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        """Run ``program`` with sync I/O: ``pread`` locally, the process's I/O loop otherwise."""
        if not self.reader.store.supports_sync_reads:
            return run_blocking(self.run(program, max_concurrency=max_concurrency))
        try:
            step = next(program)
            while True:
                step = program.send(self.execute_sync(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- one step -----------------------------------------------------------------------
    async def execute(self, step: Step, *, max_concurrency: int | None = None) -> list[Any]:
        direct = direct_spans(step)
        if direct is not None:
            requests = [request for _piece, request in direct]
            if len(requests) > 1:
                datas = await self.reader.fetch_distinct(requests, max_concurrency=max_concurrency)
            else:  # one range: no coalescing, no per-call bound to set up
                datas = [await self.reader.fetch_range(requests[0])]
            damaged = self._finish_direct(direct, datas, refetch=True)
            if damaged:  # dropped from the byte cache: fetched again, and now final
                again = await self.reader.fetch([r for _p, r in damaged])
                self._finish_direct(damaged, again)
            return [None] * len(direct)
        rounds = self._rounds(step)
        try:
            requests = next(rounds)
            while True:
                requests = rounds.send(
                    await self.reader.fetch(requests, max_concurrency=max_concurrency)
                )
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def execute_sync(self, step: Step) -> list[Any]:
        direct = direct_spans(step)
        if direct is not None:
            datas = self.reader.fetch_sync([request for _piece, request in direct])
            damaged = self._finish_direct(direct, datas, refetch=True)
            if damaged:
                self._finish_direct(damaged, self.reader.fetch_sync([r for _p, r in damaged]))
            return [None] * len(direct)
        rounds = self._rounds(step)
        try:
            requests = next(rounds)
            while True:
                requests = rounds.send(self.reader.fetch_sync(requests))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _finish_direct(
        self, direct: list[tuple[Piece, RangeRequest]], datas: Any, *, refetch: bool = False
    ) -> list[tuple[Piece, RangeRequest]]:
        """Check and copy the rows of a direct step (see ``direct_spans``).

        With ``refetch``, pieces whose bytes failed their checksums and may come from the
        byte cache are returned (their entries dropped) for the caller to fetch again.
        """
        damaged = []
        for (piece, request), data in zip(direct, datas, strict=True):
            try:
                self._copy_span(piece, piece.first_chunk, piece.end_chunk, request, data)
            except CorruptDataError:
                if not (refetch and self._forget_cached(request)):
                    raise
                damaged.append((piece, request))
                continue
            piece.read.ready()
        return damaged

    def _forget_cached(self, request: ByteRequest) -> bool:
        """Whether ``request``'s bytes may have come from the byte cache; if so its entries
        holding them are dropped (counted) so that fetching them again reads the store."""
        reader = self.reader
        cache = reader.cache
        if cache is None or not cache.enabled or not is_cacheable_key(request.key):
            return False
        cache.forget(reader.store.url, request, reader.counter.cache)
        return True

    def _rounds(self, step: Step) -> _Rounds:
        """One step as rounds of byte requests: probes, chunk indexes, then the rows."""
        reads = [item for item in step if isinstance(item, RowRead)]
        far = [read for read in reads if spans_many_blocks(read, PROBE_BLOCKS)]
        if far:
            yield from self._probe(far)
        cut = pieces(reads)
        missing: dict[str, ArrayLayout] = {}
        for piece in cut:
            layout = piece.array.layout
            if not layout.dense_chunks:
                key = piece.key
                if key not in missing and self.block_indexes.get(key) is None:
                    missing[key] = layout
        if missing:
            keys = list(missing)
            suffixes = [SuffixRequest(key, missing[key].index_nbytes) for key in keys]
            raws = yield suffixes
            damaged = []
            for key, suffix, raw in zip(keys, suffixes, raws, strict=True):
                where = f"{self.describe(key)} chunk index"
                try:
                    self.block_indexes.put(key, parse_block_index(missing[key], raw, where))
                except CorruptDataError:
                    if not self._forget_cached(suffix):
                        raise
                    damaged.append((key, suffix))
            if damaged:  # dropped from the byte cache: read again from the store
                raws = yield [suffix for _key, suffix in damaged]
                for (key, _suffix), raw in zip(damaged, raws, strict=True):
                    where = f"{self.describe(key)} chunk index"
                    self.block_indexes.put(key, parse_block_index(missing[key], raw, where))

        requests: list[ByteRequest] = []
        spans: list[tuple[Piece, int, int]] = []  # (piece, first chunk, end chunk)
        for piece in cut:
            layout = piece.array.layout
            if layout.dense_chunks:
                start, end = piece.dense_span()
                requests.append(RangeRequest(piece.key, start, end))
                spans.append((piece, piece.first_chunk, piece.end_chunk))
                continue
            key = piece.key
            index = self.block_indexes.get(key)
            if index is None:  # evicted between rounds by a tiny cache
                raise CorruptDataError(f"block index cache too small for one read ({key})")
            for start, end, first, last in indexed_spans(
                layout, index, piece.first_chunk, piece.end_chunk - 1, self.describe(key)
            ):
                requests.append(RangeRequest(key, start, end))
                spans.append((piece, first, last + 1))
        others = [item for item in step if not isinstance(item, RowRead)]
        datas = (yield requests + others) if requests or others else []
        damaged = []
        for number, request, data in zip(range(len(spans)), requests, datas, strict=False):
            piece, first, end = spans[number]
            try:
                self._copy_span(piece, first, end, request, data)
            except CorruptDataError:
                if not self._forget_cached(request):
                    raise
                damaged.append(number)
        if damaged:  # dropped from the byte cache: fetched again, and now final
            again = yield [requests[number] for number in damaged]
            for number, data in zip(damaged, again, strict=True):
                piece, first, end = spans[number]
                self._copy_span(piece, first, end, requests[number], data)
        for read in reads:
            read.ready()  # reads of no rows get their (empty) outputs too
        results: list[Any] = [None] * len(step)
        fetched = iter(datas[len(requests) :])
        for number, item in enumerate(step):
            if not isinstance(item, RowRead):
                results[number] = next(fetched)
        return results

    def _copy_span(
        self, piece: Piece, first: int, end: int, request: RangeRequest, data: Any
    ) -> None:
        """Check the inner chunks ``[first, end)`` of a block fetched as ``data`` and copy
        the piece's rows among them into the read's outputs."""
        layout = piece.array.layout
        stored, chunk_rows = layout.stored_chunk_nbytes, layout.chunk_rows
        describe = self.describe

        def where() -> str:
            return f"{describe(request.key)} bytes [{request.start}, {request.end})"

        buffer = check_span(data, stored, first, where, verify=self.verify)
        low = max(piece.row, first * chunk_rows)
        high = min(piece.row + piece.rows, end * chunk_rows)
        read = piece.read
        at = piece.at + (low - piece.row)
        copy_rows = row_copy.copy_rows
        for output in read.ready():
            copy_rows(
                buffer,
                output_rows(output, at, high - low, read.rows),
                low - first * chunk_rows,
                high - low,
                chunk_rows,
                stored,
                layout.row_nbytes,
                output[1],
                output[2],
            )

    def _probe(self, reads: list[RowRead]) -> _Rounds:
        """Prove that the block holding each read's last row exists and holds that row.

        Dense blocks: fetch (and verify) the inner chunk of the last row; a missing or short
        object raises ``MissingObjectError`` or ``TruncatedObjectError``. Other blocks: fetch
        their chunk index (kept for the read that follows) and check the chunk is there.
        """
        requests: list[ByteRequest] = []
        for read in reads:
            layout = read.array.layout
            block, row = divmod(read.stop - 1, layout.block_rows)
            key = read.array.block_key(block)
            if layout.dense_chunks:
                chunk = row // layout.chunk_rows
                stored = layout.stored_chunk_nbytes
                requests.append(RangeRequest(key, chunk * stored, (chunk + 1) * stored))
            else:
                requests.append(SuffixRequest(key, layout.index_nbytes))
        datas = yield requests
        for read, request, data in zip(reads, requests, datas, strict=True):
            layout = read.array.layout
            if isinstance(request, RangeRequest):
                chunk = request.start // layout.stored_chunk_nbytes
                check_span(
                    data,
                    layout.stored_chunk_nbytes,
                    chunk,
                    lambda r=request: f"{self.describe(r.key)} bytes [{r.start}, {r.end})",
                    verify=self.verify,
                )
                continue
            index = parse_block_index(layout, data, f"{self.describe(request.key)} chunk index")
            self.block_indexes.put(request.key, index)
            chunk = ((read.stop - 1) % layout.block_rows) // layout.chunk_rows
            indexed_spans(layout, index, chunk, chunk, self.describe(request.key))
        return []
