"""The temporal record index read by range: opening reads only the root, a record's entry
costs one request the first time, the cache stays within its budget, ``frame_counts`` is
lazy, and the cumulative index maps global frames to records like a numpy ground truth.
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
from support.temporal import expected_window, write_bulk

from rangestream import TemporalArrayStorage
from rangestream.errors import CorruptDataError, MetadataError, OutOfRangeError
from rangestream.layout.block import ArrayLayout, encode_block

# Records of 1..40 frames in three shards; 8 KiB index chunks hold 512 records.
RNG = np.random.default_rng(21)
COUNTS = [RNG.integers(1, 41, size=n) for n in (1500, 700, 2100)]
ALL = np.concatenate(COUNTS)
PER_CHUNK = 512


def shard_of(record: int) -> tuple[int, int]:
    """(shard, first frame of the record in its shard) of a global record number."""
    bounds = np.cumsum([0, *(len(c) for c in COUNTS)])
    shard = int(np.searchsorted(bounds, record, side="right")) - 1
    local = record - int(bounds[shard])
    return shard, int(COUNTS[shard][:local].sum())


def window_truth(record: int, start: int, frames: int) -> np.ndarray:
    _shard, offset = shard_of(record)
    first = offset + start
    return (np.arange(first, first + frames) % 251).astype(np.uint8)


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("bulk") / "ds")
    write_bulk(path, COUNTS)
    return path


def small_cache(url: str, **options: Any) -> TemporalArrayStorage:
    """A storage whose index cache holds two inner chunks (1,024 records) of 4,300."""
    return TemporalArrayStorage(url, index_cache_bytes=2 * PER_CHUNK * 24, **options)


def test_opening_reads_only_the_root_document(bulk: str) -> None:
    storage = small_cache(bulk)
    assert len(storage) == len(ALL)
    assert storage.stats.by_key_kind == {"zarr.json": 1}


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
    opened = storage._default_opening.opened.value
    assert opened is not None
    assert len(opened.index.chunks) <= 2
    assert opened.index.cached_nbytes <= 2 * PER_CHUNK * 24
    assert index_requests > 50  # most windows were cold: the cache did not grow


def test_frame_counts_is_a_lazy_array_like_equal_to_numpy(bulk: str) -> None:
    storage = small_cache(bulk)
    counts = storage.frame_counts
    assert len(counts) == len(ALL) and counts.dtype == np.int64 and counts.shape == (len(ALL),)
    assert storage.stats.requests == 1  # nothing but the root so far
    assert counts[1234] == ALL[1234] and counts[-1] == ALL[-1]
    assert storage.stats.by_key_kind["record_rows"] == 2  # their two index chunks
    assert np.array_equal(counts[100:1900], ALL[100:1900])
    picks = np.asarray([4000, 3, 1025, 3, 2999])
    assert np.array_equal(counts[picks], ALL[picks])
    assert np.array_equal(np.asarray(counts), ALL)
    assert counts.tolist() == ALL.tolist()
    assert list(counts) == ALL.tolist()
    with pytest.raises(OutOfRangeError):
        counts[len(ALL)]


def test_locate_frames_maps_global_frames_like_a_numpy_searchsorted(bulk: str) -> None:
    storage = small_cache(bulk)
    starts = np.concatenate([[0], np.cumsum(ALL)])
    assert storage.total_frames == int(starts[-1])
    rng = np.random.default_rng(23)
    positions = np.concatenate(
        [rng.integers(0, int(starts[-1]), size=500), starts[:-1][:50], starts[1:] - 1]
    )
    records, within = storage.locate_frames(positions)
    want = np.searchsorted(starts, positions, side="right") - 1
    assert np.array_equal(records, want)
    assert np.array_equal(within, positions - starts[want])
    with pytest.raises(OutOfRangeError, match="outside the dataset's"):
        storage.locate_frames([int(starts[-1])])


def test_the_histogram_counts_records_and_windows_of_any_length(bulk: str) -> None:
    storage = small_cache(bulk)
    values, records = storage.frame_histogram()
    want_values, want_records = np.unique(ALL, return_counts=True)
    assert np.array_equal(values, want_values) and np.array_equal(records, want_records)
    for frames in (1, 7, 40, 41):
        eligible = ALL[frames <= ALL]
        assert storage.count_windows(frames) == (eligible.size, int((eligible - frames + 1).sum()))
    # the histogram and the cumulative index are read once: a few requests, no record_rows
    assert "record_rows" not in storage.stats.by_key_kind


def test_uniform_window_sampling_by_rejection_reads_no_whole_index(bulk: str) -> None:
    """What a sampler does over 10^8 records, here over 4,300: draw global frames, keep
    those whose window fits in its record. Every valid (record, start) pair is drawn with
    equal probability; the bytes read are those of the chunks touched, not of the index."""
    storage = small_cache(bulk)
    frames = 20
    rng = np.random.default_rng(24)
    positions = rng.integers(0, storage.total_frames, size=4000)
    records, starts = storage.locate_frames(positions)
    fits = starts + frames <= ALL[records]
    records, starts = records[fits], starts[fits]
    assert (ALL[records] >= frames).all()
    _, windows = storage.count_windows(frames)
    assert fits.mean() == pytest.approx(windows / storage.total_frames, abs=0.03)
    # a record's chance is proportional to its windows (checked on the long records)
    long = np.flatnonzero(ALL >= 35)
    draws = np.bincount(records, minlength=len(ALL))[long].sum()
    share = (ALL[long] - frames + 1).sum() / windows
    assert draws / len(records) == pytest.approx(share, rel=0.15)
    assert storage.stats.bytes_by_key_kind.get("record_rows", 0) <= 2 * (PER_CHUNK * 16 + 4) * 9


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
    opened = storage._default_opening.opened.value
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


def _index_array(root: Path, name: str) -> tuple[Path, Any]:
    attributes = json.loads((root / "zarr.json").read_text())["attributes"]["rangestream"]
    schema_key = {"frame_starts": "frame_starts", "frame_histogram": "frame_histogram"}[name]
    layout = ArrayLayout.from_json(attributes["schema"][schema_key], name)
    return root / attributes["data_prefix"] / "index" / name, layout


def test_a_cumulative_index_that_disagrees_with_the_records_is_refused(tmp_path: Path) -> None:
    write_bulk(str(tmp_path / "ds"), COUNTS)
    folder, layout = _index_array(tmp_path / "ds", "frame_starts")
    starts = [*np.concatenate([[0], np.cumsum(ALL)])[::PER_CHUNK].tolist(), int(ALL.sum())]
    starts[3] += 1  # chunk 2 claims one frame more, chunk 3 one less
    (folder / "c" / "0").write_bytes(encode_block(layout, np.asarray(starts, "<i8").view("u1")))
    storage = TemporalArrayStorage(tmp_path / "ds")
    with pytest.raises(CorruptDataError, match=r"frame_starts says records \[1024, 1536\)"):
        storage.locate_frames([int(starts[2]) + 5])
    starts[3] = starts[1] - 1  # not cumulative
    (folder / "c" / "0").write_bytes(encode_block(layout, np.asarray(starts, "<i8").view("u1")))
    with pytest.raises(CorruptDataError, match="not cumulative"):
        TemporalArrayStorage(tmp_path / "ds").locate_frames([0])


def test_a_histogram_that_does_not_count_every_record_is_refused(tmp_path: Path) -> None:
    write_bulk(str(tmp_path / "ds"), COUNTS)
    folder, layout = _index_array(tmp_path / "ds", "frame_histogram")
    values, numbers = np.unique(ALL, return_counts=True)
    numbers[0] += 1
    pairs = np.stack([values, numbers], axis=1).astype("<i8")
    (folder / "c" / "0" / "0").write_bytes(encode_block(layout, pairs.view("u1")))
    with pytest.raises(CorruptDataError, match="summing to 4300 records"):
        TemporalArrayStorage(tmp_path / "ds").count_windows(3)
    document = json.loads((folder / "zarr.json").read_text())
    document["shape"][0] = 10**12  # a hostile length: refused before any allocation
    (folder / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(MetadataError, match=r"length 1000000000000 is not in \[0, 4300\]"):
        TemporalArrayStorage(tmp_path / "ds").frame_histogram()


def test_an_append_rewrites_the_cumulative_index_and_histogram_of_every_record(
    tmp_path: Path,
) -> None:
    """An append adds shards without copying the old ones; the record index, cumulative
    index and histogram of the new version cover the old records and the appended ones."""
    from support.temporal import BulkTemporalStorage

    url = str(tmp_path / "ds")
    write_bulk(url, COUNTS[:2])
    with BulkTemporalStorage(url).sync_writer(mode="append") as writer:
        writer.append(0, {"counts": COUNTS[2]})
    storage = small_cache(url)
    starts = np.concatenate([[0], np.cumsum(ALL)])
    assert len(storage) == len(ALL) and storage.total_frames == int(starts[-1])
    values, records = storage.frame_histogram()
    want_values, want_records = np.unique(ALL, return_counts=True)
    assert np.array_equal(values, want_values) and np.array_equal(records, want_records)
    positions = np.random.default_rng(27).integers(0, int(starts[-1]), size=300)
    found, within = storage.locate_frames(positions)
    want = np.searchsorted(starts, positions, side="right") - 1
    assert np.array_equal(found, want) and np.array_equal(within, positions - starts[want])
    record = len(ALL) - 5  # an appended record: its shard's frames start at 0
    got = storage.read_window(record, 0, int(ALL[record]))
    first = int(COUNTS[2][: record - 2200].sum())
    assert np.array_equal(got["x"], (np.arange(first, first + ALL[record]) % 251).astype(np.uint8))
