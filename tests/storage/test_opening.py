"""Opening: constant requests whatever the shards, a few bytes per shard, nothing per epoch.

A dataset of more shards than the root lists (``INLINE_SHARDS``) opens with exactly two
requests: the root, then the shard table (8 bytes per shard and column). Memory held after
opening grows by the table and the stream's bounds, not by Python objects per shard. A
reader released between two event loops (a persistent DataLoader worker's epochs) opens
nothing again and keeps what it learnt.
"""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location, S3Location

from rangestream import DocumentStorage, StreamDataset, StreamNumpyFormat, StreamStorage
from rangestream.errors import DatasetNotFoundError
from rangestream.io.stats import IOStats
from rangestream.layout.shard_table import INLINE_SHARDS, shard_table_layout

TOKENS = np.dtype([("t", "<i4")])


class Raw:
    payload_encoding = "raw"

    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, data: Any, shard: int) -> bytes:
        return bytes(data)


def claimed(path: Path, shards: int) -> StreamStorage:
    """A stream of ``shards`` shards of 7 tokens; only shard 0 holds objects.

    The others are listed by a part manifest as a writer lists its shards: the commit, the
    root and the index are those of ``shards`` written shards, and opening reads nothing
    else, so the open's cost is measured without writing thousands of shards.
    """
    storage = StreamStorage(path, StreamNumpyFormat(TOKENS))
    session = storage.parallel_write()
    with session.sync_writer(part_id="written") as writer:
        writer.append(0, {"t": np.arange(7, dtype="<i4")})
    rows = {"stream": 7, "record_ends": 1}
    part = {"part_id": "claimed", "shards": {str(s): rows for s in range(1, shards)}}
    (path / session.prefix / "parts" / "claimed.json").write_text(json.dumps(part))
    session.commit(check_objects=False)  # the claimed shards have no objects, on purpose
    return storage


def _traced(call: Any) -> Any:
    """The frame every allocation ``held_by`` counts passes through."""
    return call()


_TRACED_LINE = _traced.__code__.co_firstlineno + 2


def held_by(call: Any) -> tuple[Any, int]:
    """What ``call()`` returns, and the traced bytes it allocated that are still held.

    Only allocations made under ``call`` in this thread count: tracemalloc traces every
    thread, and threads earlier tests leave running (an fsspec or aiohttp loop's timers, an
    idle pool) allocate at moments of their own, as much as 10 KB more or less in one
    open than the next measured here, where the bounds compare opens to 4 KB. The cyclic
    collector is paused meanwhile: another thread's allocations would otherwise start it
    in one open and not in the next, freeing that open's few KB of cycles there only.
    """
    gc.collect()
    gc.disable()
    tracemalloc.start(64)  # deeper than any open's own frames: each trace reaches _traced
    try:
        value = _traced(call)
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        gc.enable()
    mine = tracemalloc.Filter(True, __file__, lineno=_TRACED_LINE, all_frames=True)
    # a process-wide ``WeakSet`` (``io.stats``' live counters) rehashes its table when
    # earlier tests' dead entries fill it: a table of the whole process (18 KB seen under
    # xdist), allocated by whichever open adds the next entry, not held by that open
    registry = tracemalloc.Filter(False, weakref.__file__.replace("weakref.py", "_weakrefset.py"))
    traces = snapshot.filter_traces([mine, registry]).traces
    return value, sum(trace.size for trace in traces)


def open_cost(storage: StreamStorage) -> tuple[int, int, int]:
    """Requests, bytes and traced memory held of an open and a first window."""
    with StreamStorage(storage.url, StreamNumpyFormat(TOKENS)).sync_reader() as warm:
        warm.read(0, 7)  # imports and lazy module state, outside the measure

    def open_and_read() -> Any:
        reader = storage.sync_reader()
        reader.__enter__()
        stats = reader.stats  # the open's, before the window's read
        assert reader.read(0, 7)["t"].tolist() == list(range(7))
        return reader, stats

    (reader, stats), held = held_by(open_and_read)
    reader.close()
    return stats.requests, stats.bytes, held


