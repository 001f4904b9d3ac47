"""Local frame windows copied straight out of mapped blocks, without a read program.

Every local window of a cached record lands here first, so its cost per call is the
library's whole overhead over slicing a memmap: one reader is made per ``(fields,
frames)`` shape with every constant bound (the stream windows' ``window_reader``
pattern), and a call is the index entry's three numbers, one block check per group in
arithmetic, one new array per field and one copier call per group.

A window whose later group cannot be copied here (not mapped yet, found truncated)
after an earlier group was copied and counted takes the program, which counts its reads
again: the earlier groups' counts are taken back first (``_uncount``), so a window is
counted once, whichever path serves it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from rangestream.layout.mapped_executor import InlineBlocks, MappedExecutor
from rangestream.layout.pieces import StoredArray
from rangestream.storage.temporal.index import RecordIndex
from rangestream.storage.temporal.selection import Selection, as_written

__all__ = ["WindowReader", "make_window_reader", "no_window"]

#: ``read(record, start)``: the window as a dict, or ``None`` where the program must read it.
WindowReader = Callable[[int, int], "dict[str, Any] | None"]


class MappedWindowSource(Protocol):
    """What a window reader needs of an opened temporal version (``OpenedTemporal``)."""

    mapped: MappedExecutor | None
    copiers: list[Any]
    arrays: list[list[StoredArray]]
    index: RecordIndex


def no_window(_record: int, _start: int) -> None:
    """The reader of a shape the mapped path never serves (not mapped, not dense)."""
    return None


def _uncount(inline: InlineBlocks, first: int, frames: int) -> None:
    """Take back what a copy counted for rows ``[first, first + frames)`` of one block:
    one request and the stored chunks it touched (``copy_piece``'s own count)."""
    row = first % inline.block_rows
    chunks = (row + frames - 1) // inline.chunk_rows + 1 - row // inline.chunk_rows
    inline.counter[0] -= 1
    inline.counter[1] -= chunks * inline.stored


def make_window_reader(
    opened: MappedWindowSource, selection: Selection, frames: int
) -> WindowReader:
    """The reader of ``frames``-frame windows of ``selection`` out of mapped blocks.

    Each group's copy is tried inline (``InlineBlocks``: one dictionary lookup and one
    ``copy_piece`` call, no Python call in between, which halves the library's own time
    per window); only a block not mapped yet, not verified yet or truncated takes the
    group's copier.
    """
    mapped = opened.mapped
    copiers = opened.copiers
    if mapped is None or frames <= 0 or not opened.arrays:
        return no_window
    plan = []
    for number, outputs in selection.groups:
        copy = copiers[number]
        inline = mapped.inline_blocks([arrays[number] for arrays in opened.arrays])
        if copy is None or inline is None or frames > inline.block_rows:
            return no_window  # not mapped, or never inside one block
        made = tuple((o.name, (frames, *o.shape), o.dtype, o.offset, o.nbytes) for o in outputs)
        plan.append((copy, inline, made))
    if not plan:
        return no_window  # ``fields=[]``: the program checks the window, reads nothing
    names = tuple(output.name for output in selection.outputs)
    # outputs are made group by group; the dict keeps the order ``fields`` asked for
    in_order = names == tuple(name for _c, _i, made in plan for name, *_rest in made)
    torch = selection.torch
    index = opened.index
    count, chunk_rows, chunks = index.count, index.chunk_rows, index.chunks
    # one map cache, checking rule and copier per executor: the first group's
    holder, verify, piece = plan[0][1].holder, plan[0][1].verify, plan[0][1].copy_piece
    steps = tuple((copy, made, *inline[1:6], inline.counter) for copy, inline, made in plan)
    empty, fromkeys = np.empty, dict.fromkeys

    def undo(done: int, first: int) -> None:
        for _copy, inline, _made in plan[:done]:
            _uncount(inline, first, frames)

    def read(record: int, start: int) -> dict[str, Any] | None:
        if type(record) is not int or type(start) is not int or start < 0:
            return None
        if not 0 <= record < count:
            return None
        chunk, row = divmod(record, chunk_rows)
        entry = chunks.get(chunk)
        if entry is None or start + frames > entry.item(row, 1):
            return None
        part = entry.item(row, 2)
        first = entry.item(row, 0) + start
        entries = holder.value
        files = None if entries is None else entries.files
        high = part << 40
        result: dict[str, Any] = {} if in_order else fromkeys(names)
        for done, (copy, made, base, block_rows, per_chunk, stored, row_nbytes, counter) in (
            enumerate(steps)
        ):  # fmt: skip
            block, block_row = divmod(first, block_rows)
            if block_row + frames > block_rows:
                undo(done, first)
                return None  # crosses a block boundary: the program reads both parts
            if len(made) == 1:  # one field per group, the usual case
                name, shape, dtype, offset, nbytes = made[0]
                result[name] = out = empty(shape, dtype)
                outputs: tuple[Any, ...] = ((out, offset, nbytes),)
            else:
                listed = []
                for name, shape, dtype, offset, nbytes in made:
                    result[name] = out = empty(shape, dtype)
                    listed.append((out, offset, nbytes))
                outputs = tuple(listed)
            key = base + high + block
            found = None if files is None else files.get(key)
            if found is not None and not piece(
                found.data, outputs, block_row, frames, per_chunk, stored, row_nbytes,
                found.verified if verify else None, counter, found.live_size,
            ):  # fmt: skip
                try:  # noqa: SIM105 - the copier's recency step (contextlib costs more)
                    files.move_to_end(key)  # type: ignore[union-attr]
                except KeyError:  # dropped by another thread just now: still copied
                    pass
            elif not copy(part, first, frames, outputs):
                undo(done, first)
                return None
        if torch:
            return as_written(result, torch)
        return result

    return read
