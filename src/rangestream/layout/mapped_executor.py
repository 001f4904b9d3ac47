"""Running read programs on a local dense dataset from mapped blocks.

Why apart from the remote executor: local windows are the hot path (a few microseconds
each), so everything that does not depend on the read is bound once, and only what this
executor cannot serve (a missing or short block, byte requests, a read to probe first) is
handed to the remote executor (``executors.RemoteExecutor``), whose errors name the
damage. The remote executor is seen here through :class:`Fallback`, so this module does
not depend on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from rangestream.errors import ChecksumError
from rangestream.io import mapped as mapped_files
from rangestream.io.local import INLINE_READ_BYTES, LocalStore
from rangestream.io.mapped import LocalMapCache, MappedFile
from rangestream.io.ranges import RangeRequest, coalesce
from rangestream.io.stats import IOCounter
from rangestream.layout import copy as row_copy
from rangestream.layout.block import ArrayLayout
from rangestream.layout.checksums import check_mapped
from rangestream.layout.pieces import (
    Output,
    Piece,
    RowRead,
    StoredArray,
    output_rows,
    pieces,
    spans_many_blocks,
)
from rangestream.layout.programs import PROBE_BLOCKS, BlockCopier, Program, Step, T

__all__ = ["Fallback", "InlineBlocks", "MappedExecutor"]


class _FallbackReader(Protocol):
    counter: IOCounter
    coalesce_gap: int
    max_coalesced_bytes: int


class Fallback(Protocol):
    """What the mapped executor needs of the remote executor it hands steps to."""

    @property
    def reader(self) -> _FallbackReader: ...

    @property
    def verify(self) -> bool: ...

    async def execute(self, step: Step, *, max_concurrency: int | None = None) -> list[Any]: ...

    def execute_sync(self, step: Step) -> list[Any]: ...


class InlineBlocks(NamedTuple):
    """What a hot path needs to try one mapped block's copy itself, before its copier.

    A window reader that copies several groups per call saves a Python call per group by
    doing the copier's first step inline: ``holder.value.files.get(key)`` with ``key =
    base + (part << 40) + block`` (``MappedExecutor.block_copier``), then
    ``copy_piece(mapped.data, outputs, row, rows, chunk_rows, stored, row_nbytes,
    mapped.verified if verify else None, counter, mapped.live_size)``. Only status 0
    (copied and counted) is final there: a block not mapped yet, a chunk not verified yet
    or a truncated block goes to the copier, which maps, verifies or drops it.
    """

    holder: Any  # the map cache's entries holder: ``.value`` is ``None`` or has ``.files``
    base: int
    block_rows: int
    chunk_rows: int
    stored: int
    row_nbytes: int
    verify: bool
    counter: list[int]
    copy_piece: Callable[..., int]


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
        remote: Fallback,
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

    def inline_blocks(
        self,
        arrays: Sequence[StoredArray],
        layout: ArrayLayout | None = None,
        *,
        counter: list[int] | None = None,
    ) -> InlineBlocks | None:
        """The constants of ``block_copier(arrays, layout, counter=counter)``'s first try,
        for a caller that makes it inline (:class:`InlineBlocks`), or ``None`` where that
        copier would be ``None``."""
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
        return InlineBlocks(
            self._entries, first.block_base, layout.block_rows, layout.chunk_rows,
            layout.stored_chunk_nbytes, layout.row_nbytes, self.verify,
            self.counter.of(kind) if counter is None else counter, self.copy_piece,
        )  # fmt: skip

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
        hold them. It is the arithmetic of ``pieces`` and ``Piece`` for one
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
        inline = self.inline_blocks(arrays, layout, counter=counter)
        if inline is None:
            return None
        holder, base, block_rows, chunk_rows, stored, row_nbytes, verify, counter, copy_piece = (
            inline
        )
        mapping, store = self.mapping, self.store

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
