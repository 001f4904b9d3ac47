"""Damaged objects and inconsistent metadata fail loudly, naming what is damaged.

Objects are damaged the way a failing disk or a careless copy would: a flipped byte, a
cut-off tail, a deleted object, a manifest whose lengths disagree with what is stored.
Every case must end in ``CorruptDataError`` (or a subclass) naming the object and range,
before anything is allocated from the damaged numbers.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import (
    ChecksumError,
    CorruptDataError,
    MissingObjectError,
    TruncatedObjectError,
)
from rangestream.layout.block import encode_block
from rangestream.loader import StatefulDataLoader

from .datasets import SMALL, TOKENS, RawObjects, TokenData, write_documents, write_tokens

# SMALL layout with 4-byte tokens: 16 tokens per inner chunk, stored as 16 * 4 + 4 bytes,
# and 16 chunks (256 tokens) per block.
CHUNK_ROWS, STORED_CHUNK, BLOCK_ROWS = 16, 68, 256
#: Peak bytes a read of a few rows may allocate, whatever the metadata claims.
MEMORY_BOUND = 16 * 1024 * 1024


def written(location: Location, **options: Any) -> tuple[TokenData, RawObjects]:
    data = write_tokens(location.child("ds"), location.storage_options, seed=3,
                        tokens_per_shard=5_000, **{**SMALL, **options})  # fmt: skip
    return data, RawObjects(location.child("ds"), location.storage_options)


def read_async(storage: StreamStorage, start: int, length: int) -> Any:
    async def main() -> Any:
        async with storage.async_reader() as reader:
            return await reader.read(start, length)

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_flipped_byte_raises_a_checksum_error_naming_the_object_and_range(
    location: Location, mode: str
) -> None:
    data, raw = written(location)
    key = raw.block_key(0, "stream", 2)
    raw.flip(key, 3 * STORED_CHUNK + 10)  # inside inner chunk 3 of block 2 of shard 0
    start = 2 * BLOCK_ROWS + 40  # rows 40..59 of the block: inner chunks 2 and 3
    with pytest.raises(ChecksumError) as caught:
        if mode == "sync":
            with data.storage.sync_reader() as reader:
                reader.read(start, 20)
        else:
            read_async(data.storage, start, 20)
    message = str(caught.value)
    assert raw.describe(key) in message
    assert f"bytes [{2 * STORED_CHUNK}, {4 * STORED_CHUNK})" in message


def test_reads_that_do_not_touch_the_damaged_chunk_still_succeed(location: Location) -> None:
    data, raw = written(location)
    raw.flip(raw.block_key(0, "stream", 2), 3 * STORED_CHUNK + 10)
    with data.storage.sync_reader() as reader:
        window = reader.read(2 * BLOCK_ROWS, 3 * CHUNK_ROWS)  # chunks 0..2 only
    np.testing.assert_array_equal(
        window["tokens"], data.tokens[2 * BLOCK_ROWS : 2 * BLOCK_ROWS + 3 * CHUNK_ROWS]
    )


def test_a_flipped_checksum_trailer_is_caught_and_without_verification_a_flip_is_not(
    tmp_path: Any,
) -> None:
    location = Location(str(tmp_path), {})
    data, raw = written(location)
    key = raw.block_key(1, "stream", 0)
    raw.flip(key, STORED_CHUNK - 1)  # last byte of chunk 0's crc32c
    raw.flip(key, STORED_CHUNK + 5)  # a token byte of chunk 1
    start = 5_000  # shard 1 starts here
    with data.storage.sync_reader() as reader, pytest.raises(ChecksumError, match="inner chunk 0"):
        reader.read(start, CHUNK_ROWS)
    unchecked = StreamStorage(data.storage.url, StreamNumpyFormat(TOKENS), verify_checksums=False)
    with unchecked.sync_reader() as reader:
        window = reader.read(start, 2 * CHUNK_ROWS)["tokens"]
    expected = data.tokens[start : start + 2 * CHUNK_ROWS]
    assert (window != expected).sum() == 1  # the damage comes through: the check is what finds it


def test_a_damaged_chunk_index_raises_a_checksum_error_when_the_index_is_read(
    location: Location,
) -> None:
    data, raw = written(location, dense_chunks=False)
    key = raw.block_key(0, "stream", 0)
    size = len(raw.get(key))
    raw.flip(key, size - 20)  # inside the chunk index at the end of the block
    with (
        data.storage.sync_reader() as reader,
        pytest.raises(ChecksumError, match="chunk index checksum mismatch") as caught,
    ):
        reader.read(0, 10)
    assert raw.describe(key) in str(caught.value)


def test_a_truncated_block_raises_truncated_object_error_naming_the_url_and_range(
    location: Location,
) -> None:
    data, raw = written(location)
    key = raw.block_key(0, "stream", 3)
    raw.truncate(key, STORED_CHUNK * 16)  # the chunk index and the last inner chunk
    with data.storage.sync_reader() as reader:
        before = reader.stats.copy()
        with pytest.raises(TruncatedObjectError) as caught:
            reader.read(3 * BLOCK_ROWS + 240, 16)  # the block's last inner chunk
        spent = reader.stats - before
    assert raw.describe(key) in str(caught.value)
    assert f"bytes [{15 * STORED_CHUNK}, {16 * STORED_CHUNK})" in str(caught.value)
    # a complete response short of the range means a short object: one repeat, not six
    assert spent.requests == (2 if location.is_s3 else 1)


def test_a_missing_block_raises_missing_object_error_naming_it(location: Location) -> None:
    data, raw = written(location)
    key = raw.block_key(2, "stream", 1)
    raw.delete(key)
    with data.storage.sync_reader() as reader, pytest.raises(MissingObjectError) as caught:
        reader.read(2 * 5_000 + BLOCK_ROWS + 3, 5)
    assert raw.describe(key) in str(caught.value)
    assert isinstance(caught.value, CorruptDataError)


def test_a_manifest_longer_than_the_stored_rows_fails_on_the_rows_it_invents(
    location: Location,
) -> None:
    data, raw = written(location)
    root = raw.root()
    lengths = root["attributes"]["rangestream"]["shards"]["lengths"]["stream"]
    lengths[0] += 3 * BLOCK_ROWS  # shard 0 "has" three more blocks than were written
    raw.put_root(root)
    with data.storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, 100)["tokens"], data.tokens[:100])
        # shard 0 holds 5000 rows: 19 full blocks and 8.5 chunks of block 19
        with pytest.raises(TruncatedObjectError, match="/shards/0/stream/c/19/0 "):
            reader.read(5_100, 10)
        with pytest.raises(MissingObjectError, match="/shards/0/stream/c/21/0 "):
            reader.read(5_000 + 2 * BLOCK_ROWS, 10)


def test_a_manifest_claiming_10_to_the_15_rows_allocates_nothing_for_them(
    tmp_path: Any,
) -> None:
    location = Location(str(tmp_path), {})
    data, raw = written(location)
    root = raw.root()
    root["attributes"]["rangestream"]["shards"]["lengths"]["stream"][2] = 10**15
    raw.put_root(root)
    tracemalloc.start()
    try:
        with data.storage.sync_reader() as reader:
            assert reader.total_length == 10_000 + 10**15
            with pytest.raises(MissingObjectError):
                reader.read(10**14, 2048)
            with pytest.raises(MissingObjectError):
                reader.read(15_000, 10**12)  # no plan of 4 billion blocks is made
        loader = StatefulDataLoader.from_storage(
            data.storage, sequence_length=2048, batch_size=4, num_workers=0, shuffle=True
        )
        assert len(loader) > 10**10
        with pytest.raises(CorruptDataError):
            next(iter(loader))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND


def test_a_layout_claiming_gigabyte_chunks_allocates_only_what_the_object_holds(
    tmp_path: Any,
) -> None:
    location = Location(str(tmp_path), {})
    data, raw = written(location)
    root = raw.root()
    layout = root["attributes"]["rangestream"]["arrays"]["stream"]
    layout["chunk_rows"] = layout["block_rows"] = 1 << 28  # inner chunks of 1 GiB
    raw.put_root(root)
    tracemalloc.start()
    try:
        with data.storage.sync_reader() as reader, pytest.raises(TruncatedObjectError):
            reader.read(0, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND


def test_document_offsets_claiming_a_huge_document_fail_before_allocating_it(
    tmp_path: Any,
) -> None:
    location = Location(str(tmp_path), {})
    docs = write_documents(location.child("docs"), seed=4, count=40, **SMALL)
    raw = RawObjects(location.child("docs"), {})
    huge = 10**15
    root = raw.root()
    lengths = root["attributes"]["rangestream"]["shards"]["lengths"]
    lengths["payload_heap"][0] = huge
    raw.put_root(root)
    # a well-formed block (valid checksums) whose offsets say document 0 is 10**15 bytes
    layout = raw.layout("payload_offsets")
    offsets = np.asarray([0, huge] + [huge] * (lengths["payload_offsets"][0] - 2), "<i8")
    rows = offsets[: layout.block_rows]
    raw.put(raw.block_key(0, "payload_offsets", 0), encode_block(layout, rows.view(np.uint8)))
    tracemalloc.start()
    started = time.monotonic()
    try:
        with docs.storage.sync_reader() as reader:
            with pytest.raises(MissingObjectError, match="payload_heap/c/"):
                reader.read(0)
            assert reader.read(39) == docs.documents[39]  # shard 1 is intact
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND
    assert time.monotonic() - started < 5


def test_checksum_verification_costs_a_small_fraction_of_a_window(tmp_path: Any) -> None:
    """Measure (and print) the cost of crc32c on random 2048-token windows, local disk.

    Not a timed test: it asserts only that both settings return the same bytes. CPU time
    of this process, best of interleaved rounds, so other load on the machine (tests and
    benchmarks run side by side) disturbs the figure as little as possible.
    """
    data = write_tokens(str(tmp_path / "ds"), seed=9, shards=2, tokens_per_shard=4_000_000)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(data.tokens) - 2048, 2000)
    storages = {
        verify: StreamStorage(data.storage.url, StreamNumpyFormat(TOKENS), verify_checksums=verify)
        for verify in (True, False)
    }
    seconds: dict[bool, list[float]] = {True: [], False: []}
    readers = {verify: storage.sync_reader() for verify, storage in storages.items()}
    try:
        for reader in readers.values():  # warm the page cache and both readers
            for start in starts[:500]:
                reader.read(int(start), 2048)
        for _ in range(15):  # interleaved rounds, so drift hits both settings alike
            for verify, reader in readers.items():
                began = time.process_time()
                for start in starts:
                    reader.read(int(start), 2048)
                seconds[verify].append(time.process_time() - began)
        for start in starts[:50]:
            checked = readers[True].read(int(start), 2048)["tokens"]
            unchecked = readers[False].read(int(start), 2048)["tokens"]
            np.testing.assert_array_equal(checked, unchecked)
            np.testing.assert_array_equal(checked, data.tokens[start : start + 2048])
    finally:
        for reader in readers.values():
            reader.close()
    with_crc = min(seconds[True]) / len(starts) * 1e6
    without = min(seconds[False]) / len(starts) * 1e6
    print(
        f"\nchecksum cost, random 2048-token windows, local, CPU time: "
        f"{with_crc:.1f} us/window verified, "
        f"{without:.1f} us unverified: {with_crc - without:.1f} us "
        f"({(with_crc - without) / with_crc:.0%} of a verified window's time)"
    )
