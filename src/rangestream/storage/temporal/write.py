"""Writing temporal records: rows of each field group, kept inside blocks, and the index.

Every group's blocks share one grid, and a record that would straddle a grid line (and fits
in one block) starts at the line instead, after zero rows, so a window of it is one range
request per group. The commit gathers every shard's ``record_rows`` into one small array,
``index/record_rows``, which readers load at open.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rangestream.io.range_reader import RangeReader
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import Manifest, data_prefix
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.layout.zarr_json import array_document, dumps
from rangestream.storage.temporal.index import RecordIndex
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema
from rangestream.storage.writing import ShardEncoder

__all__ = ["INDEX_ARRAY", "TemporalShardEncoder", "group_layouts", "write_record_index"]

_INT64 = np.dtype("<i8")
#: The whole-dataset record index written by the commit, relative to the data prefix:
#: every shard's ``record_rows`` (first and end row of each record) in shard order.
INDEX_ARRAY = "index/record_rows"


class TemporalShardEncoder(ShardEncoder):
    """Encodes records into group rows, padding so that no record straddles a block.

    ``aligned_rows`` is the block grid every group's blocks share (each group's
    ``block_rows`` is a multiple of it). A record that would cross one of its boundaries
    but fits within ``aligned_rows`` frames starts at the next boundary instead, after
    zero rows in every group: a window of it is then one range per group, never two, as
    LitData's chunks never split a sample. Longer records are stored unpadded (they cross
    boundaries wherever they start). Padding costs on average ``frames / (2 *
    aligned_rows)`` of a record's rows.
    """

    def __init__(self, schema: TemporalSchema, aligned_rows: int) -> None:
        self.schema = schema
        self.first_array = schema.groups[0].array
        self.aligned_rows = aligned_rows

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        rows, frames = self.schema.encode(data)
        first = lengths[self.first_array]
        used = first % self.aligned_rows
        if used and frames <= self.aligned_rows and used + frames > self.aligned_rows:
            pad = self.aligned_rows - used
            for array, values in rows.items():
                padded = np.zeros((pad + frames, *values.shape[1:]), dtype=values.dtype)
                padded[pad:] = values
                rows[array] = padded
            first += pad
        rows[RECORD_ROWS] = np.asarray([[first, first + frames]], dtype=_INT64)
        return rows


def group_layouts(
    schema: TemporalSchema,
    layout_of: Any,
    chunk_frames: int,
    chunk_bytes: int,
) -> dict[str, ArrayLayout]:
    """Each group's layout, all on one block grid so records can be kept inside blocks.

    Inner chunks hold a power of two of frames (at most ``chunk_frames`` and
    ``chunk_bytes``), so the largest chunk row count is a multiple of every other. The
    shared grid is the smallest block (the widest group's), cut to a multiple of that;
    every group's block is the largest multiple of the grid within ``block_bytes``
    (at least one), so each grid boundary that a record avoids is the only kind of
    block boundary in any group (see ``TemporalShardEncoder``).
    """
    natural = {}
    for group in schema.groups:
        frames = max(1, min(chunk_frames, chunk_bytes // group.row_nbytes))
        frames = 1 << (frames.bit_length() - 1)
        natural[group.array] = layout_of(
            group.row_dtype, group.row_shape, chunk_bytes=frames * group.row_nbytes
        )
    if not natural:
        return {}
    step = max(layout.chunk_rows for layout in natural.values())
    grid = min(layout.block_rows for layout in natural.values())
    grid = max(step, grid - grid % step)
    return {
        array: ArrayLayout(
            layout.dtype,
            layout.row_shape,
            layout.chunk_rows,
            grid * max(1, layout.block_rows // grid),
            layout.dense_chunks,
        )
        for array, layout in natural.items()
    }


async def write_record_index(
    store: ObjectStore,
    manifest: Manifest,
    schema: TemporalSchema,
    layout: ArrayLayout,
    reader: RangeReader,
    where: str,
) -> None:
    """Gather every shard's ``record_rows`` into ``index/record_rows``, checked first."""
    shard_layout = manifest.arrays[RECORD_ROWS]
    arrays = [
        StoredArray(manifest.array_key(int(shard), RECORD_ROWS), shard_layout, int(n), RECORD_ROWS)
        for shard, n in zip(manifest.shard_ids, manifest.lengths[RECORD_ROWS], strict=True)
        if n
    ]
    reads = [RowRead.whole(array, 0, array.length) for array in arrays]

    def gather() -> Any:
        if reads:
            yield reads
        return None

    await RemoteExecutor(reader, verify=True).run(gather())
    rows = (
        np.concatenate([read.target.reshape(-1).view(_INT64) for read in reads]).reshape(-1, 2)
        if reads
        else np.empty((0, 2), dtype=_INT64)
    )
    RecordIndex(manifest, schema, rows, where)  # validates
    key = f"{data_prefix(manifest.commit_id)}/{INDEX_ARRAY}"
    for block in range(layout.num_blocks(len(rows))):
        piece = rows[block * layout.block_rows : (block + 1) * layout.block_rows]
        await store.put(layout.block_key(key, block), encode_block(layout, piece.view(np.uint8)))
    attributes = {
        "description": "first and end row of each record in its shard's group arrays, "
        "shard by shard"
    }
    await store.put(f"{key}/zarr.json", dumps(array_document(layout, len(rows), attributes)))
