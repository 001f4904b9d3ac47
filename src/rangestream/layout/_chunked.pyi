from typing import Any

def copy_rows(
    source: Any,
    target: Any,
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    field_offset: int,
    field_nbytes: int,
    /,
) -> None: ...
def copy_piece(
    source: Any,
    outputs: tuple[tuple[Any, int, int], ...],
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    verified: bytearray | None,
    counter: list[int],
    size_now: Any = None,
    /,
) -> int: ...

GUARDS_FAULTS: int

def copy_bytes(
    source: Any,
    start: int,
    rows: int,
    chunk_rows: int,
    stored: int,
    row_nbytes: int,
    verified: bytearray | None,
    size_now: Any = None,
    /,
) -> bytes | int: ...
