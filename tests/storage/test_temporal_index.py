"""The temporal record index read by range: opening reads only the root (and a small
index whole, in one request), a record's entry
costs one request the first time, the cache stays within its budget, damaged entries are
refused by name, and ten million records cost a worker its cache, not its records.
Requests, bytes and memory are exact counts (tracemalloc), never timings."""

from __future__ import annotations

import json
import multiprocessing
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location
from support.temporal import (
    ALL,
    COUNTS,
    PER_CHUNK,
    expected_window,
    small_cache,
    window_truth,
    write_bulk,
)

from rangestream import TemporalArrayStorage
from rangestream.errors import CorruptDataError
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.storage.temporal.stored import OPEN_INDEX_BYTES


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("bulk") / "ds")
    write_bulk(path, COUNTS)
    return path


def test_opening_reads_only_the_root_document(bulk: str) -> None:
    storage = small_cache(bulk)
    assert len(storage) == len(ALL)
    assert storage.stats.by_key_kind == {"zarr.json": 1}


def test_a_small_index_is_read_at_open_and_no_first_window_pays_an_index_request(
    location: Location,
) -> None:
    write_bulk(location.url, COUNTS, storage_options=location.storage_options)
    storage = TemporalArrayStorage(location.url, storage_options=location.storage_options)
    assert len(storage) == len(ALL)  # opens
    chunks = -(-len(ALL) // PER_CHUNK)
    assert storage.stats.by_key_kind == {"zarr.json": 1, "record_rows": 1}  # one request
    assert storage.stats.bytes_by_key_kind["record_rows"] == chunks * (PER_CHUNK * 16 + 4)
    assert chunks * (PER_CHUNK * 16 + 4) <= OPEN_INDEX_BYTES
    # the first window of every record (of every 7th over S3): its data request only
    records = range(len(ALL)) if location.url.startswith("/") else range(0, len(ALL), 7)
    for record in records:
        before = storage.stats.copy()
        got = storage.read_window(record, 0, 1)
        assert (storage.stats - before).by_key_kind == {"x": 1}, record
        assert np.array_equal(got["x"], window_truth(record, 0, 1))


def _bulk_of(records: int, path: Path) -> str:
    url = str(path / f"ds-{records}")
    write_bulk(url, [1 + np.arange(records, dtype=np.int64) % 3])
    return url


def test_an_index_over_the_open_bound_is_still_read_by_range(tmp_path: Path) -> None:
    stored_chunk = PER_CHUNK * 16 + 4
    largest = OPEN_INDEX_BYTES // stored_chunk * PER_CHUNK  # records of the largest index read
    under = TemporalArrayStorage(_bulk_of(largest, tmp_path))
    assert len(under) == largest
    assert under.stats.by_key_kind == {"zarr.json": 1, "record_rows": 1}
    before = under.stats.copy()
    under.read_window(largest - 1, 0, 1)
    assert (under.stats - before).by_key_kind == {"x": 1}
    over = TemporalArrayStorage(_bulk_of(largest + 1, tmp_path))
    assert len(over) == largest + 1
    assert over.stats.by_key_kind == {"zarr.json": 1}  # opening reads only the root
    assert over.sync_reader().index_in_memory  # it fits the cache: the first read takes it
    got = over.read_window(largest, 0, 1)
    assert over.stats.by_key_kind == {"zarr.json": 1, "record_rows": 1, "x": 1}
    assert np.array_equal(got["x"], expected_window(1 + np.arange(largest + 1) % 3, largest, 0, 1))
    before = over.stats.copy()
    over.read_window(7, 0, 1)
    assert (over.stats - before).by_key_kind == {"x": 1}


def test_a_cold_window_costs_one_index_request_and_a_warm_one_none(bulk: str) -> None:
    storage = small_cache(bulk)
    len(storage)  # opens
    record = 2000  # inner chunk 3 of the index
    frames = int(ALL[record])
    before = storage.stats.copy()
    got = storage.read_window(record, 0, frames)
    spent = storage.stats - before
    assert np.array_equal(got["x"], window_truth(record, 0, frames))
    assert spent.by_key_kind == {"record_rows": 1, "x": 1}
    assert spent.bytes_by_key_kind["record_rows"] == PER_CHUNK * 16 + 4  # one chunk, its crc
    before = storage.stats.copy()
    neighbour = 2047  # the same index chunk: warm
    got = storage.read_window(neighbour, 0, 1)
    assert np.array_equal(got["x"], window_truth(neighbour, 0, 1))
    assert (storage.stats - before).by_key_kind == {"x": 1}


def test_random_windows_equal_numpy_and_the_cache_stays_within_its_budget(
    location: Location, tmp_path: Path
) -> None:
    url = location.url
    write_bulk(url, COUNTS, storage_options=location.storage_options)
    storage = small_cache(url, storage_options=location.storage_options)
    rng = np.random.default_rng(22)
    index_requests = 0
    seen: list[int] = []
    for _ in range(120):
        record = int(rng.integers(len(ALL)))
        frames = int(rng.integers(1, int(ALL[record]) + 1))
        start = int(rng.integers(0, int(ALL[record]) - frames + 1))
        before = storage.stats.copy()
        got = storage.read_window(record, start, frames)
        assert np.array_equal(got["x"], window_truth(record, start, frames))
        chunk = record // PER_CHUNK
        cold = chunk not in seen[-2:]  # FIFO of two chunks: cold unless one of the last two
        if cold:
            seen.append(chunk)
        spent = (storage.stats - before).by_key_kind.get("record_rows", 0)
        assert spent == (1 if cold else 0), (record, seen[-3:])
        index_requests += spent
    opened = storage.default_opening.opened.value
    assert opened is not None
    assert len(opened.index.chunks) <= 2
    assert opened.index.cached_nbytes <= 2 * PER_CHUNK * 24
    assert index_requests > 50  # most windows were cold: the cache did not grow


def test_a_damaged_index_chunk_fails_the_windows_that_need_it_by_name(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_bulk(url, COUNTS)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_text())["attributes"]["rangestream"]
    block_path = tmp_path / "ds" / root["data_prefix"] / "index" / "record_rows" / "c" / "0" / "0"
    layout = ArrayLayout.from_json(root["schema"]["index"], "index layout")
    assert layout.chunk_rows == PER_CHUNK
    stored = layout.stored_chunk_nbytes
    rows = np.frombuffer(block_path.read_bytes(), dtype=np.uint8)
    chunks = rows[: (len(ALL) + PER_CHUNK - 1) // PER_CHUNK * stored].reshape(-1, stored)
    values = np.ascontiguousarray(chunks[:, :-4]).view("<i8").reshape(-1, 2)[: len(ALL)].copy()
    values[600, 1] = 10**9  # record 600 (chunk 1) ends far past its shard's rows
    block_path.write_bytes(encode_block(layout, values.view(np.uint8)))  # valid checksums
    storage = small_cache(url)
    with pytest.raises(CorruptDataError, match="record 600 ends at row 1000000000"):
        storage.read_window(601, 0, 1)
    with pytest.raises(OSError):  # a storage error, as LitData users catch them
        storage.read_window(700, 0, 1)
    with pytest.raises(CorruptDataError, match="record 600 ends at row 1000000000"):
        small_cache(url).frame_counts[[5, 3000, 601]]  # three chunks read and checked together
    got = storage.read_window(3, 0, int(ALL[3]))  # chunk 0 is intact
    assert np.array_equal(got["x"], window_truth(3, 0, int(ALL[3])))


# -- at scale: 10^7 records ------------------------------------------------------------------
SCALE_RECORDS = 10**7


@pytest.fixture(scope="module")
def ten_million(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    path = str(tmp_path_factory.mktemp("scale") / "ds")
    counts = 1 + np.arange(SCALE_RECORDS, dtype=np.int64) % 3  # 1, 2, 3, 1, 2, 3, ...
    write_bulk(path, [counts])
    return path, counts


def test_ten_million_records_open_and_read_a_window_in_three_requests_and_64_kib(
    ten_million: tuple[str, np.ndarray],
) -> None:
    path, counts = ten_million
    tracemalloc.start()
    try:
        storage = TemporalArrayStorage(path)
        record = 7_654_321
        got = storage.read_window(record, 0, int(counts[record]))
        stats = storage.stats
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(got["x"], expected_window(counts, record, 0, int(counts[record])))
    assert stats.requests == 3  # the root, one index chunk, the window
    assert stats.by_key_kind == {"zarr.json": 1, "record_rows": 1, "x": 1}
    assert stats.bytes <= 64 * 1024
    assert held <= 16 * 1024 * 1024
    assert len(storage) == SCALE_RECORDS


def _windows_in_child(path: str, records: list[int], queue: Any) -> None:
    tracemalloc.start()
    storage = TemporalArrayStorage(path)
    for record in records:
        storage.read_window(record, 0, 1)
    held, _peak = tracemalloc.get_traced_memory()
    opened = storage.default_opening.opened.value
    queue.put((held, opened.index.cached_nbytes, storage.stats.by_key_kind))


def test_ten_million_records_cost_a_worker_its_cache_not_its_records(
    ten_million: tuple[str, np.ndarray],
) -> None:
    """A forked worker reading 3,000 random windows holds at most the index cache (4 MiB)
    and a few MiB more, whatever the record count."""
    path, _counts = ten_million
    records = np.random.default_rng(25).integers(0, SCALE_RECORDS, size=3000).tolist()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_windows_in_child, args=(path, records, queue))
    child.start()
    held, cached, by_kind = queue.get(timeout=120)
    child.join(30)
    assert child.exitcode == 0
    assert cached <= 4 * 1024 * 1024
    assert held <= 16 * 1024 * 1024
    assert by_kind["x"] == 3000 and by_kind["record_rows"] <= 3000


def test_ten_million_records_sample_windows_from_the_cumulative_index_by_range(
    ten_million: tuple[str, np.ndarray],
) -> None:
    """1,000 uniform global frames located: the cumulative index (one entry per 512
    records) is read once, then one index chunk per distinct chunk touched, never all."""
    path, counts = ten_million
    storage = TemporalArrayStorage(path)
    total = int(counts.sum())  # 1 + 2 + 3 per three records, and one record of 1
    assert storage.total_frames == total
    rng = np.random.default_rng(26)
    positions = rng.integers(0, total, size=1000)
    tracemalloc.start()
    try:
        records, starts = storage.locate_frames(positions)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ground truth without the index: records come in threes of 1 + 2 + 3 = 6 frames
    triple, rest = np.divmod(positions, 6)
    offset = np.select([rest < 1, rest < 3], [0, 1], 2)
    assert np.array_equal(records, 3 * triple + offset)
    assert np.array_equal(starts, rest - np.asarray([0, 1, 3])[offset])
    chunks = np.unique(records // 512).size
    spent = storage.stats.by_key_kind
    # the chunks are read in one step: chunks closer than the coalescing gap (64 KiB) share
    # a request and its gap's bytes
    assert spent["frame_starts"] == 1 and spent["record_rows"] <= chunks
    stored = 512 * 16 + 4
    read = storage.stats.bytes_by_key_kind["record_rows"]
    assert chunks * stored <= read <= chunks * stored + (chunks - spent["record_rows"]) * 65536
    assert held <= 16 * 1024 * 1024
    assert storage.count_windows(3) == (SCALE_RECORDS // 3, SCALE_RECORDS // 3)
