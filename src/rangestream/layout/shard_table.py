"""The shard table: per-shard rows of a large dataset, as one binary array.

Up to ``INLINE_SHARDS`` shards the root lists every shard's id and array lengths, so a
small dataset opens with one request. Beyond, it holds their count and totals, and the
per-shard rows live in one int64 array (``index/shards``: 8 bytes per shard and array,
read at open with one more request per 4 MiB) instead of a JSON list parsed number by
number: 10^5 shards open in milliseconds and a few megabytes instead of 157 ms and 41 MB.

This module is the table's form (where it is, its layout, when a root lists the shards
instead, the root's description of it); the read that completes a ``Manifest`` from it is
``manifest.read_shard_table``, beside ``Manifest.with_table``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.layout.block import ArrayLayout
from rangestream.layout.manifest_checks import MAX_SHARDS, MAX_TOTAL_ROWS, require

#: Up to this many shards the root lists them (one request opens the dataset); beyond, the
#: per-shard rows are read from ``index/shards`` (one more request per 4 MiB of them).
INLINE_SHARDS = 1024
#: Where the per-shard rows are, under the version's data prefix.
SHARD_TABLE = "index/shards"
SHARD_ID_COLUMN = "shard_id"


def lists_shards(count: int) -> bool:
    """Whether a root of ``count`` shards lists them (else they are in the table)."""
    return count <= INLINE_SHARDS


def shard_table_layout(arrays: int) -> ArrayLayout:
    """The layout of ``index/shards`` for a kind with ``arrays`` arrays: int64 rows of
    ``(shard id, rows of each array)``, 64 KiB inner chunks, 4 MiB blocks."""
    return ArrayLayout.for_sizes(
        np.dtype("<i8"), (1 + arrays,), chunk_bytes=64 * 1024, block_bytes=4 * 1024 * 1024
    )


def table_shards(
    shards: dict[str, Any], arrays: dict[str, ArrayLayout], where: str
) -> tuple[int, dict[str, int], ArrayLayout]:
    """Count and totals of shards whose rows are in ``index/shards``; its form is checked."""
    count = shards.get("count")
    require(
        type(count) is int and not lists_shards(count) and count <= MAX_SHARDS,
        where,
        f"shards.count {count!r} must be an integer in ({INLINE_SHARDS}, {MAX_SHARDS}] "
        "when the shards are not listed",
    )
    columns = shards.get("columns")
    expected = [SHARD_ID_COLUMN, *arrays]
    require(
        columns == expected,
        where,
        f"shards.columns {columns!r} must be {expected} (the shard id, then every array)",
    )
    layout = ArrayLayout.from_json(shards.get("table"), f"{where} shards.table")
    require(
        layout.dtype == np.dtype("<i8") and layout.row_shape == (len(expected),),
        where,
        f"shards.table must hold int64 rows of {len(expected)} columns",
    )
    totals = shards.get("totals")
    require(isinstance(totals, dict) and set(totals) == set(arrays), where, "bad shards.totals")
    for name, total in totals.items():
        require(
            type(total) is int and 0 <= total < MAX_TOTAL_ROWS,
            where,
            f"shards.totals[{name!r}] {total!r} is out of range",
        )
    return count, {name: totals[name] for name in arrays}, layout
