"""The one row copier of every read: rows, or one field of each row, out of inner chunks.

A run of rows is spread over inner chunks, each followed by its checksum, and a field of
an interleaved group is a few bytes of every row. Both executors (fetched bytes and mapped
blocks) hand their rows to ``copy_rows``: the compiled helper (``_chunked.c``: one C call,
checked before anything is copied) when it is built, else a numpy copy with the same
signature and the same checks, at most three numpy assignments whatever the row count.
Why compiled: see docs/design.md ("A compiled row copy").

``copy_rows(source, target, start, rows, chunk_rows, stored, row_nbytes, field_offset,
field_nbytes)`` copies bytes ``[field_offset, field_offset + field_nbytes)`` of rows
``[start, start + rows)`` of ``source`` (inner chunks of ``chunk_rows`` rows starting every
``stored`` bytes) into ``target``, a C-contiguous writable buffer of exactly ``rows *
field_nbytes`` bytes, and raises ``ValueError`` when the rows or the target do not fit.

``copy_piece`` (the mapped single-window path) also takes ``size_now``, the mapped file's
size now: the compiled one copies under a SIGBUS guard and asks it only where the guard
cannot tell; the numpy one asks it before copying. Status 3 means the file was truncated
since it was mapped (see ``rangestream.io.mapped``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from rangestream.layout._chunked import copy_bytes as _compiled_copy_bytes
    from rangestream.layout._chunked import copy_piece as _compiled_copy_piece
    from rangestream.layout._chunked import copy_rows as _compiled_copy_rows
except ImportError:  # built without a C compiler
    _compiled_copy_rows = _compiled_copy_piece = _compiled_copy_bytes = None

__all__ = [
    "CopyBytes",
    "CopyPiece",
    "CopyRows",
    "compiled",
    "copy_bytes",
    "copy_piece",
    "copy_rows",
    "numpy_copy_bytes",
    "numpy_copy_piece",
    "numpy_copy_rows",
]

CopyRows = Callable[[Any, Any, int, int, int, int, int, int, int], None]
CopyPiece = Callable[..., int]
CopyBytes = Callable[..., "bytes | int"]


def numpy_copy_rows(
    source: Any,
    target: Any,
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    field_offset: int,
    field_nbytes: int,
) -> None:
    """``copy_rows`` in numpy: the first chunk's part, the whole chunks, the last part."""
    start, rows, chunk_rows, stored, row_nbytes, field_offset, field_nbytes = (
        operator.index(value)
        for value in (start, rows, chunk_rows, stored, row_nbytes, field_offset, field_nbytes)
    )
    data = np.frombuffer(source, dtype=np.uint8)
    out = np.frombuffer(target, dtype=np.uint8)
    if not out.flags.writeable:
        raise BufferError("copy_rows: the target is read-only")
    if (
        start < 0
        or rows <= 0
        or chunk_rows <= 0
        or row_nbytes <= 0
        or field_nbytes <= 0
        or not 0 <= field_offset <= row_nbytes - field_nbytes
        or stored < chunk_rows * row_nbytes
        or out.size != rows * field_nbytes
        or ((start + rows - 1) // chunk_rows) * stored
        + ((start + rows - 1) % chunk_rows) * row_nbytes
        + field_offset
        + field_nbytes
        > data.size
    ):
        raise ValueError(
            f"copy_rows: rows [{start}, +{rows}) of field bytes [{field_offset}, "
            f"+{field_nbytes}) in {chunk_rows}-row chunks of {row_nbytes}-byte rows stored "
            f"every {stored} bytes do not fit a {data.size}-byte source and a "
            f"{out.size}-byte target"
        )
    first_chunk, skip = divmod(start, chunk_rows)
    chunks = -(-(skip + rows) // chunk_rows)
    span = data[first_chunk * stored : (first_chunk + chunks) * stored]
    if span.size < chunks * stored:  # the last chunk's trailer lies past the source
        span = np.concatenate([span, np.zeros(chunks * stored - span.size, np.uint8)])
    cells = span.reshape(chunks, stored)[:, : chunk_rows * row_nbytes].reshape(
        chunks, chunk_rows, row_nbytes
    )[:, :, field_offset : field_offset + field_nbytes]
    out = out.reshape(rows, field_nbytes)
    head = min(chunk_rows - skip, rows)
    out[:head] = cells[0, skip : skip + head]
    done = head
    whole = (rows - done) // chunk_rows
    if whole:
        out[done : done + whole * chunk_rows].reshape(whole, chunk_rows, field_nbytes)[...] = cells[
            1 : 1 + whole
        ]
        done += whole * chunk_rows
    if done < rows:
        out[done:] = cells[1 + whole, : rows - done]


def numpy_copy_piece(
    source: Any,
    outputs: tuple[tuple[Any, int, int], ...],
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    verified: bytearray | None,
    counter: list[int],
    size_now: Callable[[], int] | None = None,
) -> int:
    """``copy_piece`` with ``numpy_copy_rows``: 0 done, 1 a chunk not verified yet, 2 the
    rows lie outside the source, 3 the source's file is shorter now than the piece
    (truncated since it was mapped), nothing counted or copied unless 0. Without the
    compiled guard, ``size_now()`` is asked before copying (an ``fstat``)."""
    if start < 0 or rows <= 0 or chunk_rows <= 0 or stored <= 0:
        return 2
    first, end = start // chunk_rows, (start + rows - 1) // chunk_rows + 1
    size = np.frombuffer(source, dtype=np.uint8).size
    if end * stored > size:  # whole stored chunks first: before a flag or a chunk is read
        return 2
    if verified is not None:
        if end > len(verified):
            return 2
        if verified.find(0, first, end) >= 0:
            return 1
    last = start + rows - 1
    for target, offset, nbytes in outputs:
        reach = (last // chunk_rows) * stored + (last % chunk_rows) * row_nbytes + offset + nbytes
        if (
            reach > size
            or stored < chunk_rows * row_nbytes
            or not 0 <= offset <= row_nbytes - nbytes
            or np.frombuffer(target, dtype=np.uint8).size != rows * nbytes
        ):
            return 2
    if size_now is not None and size_now() < end * stored:
        return 3
    counter[0] += 1
    counter[1] += (end - first) * stored
    for target, offset, nbytes in outputs:
        numpy_copy_rows(source, target, start, rows, chunk_rows, stored, row_nbytes, offset,
                        nbytes)  # fmt: skip
    return 0


def numpy_copy_bytes(
    source: Any,
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    verified: bytearray | None,
    size_now: Callable[[], int] | None = None,
) -> bytes | int:
    """``copy_bytes`` with ``numpy_copy_piece``: the rows as a new ``bytes``, or the status
    (1 a chunk not verified yet, 2 outside the source, 3 the file is shorter now) that
    ``numpy_copy_piece`` gives; ``b""`` for no rows; counts nothing."""
    if start < 0 or rows < 0 or chunk_rows <= 0 or stored <= 0 or row_nbytes <= 0:
        return 2
    if rows == 0:
        return b""
    target = np.empty(rows * row_nbytes, dtype=np.uint8)
    outputs = ((target, 0, row_nbytes),)
    status = numpy_copy_piece(source, outputs, start, rows, chunk_rows, stored, row_nbytes,
                              verified, [0, 0], size_now)  # fmt: skip
    return target.tobytes() if status == 0 else status


#: The copier readers use: compiled when built, else numpy (tests switch between them).
copy_rows: CopyRows = _compiled_copy_rows or numpy_copy_rows
#: A piece of a mapped block checked, counted and copied at once (``MappedExecutor``).
copy_piece: CopyPiece = _compiled_copy_piece or numpy_copy_piece
#: Rows of a mapped block as a new ``bytes`` (``OpenedDocuments.read_mapped``: documents).
copy_bytes: CopyBytes = _compiled_copy_bytes or numpy_copy_bytes


def compiled() -> bool:
    """Whether the compiled helper is importable (CI asserts it is built)."""
    return _compiled_copy_rows is not None
