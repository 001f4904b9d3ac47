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

from rangestream.layout.block import ArrayLayout
from rangestream.layout.mapped_executor import MappedExecutor
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


def _uncount(counter: list[int], layout: ArrayLayout, first: int, frames: int) -> None:
    """Take back what the copier counted for rows ``[first, first + frames)`` of one block:
    one request and the stored chunks it touched (``copy_piece``'s own count)."""
    row = first % layout.block_rows
    chunks = (row + frames - 1) // layout.chunk_rows + 1 - row // layout.chunk_rows
    counter[0] -= 1
    counter[1] -= chunks * layout.stored_chunk_nbytes


def make_window_reader(
    opened: MappedWindowSource, selection: Selection, frames: int
) -> WindowReader:
    """The reader of ``frames``-frame windows of ``selection`` out of mapped blocks."""
    mapped = opened.mapped
    copiers = opened.copiers
    if mapped is None or frames <= 0:
        return no_window
    plan: list[tuple[Any, ArrayLayout, list[int], tuple[tuple[int, int, int], ...]]] = []
    position = {output.name: i for i, output in enumerate(selection.outputs)}
    for number, outputs in selection.groups:
        copy = copiers[number]
        if copy is None or not opened.arrays:
            return no_window
        # the copier addresses rows with the largest block among the shards' arrays
        # (``MappedExecutor.block_copier``): the same arithmetic here
        layout = max((arrays[number].layout for arrays in opened.arrays),
                     key=lambda it: it.block_rows)  # fmt: skip
        if frames > layout.block_rows:
            return no_window  # never inside one block
        counter = mapped.counter.of(opened.arrays[0][number].kind)  # the copier's own
        slots = tuple((position[o.name], o.offset, o.nbytes) for o in outputs)
        plan.append((copy, layout, counter, slots))
    names = tuple(output.name for output in selection.outputs)
    specs = tuple(((frames, *output.shape), output.dtype) for output in selection.outputs)
    torch = selection.torch
    index = opened.index
    count, chunk_rows = index.count, index.chunk_rows
    bounds = tuple(layout.block_rows for _copy, layout, _counter, _slots in plan)
    empty = np.empty
    singles = None
    if all(len(slots) == 1 for _copy, _layout, _counter, slots in plan):
        singles = tuple((copy, *slots[0]) for copy, _layout, _counter, slots in plan)

    def undo(done: int, first: int) -> None:
        for _copy, layout, counter, _slots in plan[:done]:
            _uncount(counter, layout, first, frames)

    def read(record: int, start: int) -> dict[str, Any] | None:
        if type(record) is not int or type(start) is not int or start < 0:
            return None
        if not 0 <= record < count:
            return None
        chunk, row = divmod(record, chunk_rows)
        entry = index.chunks.get(chunk)
        if entry is None or start + frames > entry.item(row, 1):
            return None
        part = entry.item(row, 2)
        first = entry.item(row, 0) + start
        for block_rows in bounds:
            if first % block_rows + frames > block_rows:
                return None  # crosses a block boundary: the program reads both parts
        made = [empty(shape, dtype) for shape, dtype in specs]
        if singles is not None:  # one field per group, the usual case: no tuples to build
            for done, (copy, at, offset, nbytes) in enumerate(singles):
                if not copy(part, first, frames, ((made[at], offset, nbytes),)):
                    undo(done, first)
                    return None
        else:
            for done, (copy, _layout, _counter, slots) in enumerate(plan):
                outputs = tuple([(made[at], offset, nbytes) for at, offset, nbytes in slots])
                if not copy(part, first, frames, outputs):
                    undo(done, first)
                    return None
        result = dict(zip(names, made, strict=True))
        if torch:
            return as_written(result, torch)
        return result

    return read