def table_bytes(shards: int, columns: int) -> int:
    """Bytes of the inner chunks holding ``shards`` table rows (what opening fetches)."""
    layout = shard_table_layout(columns - 1)
    chunks = -(-shards // layout.chunk_rows)
    return chunks * layout.stored_chunk_nbytes


def test_few_shards_open_with_the_root_alone(tmp_path: Path) -> None:
    storage = claimed(tmp_path / "ds", INLINE_SHARDS)
    requests, nbytes, _ = open_cost(storage)
    assert requests == 1
    assert nbytes == (tmp_path / "ds" / "zarr.json").stat().st_size


@pytest.mark.parametrize("shards", [INLINE_SHARDS + 1, 5000, 40_000])
def test_many_shards_open_with_the_root_and_one_table_read(tmp_path: Path, shards: int) -> None:
    storage = claimed(tmp_path / "ds", shards)
    requests, nbytes, _ = open_cost(storage)
    root = (tmp_path / "ds" / "zarr.json").stat().st_size
    assert root < 4096  # the count, totals and layouts: no list of shards
    assert requests == 2
    assert nbytes == root + table_bytes(shards, 3)


def test_memory_held_after_opening_grows_by_well_under_100_bytes_per_shard(
    tmp_path: Path,
) -> None:
    few = open_cost(claimed(tmp_path / "few", 4000))[2]
    many = open_cost(claimed(tmp_path / "many", 40_000))[2]
    # the table (24 B per shard), its cumulative bounds (8 B) and the bisect list (~36 B)
    assert (many - few) / 36_000 < 100


def test_a_hundred_thousand_shards_open_within_ten_megabytes(tmp_path: Path) -> None:
    requests, nbytes, held = open_cost(claimed(tmp_path / "ds", 100_000))
    assert requests == 2 and nbytes < 100_000 * 25 + 4096
    assert held < 10 * 1024 * 1024


def test_windows_of_a_dataset_of_many_shards_with_gaps_equal_the_tokens_written(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), chunk_bytes=64)
    ids = np.sort(rng.choice(4 * INLINE_SHARDS, INLINE_SHARDS + 200, replace=False))
    pieces = []
    with storage.sync_writer() as writer:
        for shard in ids:
            tokens = rng.integers(0, 1 << 30, int(rng.integers(1, 40))).astype("<i4")
            writer.append(int(shard), {"t": tokens})
            pieces.append(tokens)
    truth = np.concatenate(pieces)
    with StreamDataset(storage, 15, stride=1).sync_reader() as reader:
        assert reader.storage_reader.stats.requests == 2  # root and shard table
        assert reader.storage_reader.num_shards == int(ids[-1]) + 1
        assert reader.storage_reader.length(int(ids[7])) == len(pieces[7])
        assert reader.storage_reader.length(int(ids[7]) + 4 * INLINE_SHARDS) == 0
        for start in rng.integers(0, len(truth) - 15, 300).tolist():
            np.testing.assert_array_equal(reader[start]["t"], truth[start : start + 15])
        starts = rng.integers(0, len(truth) - 15, 40).tolist()
        for start, window in zip(starts, reader.read_many(starts), strict=True):
            np.testing.assert_array_equal(window["t"], truth[start : start + 15])


def test_documents_of_a_dataset_of_many_shards_are_read_back(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", Raw(), chunk_bytes=64)
    documents = [bytes([i % 251]) * (i % 13 + 1) for i in range(INLINE_SHARDS + 300)]
    with storage.sync_writer() as writer:
        for shard, document in enumerate(documents):
            writer.append(shard * 2, document)
    with storage.sync_reader() as reader:
        assert reader.stats.requests == 2
        picks = np.random.default_rng(0).permutation(len(documents))[:200].tolist()
        assert reader.read_many(picks) == [documents[i] for i in picks]
        assert reader.length(2 * 17) == 1 and reader.length(2 * 17 + 1) == 0


def test_a_reader_released_between_loops_opens_nothing_on_the_next_one(
    location: Location,
) -> None:
    storage = DocumentStorage(location.child("docs"), Raw(),
                              storage_options=location.storage_options)  # fmt: skip
    documents = [bytes([i]) * (100 + i) for i in range(200)]
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i // 100, document)  # global order is i
    reader = storage.async_reader()
    picks = [5, 150, 77, 3]

    async def epoch(opening: bool = False) -> Any:
        if opening:
            await reader.__aenter__()
        before = IOStats() if opening else reader.stats.copy()
        got = await reader.read_many(picks)
        spent = reader.stats - before
        await reader.arelease()  # before this loop closes
        return got, spent

    async def first() -> Any:
        return await epoch(opening=True)

    got, opened = asyncio.run(first())
    assert got == [documents[i] for i in picks]
    assert opened.by_key_kind["zarr.json"] == 1 and opened.by_key_kind["payload_offsets"] == 2
    got, again = asyncio.run(epoch())  # a new loop, as a persistent worker's next epoch
    assert got == [documents[i] for i in picks]
    assert again.by_key_kind == {"payload_heap": again.by_key_kind["payload_heap"]}
    asyncio.run(reader.aclose())


def test_a_sync_reader_released_keeps_its_version_and_reads_on(tmp_path: Path) -> None:
    storage = claimed(tmp_path / "ds", 3)
    with storage.sync_reader() as reader:
        reader.read(0, 7)
        opened = reader.opened
        reader.release()
        before = reader.stats.copy()
        assert reader.read(0, 7)["t"].tolist() == list(range(7))
        assert reader.opened is opened
        assert "zarr.json" not in (reader.stats - before).by_key_kind


def test_shard_ids_find_positions_by_arithmetic_or_bisection() -> None:
    from rangestream.storage.core.opening import ShardIds

    dense, sparse = ShardIds(np.arange(5)), ShardIds(np.asarray([0, 2, 7]))
    assert [dense.position(s) for s in (0, 4, 5, -1)] == [0, 4, None, None]
    assert [sparse.position(s) for s in (0, 2, 3, 7, 8)] == [0, 1, None, 2, None]
    assert list(sparse) == [0, 2, 7] and sparse[1:] == [2, 7] and sparse[-1] == 7
    assert np.int64(7) in sparse and 3 not in sparse and "7" not in sparse


# -- what a missing dataset is called ------------------------------------------------------


def test_a_missing_bucket_is_called_a_missing_bucket(s3_url: S3Location) -> None:
    url = "s3://rangestream-no-such-bucket-7f3a/ds"
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=s3_url.storage_options)
    with pytest.raises(DatasetNotFoundError, match="bucket 'rangestream-no-such-bucket-7f3a' does"):
        storage.sync_reader().read(0, 1)


