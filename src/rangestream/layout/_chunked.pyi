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
