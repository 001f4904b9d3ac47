"""The mapped executor, through local stream reads: the same elements, segments, counts and
errors as the ``pread`` path of the remote executor, each inner chunk verified once per
process, and the remote executor for everything the mapped one does not serve."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.copies import Copies

import rangestream.layout.checksums as checksums
from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import ChecksumError, TruncatedObjectError
from rangestream.layout.executors import MappedExecutor

pytestmark = pytest.mark.usefixtures("copies")  # each test with compiled and numpy copies

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])
# 16 rows (80 B) per inner chunk, 4 chunks (64 rows) per block: windows cross both
OPTIONS = {"chunk_bytes": 80, "block_bytes": 4 * (80 + 4 + 16) + 4}
STORED_CHUNK = 84
SHARD_LENGTHS = {0: 700, 2: 333, 3: 0, 5: 901}  # shard 3 is empty


def pread_storage(path: Path) -> StreamStorage:
    """The same dataset read with ``pread`` (mapped reads switched off)."""
    return StreamStorage(path, StreamNumpyFormat(TOKENS), mapped=False)


def write(path: Path) -> np.ndarray:
    """The dataset, and its elements in global (shard) order."""
    rng = np.random.default_rng(7)
    storage = StreamStorage(path, StreamNumpyFormat(TOKENS), **OPTIONS)
    parts = []
    with storage.sync_writer() as writer:
        for shard, length in SHARD_LENGTHS.items():
            if not length:
                continue
            elements = np.empty(length, TOKENS)
            elements["tokens"] = rng.integers(0, 50_000, length)
            elements["loss_mask"] = rng.integers(0, 2, length)
            cut = length // 3
            writer.append(shard, {name: elements[name][:cut] for name in TOKENS.names or ()})
            writer.append(shard, {name: elements[name][cut:] for name in TOKENS.names or ()})
            parts.append(elements)
    return np.concatenate(parts)


def windows(total: int, count: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, count)
    return [(int(rng.integers(0, total - n + 1)), int(n)) for n in lengths]


def test_reads_equal_the_pread_path_in_elements_segments_and_counts(
    tmp_path: Path, copies: Copies
) -> None:
    truth = write(tmp_path / "ds")
    mapped = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    plain = pread_storage(tmp_path / "ds")
    with mapped.sync_reader() as fast, plain.sync_reader() as slow:
        assert isinstance(fast.opened.mapped, MappedExecutor)
        assert slow.opened.mapped is None
        for start, length in windows(len(truth), 300, seed=1):
            got, expected = fast.read(start, length), slow.read(start, length)
            for name in TOKENS.names or ():
                np.testing.assert_array_equal(got[name], truth[name][start : start + length])
                np.testing.assert_array_equal(got[name], expected[name])
        batch = windows(len(truth), 8, seed=2)
        sequential = [(64 * k + 3, 30) for k in range(8)]  # adjacent blocks: coalesced
        for requests in (batch, sequential, windows(len(truth), 40, seed=3)):
            got_many, expected_many = fast.read_many(requests), slow.read_many(requests)
            for got, expected in zip(got_many, expected_many, strict=True):
                np.testing.assert_array_equal(got["tokens"], expected["tokens"])
        assert fast.stats.requests == slow.stats.requests
        assert fast.stats.bytes == slow.stats.bytes
        assert fast.stats.by_key_kind == slow.stats.by_key_kind
        # the mapped path really served the in-block windows: its blocks are mapped
        assert len(fast.opened.mapped.maps) > 0
        assert (copies.calls > 0) == (copies.kind == "compiled")


def test_segments_name_the_shard_and_windows_across_shards_or_blocks_still_read(
    tmp_path: Path,
) -> None:
    truth = write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        opened = reader.opened
        inside = opened.read_in_block(700 + 10, 20)  # shard 2, block 0
        assert inside is not None
        lengths, shards = opened.segment_arrays(20, 1)  # shard 2 is the second shard
        assert lengths.tolist() == [20] and shards.tolist() == [2]
        assert opened.read_in_block(60, 10) is None  # crosses blocks 0 and 1 of shard 0
        assert opened.read_in_block(695, 10) is None  # crosses from shard 0 into shard 2
        for start, length in [(60, 10), (695, 10), (1030, 10), (0, len(truth))]:
            got = reader.read(start, length)
            np.testing.assert_array_equal(got["tokens"], truth["tokens"][start : start + length])
        with pytest.raises(IndexError, match="outside the stream"):
            reader.read(len(truth) - 5, 6)
        with pytest.raises(ValueError, match="length must be >= 0"):
            reader.read_many([(3, 4), (5, -1)])


def test_each_inner_chunk_is_verified_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    checked: list[int] = []
    original = checksums.crc32c_value

    def counting(data: Any) -> int:
        checked.append(len(data))
        return original(data)

    with storage.sync_reader() as reader:
        reader.read(0, 1)  # opens (the open's own checks are not counted below)
        monkeypatch.setattr(checksums, "crc32c_value", counting)
        reader.read(16, 20)  # rows 16..35: chunks 1 and 2 of block 0
        assert checked == [STORED_CHUNK, STORED_CHUNK]
        reader.read(20, 10)
        reader.read_many([(17, 5), (33, 2)])
        assert len(checked) == 2  # trusted once verified
        reader.read(30, 20)  # rows 30..49: chunks 1..3, only 3 is new
        assert len(checked) == 3


def test_a_damaged_chunk_fails_every_read_that_touches_it(tmp_path: Path) -> None:
    truth = write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        key = reader.opened.manifest.array_key(0, "stream") + "/c/0/0"
        path = Path(reader.opened.store.local_path(key))
    data = bytearray(path.read_bytes())
    data[2 * STORED_CHUNK + 7] ^= 0xFF  # chunk 2 of shard 0's block 0: rows 32..47
    path.write_bytes(bytes(data))
    with storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, 32)["tokens"], truth["tokens"][:32])
        for attempt in range(2):  # a failed chunk is never trusted
            with pytest.raises(ChecksumError) as caught:
                reader.read(20, 20)  # chunks 1 and 2
            message = str(caught.value)
            assert key in message and "checksum mismatch in inner chunk 2 of the block" in message
            assert f"bytes [{STORED_CHUNK}, {3 * STORED_CHUNK})" in message, attempt
        with pytest.raises(ChecksumError):
            reader.read_many([(0, 4), (40, 4)])


def test_a_block_shorter_than_its_layout_is_reported_by_the_generic_path(tmp_path: Path) -> None:
    write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        key = reader.opened.manifest.array_key(0, "stream") + "/c/1/0"
        path = Path(reader.opened.store.local_path(key))
    path.write_bytes(path.read_bytes()[: 2 * STORED_CHUNK])
    with storage.sync_reader() as reader:
        reader.read(64, 32)  # chunks 0 and 1 of block 1 are still there
        with pytest.raises(TruncatedObjectError):
            reader.read(64 + 40, 10)


def test_a_block_truncated_while_mapped_is_reported_not_read_as_zeros(tmp_path: Path) -> None:
    """Block 1 of shard 0 is mapped and its chunks verified, then cut inside chunk 2: the
    mapping still covers the old size, and the cut bytes of its last page read as zeros."""
    truth = write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        reader.read_many([(64, 30), (94, 34)])  # block 1 whole: mapped, every chunk verified
        key = reader.opened.manifest.array_key(0, "stream") + "/c/1/0"
        with open(reader.opened.store.local_path(key), "r+b") as handle:
            handle.truncate(2 * STORED_CHUNK + 10)
        got = reader.read_many([(64, 10), (80, 12)])  # chunks 0 and 1: still there
        for (start, length), window in zip([(64, 10), (80, 12)], got, strict=True):
            np.testing.assert_array_equal(window["tokens"], truth["tokens"][start : start + length])
        with pytest.raises(TruncatedObjectError, match="shorter than the dataset's metadata"):
            reader.read_many([(64 + 33, 4), (64 + 50, 4)])  # chunks 2 and 3: cut


def _read_in_child(reader: Any, start: int, length: int, queue: Any) -> None:
    queue.put((os.getpid(), reader.read(start, length)["tokens"].tolist()))


def test_a_reader_used_in_the_parent_maps_its_own_files_in_a_forked_child(
    tmp_path: Path,
) -> None:
    truth = write(tmp_path / "ds")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_reader() as reader:
        reader.read(10, 20)
        parent_maps = reader.opened.mapped.maps.entries()
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_read_in_child, args=(reader, 720, 30, queue))
        child.start()
        pid, tokens = queue.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0 and pid != os.getpid()
        assert tokens == truth["tokens"][720:750].tolist()
        assert reader.opened.mapped.maps.entries() is parent_maps  # the parent's are untouched


def test_async_reads_on_a_local_path_take_the_mapped_path_with_the_same_counts(
    tmp_path: Path,
) -> None:
    truth = write(tmp_path / "ds")
    requests = windows(len(truth), 50, seed=4)

    async def read_all(storage: StreamStorage) -> tuple[list[Any], Any, Any]:
        async with storage.async_reader() as reader:
            singles = [await reader.read(start, length) for start, length in requests]
            many = await reader.read_many(requests)
            mapped = reader.opened.mapped
            return singles + many, reader.stats, (mapped, mapped and len(mapped.maps))

    fast, fast_stats, fast_mapped = asyncio.run(
        read_all(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)))
    )
    slow, slow_stats, slow_mapped = asyncio.run(read_all(pread_storage(tmp_path / "ds")))
    assert isinstance(fast_mapped[0], MappedExecutor) and slow_mapped[0] is None
    assert fast_mapped[1] > 0  # blocks were mapped while the reader was open
    for (start, length), got in zip(requests * 2, fast, strict=True):
        np.testing.assert_array_equal(got["tokens"], truth["tokens"][start : start + length])
    for got, expected in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(got["loss_mask"], expected["loss_mask"])
    assert (fast_stats.requests, fast_stats.bytes) == (slow_stats.requests, slow_stats.bytes)


def _lru_misses(keys: list[int], bound: int) -> int:
    """Misses of a least-recently-used cache of ``bound`` entries over ``keys``."""
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for key in keys:
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += 1
        cache[key] = None
        if len(cache) > bound:
            cache.popitem(last=False)
    return misses


@pytest.mark.parametrize("bound", [256, None], ids=["old-bound", "default"])
def test_a_working_set_of_a_thousand_blocks_is_mapped_once_under_the_default_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: int | None
) -> None:
    from rangestream.io import mapped

    if bound is not None:
        monkeypatch.setattr(mapped, "DEFAULT_MAX_MAPPED_FILES", bound)
    maps = []
    real = mapped.map_file

    def counted(path: str, root: str, units: int = 0) -> Any:
        maps.append(path)
        return real(path, root, units)

    monkeypatch.setattr(mapped, "map_file", counted)
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), **OPTIONS)
    blocks = 1000
    elements = np.zeros(blocks * 64, TOKENS)
    elements["tokens"] = np.arange(blocks * 64)
    with storage.sync_writer() as writer:
        writer.append(0, {name: elements[name] for name in TOKENS.names or ()})
    touched = np.random.default_rng(0).integers(0, blocks, 4000).tolist()
    with storage.sync_reader() as reader:
        for block in touched:  # a window inside each block
            window = reader.read(block * 64 + 5, 40)
            assert window["tokens"].tolist() == list(range(block * 64 + 5, block * 64 + 45))
    expected = _lru_misses(touched, 256 if bound is not None else 10**9)
    assert len(maps) == expected
    if bound is None:
        assert expected == len(set(touched))  # each block mapped once: no cliff
    else:
        assert expected > 3 * len(set(touched))  # the old bound re-maps most windows
