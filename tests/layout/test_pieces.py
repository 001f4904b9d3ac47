"""Row reads cut into pieces, and the byte runs of a block's chunk index."""

from __future__ import annotations

import numpy as np
import pytest

from rangestream.errors import CorruptDataError, OutOfRangeError
from rangestream.layout.block import MISSING, ArrayLayout, encode_block, parse_block_index
from rangestream.layout.pieces import RowRead, StoredArray, indexed_spans, pieces

LAYOUT = ArrayLayout(np.dtype("<i4"), (), 4, 16)


def _index() -> np.ndarray:
    block = encode_block(LAYOUT, np.arange(16, dtype="<i4").view(np.uint8))
    return parse_block_index(LAYOUT, block[-LAYOUT.index_nbytes :], "block")


def test_a_chunk_missing_from_the_index_is_named_as_missing() -> None:
    index = _index().copy()
    index[2] = MISSING
    with pytest.raises(CorruptDataError, match=r"block: inner chunk 2 is missing from the block"):
        indexed_spans(LAYOUT, index, 1, 3, "block")


def test_chunks_stored_out_of_order_are_separate_runs() -> None:
    index = _index().copy()
    index[[1, 2]] = index[[2, 1]]  # chunk 1 now stored after chunk 2
    runs = indexed_spans(LAYOUT, index, 0, 3, "block")
    stored = LAYOUT.stored_chunk_nbytes
    assert runs == [
        (0, stored, 0, 0),
        (2 * stored, 3 * stored, 1, 1),
        (stored, 2 * stored, 2, 2),
        (3 * stored, 4 * stored, 3, 3),
    ]


@pytest.mark.parametrize(("start", "stop"), [(0, 41), (-1, 3), (5, 4), (41, 41)])
def test_rows_outside_the_array_are_refused(start: int, stop: int) -> None:
    array = StoredArray("shards/0/stream", LAYOUT, 40, "stream")
    with pytest.raises(OutOfRangeError, match=r"outside shards/0/stream of length 40"):
        pieces([RowRead.whole(array, start, stop)])


def test_a_read_is_cut_at_every_block_boundary() -> None:
    array = StoredArray("shards/0/stream", LAYOUT, 40, "stream")
    block_rows = LAYOUT.block_rows
    cut = pieces([RowRead.whole(array, block_rows - 1, 2 * block_rows + 1)])
    assert [(p.block, p.row, p.rows, p.at) for p in cut] == [
        (0, block_rows - 1, 1, 0),
        (1, 0, block_rows, 1),
        (2, 0, 1, block_rows + 1),
    ]
