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
- :class:`MappedExecutor` serves a step on a local dense dataset from mapped blocks, each
  inner chunk checked the first time this process reads it, and counts exactly the
  requests the remote executor would have made for it. What it cannot serve (a missing or
  short block, byte requests) goes to the remote executor, whose errors name the damage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from rangestream.errors import ChecksumError, CorruptDataError
from rangestream.io import mapped as mapped_files
from rangestream.io.cache.byte_cache import is_cacheable_key
from rangestream.io.local import INLINE_READ_BYTES, LocalStore
from rangestream.io.mapped import LocalMapCache, MappedFile
from rangestream.io.process import run_blocking
from rangestream.io.range_reader import RangeReader
from rangestream.io.ranges import ByteRequest, RangeRequest, SuffixRequest, coalesce
from rangestream.io.stats import IOCounter
from rangestream.layout import copy as row_copy
from rangestream.layout.block import ArrayLayout, parse_block_index
from rangestream.layout.caches import BlockIndexCache
from rangestream.layout.checksums import check_mapped, check_span
from rangestream.layout.pieces import (
    Output,
    Piece,
    RowRead,
    StoredArray,
    direct_spans,
    indexed_spans,
    output_rows,
    pieces,
    spans_many_blocks,
)

__all__ = ["BlockCopier", "MappedExecutor", "Program", "RemoteExecutor", "Step"]

T = TypeVar("T")
Step = Sequence[RowRead | ByteRequest]
#: A read program: yields steps, receives each step's results in order, returns T.
Program = Generator[Step, list[Any], T]
#: ``copy(part, start, rows, outputs) -> bool``: see ``MappedExecutor.block_copier``.
BlockCopier = Callable[[int, int, int, tuple[Output, ...]], bool]
#: Byte-level rounds of one step (the remote executor's own program).
_Rounds = Generator[list[ByteRequest], list[Any], list[Any]]

#: A read spanning more blocks than this first fetches the inner chunk holding its last
#: row. Lengths and offsets come from stored metadata; if they are damaged or hostile (a
#: heap "of 10**15 bytes"), the read then fails on one small request instead of first
#: building a plan of a few hundred bytes per block it believes in.
PROBE_BLOCKS = 64


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
                datas = await self.reader.fetch(requests, max_concurrency=max_concurrency)
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


