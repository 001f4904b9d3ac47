"""Blocks are byte-identical to zarr-python's sharding codec output, and damage is caught."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

from rangestream.errors import ChecksumError, CorruptDataError
from rangestream.layout.block import ArrayLayout, encode_block, parse_block_index
from rangestream.layout.checksums import check_span
from rangestream.layout.copy import copy_rows
from rangestream.layout.pieces import indexed_spans


@pytest.mark.parametrize(
    ("length", "chunk_rows", "block_rows", "dtype"),
    [(10, 2, 4, "<i4"), (64, 8, 32, "<i8"), (7, 3, 9, "u1"), (33, 4, 16, "<f8")],
)
def test_encoded_blocks_equal_the_blocks_zarr_python_writes(
    tmp_path: Path, length: int, chunk_rows: int, block_rows: int, dtype: str
) -> None:
    data = (np.arange(length) * 7 + 3).astype(dtype)
    array = zarr.create_array(
        tmp_path / "a",
        shape=(length,),
        chunks=(chunk_rows,),
        shards=(block_rows,),
        dtype=dtype,
        compressors=[Crc32cCodec()],
        fill_value=0,
        config={"write_empty_chunks": True},
    )
    array[:] = data
    layout = ArrayLayout(np.dtype(dtype), (), chunk_rows, block_rows)
    for block in range(layout.num_blocks(length)):
        rows = data[block * block_rows : (block + 1) * block_rows]
        expected = (tmp_path / "a" / "c" / str(block)).read_bytes()
        assert encode_block(layout, rows.view(np.uint8)) == expected


def test_rows_decode_from_a_partial_read_of_a_block() -> None:
    layout = ArrayLayout(np.dtype("<i4"), (), 4, 16)
    data = np.arange(16, dtype="<i4")
    block = encode_block(layout, data.view(np.uint8))
    index = parse_block_index(layout, block[-layout.index_nbytes :], "block")
    ((start, end, first, last),) = indexed_spans(layout, index, 1, 2, "block")
    assert (first, last) == (1, 2)
    span = check_span(block[start:end], layout.stored_chunk_nbytes, first, lambda: "block")
    rows = np.empty(8, dtype="<i4")
    copy_rows(span, rows, 0, 8, 4, layout.stored_chunk_nbytes, 4, 0, 4)
    np.testing.assert_array_equal(rows, data[4:12])


def test_a_flipped_byte_in_a_chunk_raises_a_checksum_error_naming_the_place() -> None:
    layout = ArrayLayout(np.dtype("<i4"), (), 4, 16)
    block = bytearray(encode_block(layout, np.arange(16, dtype="<i4").view(np.uint8)))
    block[layout.stored_chunk_nbytes + 3] ^= 0x40
    stored = layout.stored_chunk_nbytes
    with pytest.raises(ChecksumError, match=r"s3://b/x bytes \[20, 40\): .* inner chunk 1 "):
        check_span(bytes(block[stored : 2 * stored]), stored, 1, lambda: "s3://b/x bytes [20, 40)")


def test_a_damaged_chunk_index_is_refused() -> None:
    layout = ArrayLayout(np.dtype("<i4"), (), 4, 16)
    block = bytearray(encode_block(layout, np.arange(16, dtype="<i4").view(np.uint8)))
    block[-10] ^= 1
    with pytest.raises(ChecksumError):
        parse_block_index(layout, bytes(block[-layout.index_nbytes :]), "block")
    with pytest.raises(CorruptDataError, match="expected"):
        parse_block_index(layout, bytes(block[-layout.index_nbytes + 1 :]), "block")


def test_a_layout_close_to_the_byte_targets_keeps_whole_rows() -> None:
    layout = ArrayLayout.for_sizes(np.dtype("<i4"), (), chunk_bytes=1000, block_bytes=10_000)
    assert layout.chunk_rows == 250
    assert layout.block_rows % layout.chunk_rows == 0
    assert layout.block_rows * 4 <= 10_000


@pytest.mark.parametrize(("length", "chunk_rows"), [(1, 4), (5, 4), (8, 4), (13, 8)])
def test_an_array_of_one_short_block_is_the_block_zarr_python_writes_for_its_own_size(
    tmp_path: Path, length: int, chunk_rows: int
) -> None:
    full = ArrayLayout(np.dtype("<i4"), (), chunk_rows, 64 * chunk_rows)
    stored = full.stored_for(length)
    padded = -(-length // chunk_rows) * chunk_rows
    assert (stored.block_rows, stored.chunk_rows) == (padded, chunk_rows)
    assert stored.index_nbytes == 16 * (padded // chunk_rows) + 4  # not 64 entries
    data = (np.arange(length) * 5 + 1).astype("<i4")
    array = zarr.create_array(
        tmp_path / "a",
        shape=(length,),
        chunks=(chunk_rows,),
        shards=(padded,),
        dtype="<i4",
        compressors=[Crc32cCodec()],
        fill_value=0,
        config={"write_empty_chunks": True},
    )
    array[:] = data
    block = encode_block(stored, data.view(np.uint8))
    assert block == (tmp_path / "a" / "c" / "0").read_bytes()
    assert len(block) == padded // chunk_rows * (chunk_rows * 4 + 4) + stored.index_nbytes


def test_an_array_of_several_blocks_keeps_the_regular_grid_and_full_indexes() -> None:
    full = ArrayLayout(np.dtype("<i4"), (), 4, 16)
    assert full.stored_for(17) is full and full.stored_for(16) is full
    last = encode_block(full, np.arange(1, dtype="<i4").view(np.uint8))  # a short last block
    assert len(last) == 4 * 4 + 4 + full.index_nbytes and full.index_nbytes == 4 * 16 + 4