def test_a_missing_local_directory_and_an_uncommitted_one_are_told_apart(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no such directory"):
        StreamStorage(tmp_path / "nothing", StreamNumpyFormat(TOKENS)).sync_reader().read(0, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="never committed"):
        StreamStorage(tmp_path / "empty", StreamNumpyFormat(TOKENS)).sync_reader().read(0, 1)


def test_a_prefix_without_a_dataset_in_an_existing_bucket_is_not_committed(
    s3_url: S3Location,
) -> None:
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_url.storage_options)  # fmt: skip
    with pytest.raises(DatasetNotFoundError, match="never committed"):
        storage.sync_reader().read(0, 1)


# -- opening costs the same whatever the records ----------------------------------------------


class Spans:
    """A stream with metadata: each record is one run with one payload."""

    stream_dtype = np.dtype("<i4")

    def size(self, data: tuple[np.ndarray, bytes]) -> int:
        return len(data[0])

    def pack(self, data: tuple[np.ndarray, bytes]) -> Any:
        tokens, payload = data
        for i in range(len(tokens)):
            yield 0, payload if i == 0 else None
        return tokens

    def unpack(self, stream: Any, shards: Any, index: Any, payloads: Any) -> Any:
        return stream, payloads


def kind_storage(kind: str, path: Path) -> Any:
    from rangestream import StreamWithMetaStorage

    if kind == "stream":
        return StreamStorage(path, StreamNumpyFormat(TOKENS))
    if kind == "document":
        return DocumentStorage(path, Raw())
    return StreamWithMetaStorage(path, Spans())


def claimed_records(kind: str, path: Path, records: int, shards: int = 3) -> Any:
    """A dataset of ``kind`` whose ``shards`` shards claim ``records`` records each (no
    objects: an open reads the root and the shard table only)."""
    rows = {
        "stream": {"stream": records, "record_ends": records},
        "document": {"payload_heap": 8 * records, "payload_offsets": records + 1},
        "stream_with_meta": {"stream": records, "record_ends": records, "runs": 2 * records,
                             "payload_heap": 8 * records, "run_index": -(-records // 256)},
    }[kind]  # fmt: skip
    storage = kind_storage(kind, path)
    session = storage.parallel_write()
    part = {"part_id": "claimed", "shards": {str(s): rows for s in range(shards)}}
    (path / session.prefix / "parts").mkdir(parents=True)
    (path / session.prefix / "parts" / "claimed.json").write_text(json.dumps(part))
    session.commit(check_objects=False)  # the claimed shards have no objects, on purpose
    return storage


def opened_cost(storage: Any) -> tuple[int, int, int]:
    """Requests, bytes and traced memory held by an open (imports warmed outside it)."""

    def open_reader() -> Any:
        reader = storage.sync_reader()
        reader.__enter__()
        return reader

    reader, held = held_by(open_reader)
    stats = reader.stats
    reader.close()
    return stats.requests, stats.bytes, held


@pytest.mark.parametrize("kind", ["stream", "document", "stream_with_meta"])
def test_every_kind_opens_with_one_request_and_the_same_memory_from_a_thousand_to_a_billion_records(
    tmp_path: Path, kind: str
) -> None:
    opened_cost(claimed_records(kind, tmp_path / "warm", 10))  # imports, outside the measure
    costs = {}
    for records in (10**3, 10**9):
        path = tmp_path / f"ds{records}"
        requests, nbytes, held = opened_cost(claimed_records(kind, path, records))
        assert requests == 1 and nbytes == (path / "zarr.json").stat().st_size
        costs[records] = (nbytes, held)
    # the root's numbers have 6 more digits; nothing else grows with the records
    assert costs[10**9][0] - costs[10**3][0] < 200
    assert abs(costs[10**9][1] - costs[10**3][1]) < 4096


@pytest.mark.parametrize(("kind", "requests"), [("document", 2), ("stream_with_meta", 3)])
def test_every_kind_opens_a_hundred_thousand_shards_within_ten_megabytes(
    tmp_path: Path, kind: str, requests: int
) -> None:
    opened_cost(claimed_records(kind, tmp_path / "warm", 1))  # imports, outside the measure
    storage = claimed_records(kind, tmp_path / "ds", 1, shards=100_000)
    got, nbytes, held = opened_cost(storage)
    columns = 1 + {"document": 2, "stream_with_meta": 5}[kind]
    # the root, then the table: one request per 4 MiB block of it (6 columns: two blocks)
    assert got == requests
    assert nbytes == (tmp_path / "ds" / "zarr.json").stat().st_size + table_bytes(100_000, columns)
    assert held < 10_000_000  # 10 MB