class MappedExecutor:
    """Runs programs on a local dataset with dense blocks from a bounded cache of mappings.

    Everything that does not depend on the read is done once: a block is found by an int
    key, each inner chunk is verified once per process, and rows are copied with one call of
    the copier per output. Counting: one request per coalesced byte range, exactly as the
    remote executor's ``pread`` of the same step counts (``RangeReader.coalesce_gap``), so
    the counters mean the same on either path.

    Parameters
    ----------
    store
        The dataset's local store.
    remote
        Serves what this executor cannot (and names the damage).
    max_files
        Blocks kept mapped per process (``io.mapped.DEFAULT_MAX_MAPPED_FILES`` by default).
    """

    def __init__(
        self,
        store: LocalStore,
        remote: RemoteExecutor,
        *,
        max_files: int | None = None,
    ) -> None:
        self.store = store
        self.remote = remote
        self.verify = remote.verify
        self.counter: IOCounter = remote.reader.counter
        self.gap = remote.reader.coalesce_gap
        self.max_bytes = remote.reader.max_coalesced_bytes
        if max_files is None:
            max_files = mapped_files.DEFAULT_MAX_MAPPED_FILES
        self.maps = LocalMapCache(store.resolved_root, max_files)
        self._entries = self.maps._entries  # read directly on the hot path
        # bound once: tests switch the copier before opening
        self.copy_rows = row_copy.copy_rows
        self.copy_piece = row_copy.copy_piece

    # -- programs ---------------------------------------------------------------------
    def run_sync(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        """Local reads: ``max_concurrency`` has nothing to bound."""
        try:
            step = next(program)
            while True:
                results = self.execute(step)
                if results is None:
                    results = self.remote.execute_sync(step)
                step = program.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def run(self, program: Program[T], *, max_concurrency: int | None = None) -> T:
        """Copies of at most ``INLINE_READ_BYTES`` run inline (a hop to a thread costs more
        than copying page-cached bytes); larger steps go to a thread."""
        try:
            step = next(program)
            while True:
                if _step_bytes(step) <= INLINE_READ_BYTES:
                    results = self.execute(step)
                else:
                    results = await asyncio.to_thread(self.execute, step)
                if results is None:
                    results = await self.remote.execute(step, max_concurrency=max_concurrency)
                step = program.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # -- one step -----------------------------------------------------------------------
    def mapping(self, array: StoredArray, block: int, end_chunk: int) -> MappedFile | None:
        """Block ``block`` of ``array``, mapped, if it is dense and holds chunks
        ``[0, end_chunk)`` (else ``None``: the remote executor reads it)."""
        if not array.layout.dense_chunks:
            return None  # offsets come from the chunk index: the remote executor's job
        key = array.block_base + block
        files = self.maps.entries()
        mapped = files.get(key)
        if mapped is None:
            try:
                path = self.store.local_path(array.block_key(block))
                mapped = self.maps.open(path, array.layout.chunks_per_block, key)
            except OSError:
                return None  # missing or unreadable: the remote executor names it
        else:
            try:  # noqa: SIM105 - contextlib.suppress costs more than the move itself
                files.move_to_end(key)
            except KeyError:  # dropped by another thread just now: still valid to use
                pass
        if end_chunk * array.layout.stored_chunk_nbytes > mapped.size:
            return None  # shorter than the layout says: the remote executor reports it
        return mapped

    def block_copier(
        self,
        arrays: Sequence[StoredArray],
        layout: ArrayLayout | None = None,
        *,
        counter: list[int] | None = None,
    ) -> BlockCopier | None:
        """A copier of rows that one block holds, for one array name's arrays of one opened
        version by shard position (a list, or a sequence that makes them on demand), or
        ``None`` if their blocks are not dense or alike.

        The hot path of single windows: ``copy(part, start, rows, outputs)`` copies rows
        ``[start, start + rows)`` of ``arrays[part]`` into whole outputs and returns
        ``True``, or returns ``False`` with nothing counted when one mapped block does not
        hold them. It is the arithmetic of ``pieces.in_one_block`` and ``Piece`` for one
        piece, then ``mapping``, the count, the checksum step and the copier, as for any
        piece, with every constant bound once: it runs for every local window, where a few
        attribute loads are a tenth of the time.

        ``layout`` addresses every array's blocks (default: the sequence's ``layout``, else
        the largest block among the arrays: an array of one block declares its own size,
        ``ArrayLayout.stored_for``, and larger blocks address its rows alike). Blocks are
        looked up as ``arrays[0].block_base + (part << 40) + block``, which is each array's
        own key when idents follow positions (``OpenedStorage.array``); ``arrays[part]`` is
        only asked for when its block is not mapped yet.

        ``counter`` (a ``[requests, bytes]`` list) takes the counts instead of the reader's
        counter: a caller that serves several pieces as one request counts them itself
        (``OpenedDocuments.read_mapped``: the coalesced ranges of a batch).
        """
        if not len(arrays):
            return None
        first = arrays[0]
        kind = first.kind
        if layout is None:
            layout = getattr(arrays, "layout", None)
        if layout is None:
            layout = max((array.layout for array in arrays), key=lambda it: it.block_rows)
            if any(not _alike(array.layout, layout) or array.kind != kind for array in arrays):
                return None
        if not layout.dense_chunks:
            return None
        block_rows, chunk_rows = layout.block_rows, layout.chunk_rows
        stored, row_nbytes = layout.stored_chunk_nbytes, layout.row_nbytes
        base = first.block_base
        if counter is None:
            counter = self.counter.of(kind)
        holder, mapping, copy_piece = self._entries, self.mapping, self.copy_piece
        verify, store = self.verify, self.store

        def copy(part: int, start: int, rows: int, outputs: tuple[Output, ...]) -> bool:
            block, row = divmod(start, block_rows)
            if row + rows > block_rows:
                return False
            key = base + (part << 40) + block
            entries = holder.value
            mapped = None if entries is None else entries.files.get(key)
            if mapped is None:
                mapped = mapping(arrays[part], block, (row + rows - 1) // chunk_rows + 1)
                if mapped is None:
                    return False
            else:
                try:  # noqa: SIM105 - contextlib.suppress costs more than the move itself
                    entries.files.move_to_end(key)  # type: ignore[union-attr]
                except KeyError:  # dropped by another thread just now: still valid to use
                    pass
            flags = mapped.verified if verify else None
            data = mapped.data
            # the copier guards against a block truncated while mapped (``live_size``):
            # status 3, nothing counted, and the program reads it and names the damage
            status = copy_piece(data, outputs, row, rows, chunk_rows, stored, row_nbytes, flags,
                                counter, mapped.live_size)  # fmt: skip
            if status == 1:  # a chunk read for the first time: checked once, then trusted
                first, end = row // chunk_rows, (row + rows - 1) // chunk_rows + 1
                if mapped.live_size() < end * stored:  # the check reads the chunks: no fault
                    status = 3
                else:
                    try:
                        check_mapped(
                            data, mapped.verified, stored, first, end,
                            lambda: _where_mapped(store, arrays[part], block, first, end,
                                                  stored),
                        )  # fmt: skip
                    except ChecksumError:  # the read happened, then failed: counted as fetched
                        counter[0] += 1
                        counter[1] += (end - first) * stored
                        raise
                    status = copy_piece(data, outputs, row, rows, chunk_rows, stored, row_nbytes,
                                        flags, counter, mapped.live_size)  # fmt: skip
            if status == 3:
                entries = holder.value
                if entries is not None and entries.files.get(key) is mapped:
                    entries.files.pop(key, None)  # mapped again at its size when next used
            return status == 0

        return copy

    def execute(self, step: Step) -> list[Any] | None:
        """The step served from mappings, or ``None`` (nothing counted) for the remote path."""
        reads: list[RowRead] = []
        for item in step:
            if not isinstance(item, RowRead) or spans_many_blocks(item, PROBE_BLOCKS):
                return None  # byte requests, or a read to probe first: the remote executor
            reads.append(item)
        cut = pieces(reads)
        mapped_pieces = []
        for piece in cut:
            mapped = self.mapping(piece.array, piece.block, piece.end_chunk)
            if mapped is None:
                return None
            if mapped.live_size() < piece.end_chunk * piece.array.stored:
                self._forget(piece.array.block_base + piece.block, mapped)
                return None  # truncated while mapped: the remote executor names the damage
            mapped_pieces.append((piece, mapped))
        self._count(cut)
        for piece, mapped in mapped_pieces:
            array = piece.array
            layout = array.layout
            stored = layout.stored_chunk_nbytes
            first, end = piece.first_chunk, piece.end_chunk
            if self.verify and mapped.verified.find(0, first, end) >= 0:
                check_mapped(
                    mapped.data, mapped.verified, stored, first, end,
                    lambda a=array, b=piece.block, f=first, e=end, s=stored: _where_mapped(
                        self.store, a, b, f, e, s
                    ),
                )  # fmt: skip
            read = piece.read
            for output in read.ready():
                self.copy_rows(
                    mapped.data,
                    output_rows(output, piece.at, piece.rows, read.rows),
                    piece.row,
                    piece.rows,
                    layout.chunk_rows,
                    stored,
                    layout.row_nbytes,
                    output[1],
                    output[2],
                )
        for read in reads:
            read.ready()  # reads of no rows get their (empty) outputs too
        return [None] * len(step)

    def _forget(self, key: int, mapped: MappedFile) -> None:
        """Drop ``mapped`` (found short of its mapped size): mapped again when next used."""
        files = self.maps.entries()
        if files.get(key) is mapped:
            files.pop(key, None)

    def _count(self, cut: list[Piece]) -> None:
        """Count the requests the remote executor would make for ``cut``: its coalesced spans."""
        if len(cut) == 1:
            piece = cut[0]
            start, end = piece.dense_span()
            self.counter.count(piece.array.kind, end - start)
            return
        kinds: dict[str, str] = {}
        ranges = []
        for piece in cut:
            start, end = piece.dense_span()
            key = piece.key
            kinds[key] = piece.array.kind
            ranges.append(RangeRequest(key, start, end))
        for group in coalesce(ranges, gap=self.gap, max_bytes=self.max_bytes):
            self.counter.count(kinds[group.key], group.end - group.start)


def _alike(layout: ArrayLayout, other: ArrayLayout) -> bool:
    """Whether rows of both map to blocks and bytes alike, block sizes aside."""
    return (
        layout.dtype == other.dtype
        and layout.row_shape == other.row_shape
        and layout.chunk_rows == other.chunk_rows
        and layout.dense_chunks == other.dense_chunks
    )


def _step_bytes(step: Step) -> int:
    return sum(
        item.rows * item.array.layout.row_nbytes for item in step if isinstance(item, RowRead)
    )


def _where_mapped(
    store: LocalStore, array: StoredArray, block: int, first: int, end: int, stored: int
) -> str:
    return f"{store.describe(array.block_key(block))} bytes [{first * stored}, {end * stored})"
