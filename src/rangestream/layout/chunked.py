"""Copying rows out of a block's inner chunks in one call, with the compiled helper.

A window of rows is spread over inner chunks, each followed by its checksum, and a field
of an interleaved group is a few bytes of every row. numpy copies that in five to eight
calls (views, reshapes, assignments, a fancy index), about 2.5 µs a field before the
bytes move, where a memmap slice needs two. ``copy_rows`` does it in one C call, as
Megatron's indexed datasets do their index arithmetic in compiled helpers.

The extension is optional (``setup.py``): without a compiler, ``copy_rows`` is ``None``
and readers keep their numpy path, which gives the same arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from rangestream.layout._chunked import copy_rows as _compiled_copy_rows
except ImportError:  # built without a C compiler
    _compiled_copy_rows = None

#: ``copy_rows(source, target, start, rows, chunk_rows, stored, row_nbytes, field_offset,
#: field_nbytes)``: copy bytes ``[field_offset, field_offset + field_nbytes)`` of rows
#: ``[start, start + rows)`` of a block (inner chunks of ``chunk_rows`` rows starting every
#: ``stored`` bytes of ``source``) into ``target``, which holds exactly ``rows *
#: field_nbytes`` bytes. Raises ``ValueError`` when the rows or the target do not fit.
#: ``None`` when the extension is not built.
CopyRows = Callable[[Any, Any, int, int, int, int, int, int, int], None]
copy_rows: CopyRows | None = _compiled_copy_rows

__all__ = ["CopyRows", "compiled", "copy_rows"]


def compiled() -> bool:
    """Whether the compiled helper is importable (CI asserts it is built)."""
    return _compiled_copy_rows is not None
