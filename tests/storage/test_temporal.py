"""TemporalArrayStorage: windows and whole records against numpy ground truth, the request
contract (the first window after opening included), concurrency, cancellation, processes,
and the refusal of bad records and bad windows with nothing partial written."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from support.copies import Copies
from support.s3 import Location

from rangestream import (
    StreamNumpyFormat,
    StreamStorage,
    TemporalArrayStorage,
    set_process_max_concurrency,
)
from rangestream.errors import (
    ChecksumError,
    DatasetNotFoundError,
    InvalidRecordError,
    MetadataError,
    OutOfRangeError,
    SchemaMismatchError,
    TruncatedObjectError,
    UnknownFieldError,
    WindowError,
)
from rangestream.io import LocalStore, ObjectStore
from rangestream.io.range_reader import DEFAULT_PROCESS_MAX_CONCURRENCY
from rangestream.layout.block import ArrayLayout

GROUPS = [["clock", "valid", "pose"]]
FIELDS = ["features", "clock", "valid", "pose"]
# Which shard each record (in append order) goes to; global order is shard by shard.
SHARDS = [2, 0, 2, 5, 0, 5, 2, 0]
FRAMES = [37, 1, 250, 64, 120, 9, 300, 75]
# Small chunks and blocks, so windows cross inner chunks and blocks.
SMALL = {"chunk_bytes": 256, "block_bytes": 2048}


def make_record(seed: int, frames: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "features": rng.standard_normal((frames, 16)).astype(np.float32),
        "clock": np.arange(frames, dtype=np.float64) * 0.01 + seed,
        "valid": rng.random(frames) > 0.3,
        "pose": rng.standard_normal((frames, 7)).astype(np.float32),
    }


RECORDS = [make_record(seed, n) for seed, n in enumerate(FRAMES)]
# Global record order: shard by shard, append order within a shard.
ORDER = sorted(range(len(SHARDS)), key=lambda i: (SHARDS[i], i))
EXPECTED = [RECORDS[i] for i in ORDER]


def write(
    url: str,
    records: list[dict[str, np.ndarray]] = RECORDS,
    shards: list[int] = SHARDS,
    storage_options: dict[str, Any] | None = None,
    field_groups: Any = GROUPS,
    **options: Any,
) -> None:
    storage = TemporalArrayStorage(
        url, field_groups, storage_options=storage_options or {}, **options
    )
    with storage.sync_writer() as writer:
        for shard, record in zip(shards, records, strict=True):
            writer.append(shard, record)


def open_storage(location: Location, **options: Any) -> TemporalArrayStorage:
    return TemporalArrayStorage(location.url, storage_options=location.storage_options, **options)


def assert_window(
    got: dict[str, np.ndarray],
    record: dict[str, np.ndarray],
    start: int,
    frames: int,
    fields: Any,
    *,
    owned: bool = True,
) -> None:
    names = FIELDS if fields is None else list(fields)
    assert list(got) == names
    for name in names:
        want = record[name][start : start + frames]
        array = got[name]
        assert array.dtype == want.dtype and array.shape == want.shape, name
        assert np.array_equal(array, want), name
        if owned:  # not checkable after pickling: numpy rebuilds arrays over the pickle's buffer
            assert array.flags.owndata and array.flags.writeable and array.flags.c_contiguous


def random_windows(count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = np.random.default_rng(seed)
    windows = []
    for _ in range(count):
        record = int(rng.integers(len(EXPECTED)))
        total = FRAMES[ORDER[record]]
        frames = int(rng.integers(1, total + 1))
        start = int(rng.integers(0, total - frames + 1))
        windows.append((record, start, frames))
    return windows


SELECTIONS = [None, ["features", "pose"], ["clock"], ["pose", "valid"], ["valid", "clock", "pose"]]


# -- reading against the ground truth -----------------------------------------------------------
def test_records_come_back_whole_in_shard_order_with_their_frame_counts(
    location: Location,
) -> None:
    write(location.url, storage_options=location.storage_options, **SMALL)
    storage = open_storage(location)
    assert len(storage) == len(RECORDS)
    counts = storage.frame_counts
    assert counts.dtype == np.int64
    assert counts.tolist() == [FRAMES[i] for i in ORDER]
    assert storage.fields == FIELDS
    for index, record in enumerate(EXPECTED):
        assert_window(storage[index], record, 0, len(record["clock"]), None)
    assert_window(storage[-1], EXPECTED[-1], 0, len(EXPECTED[-1]["clock"]), None)


def test_sync_windows_of_any_fields_equal_numpy_slices(location: Location) -> None:
    write(location.url, storage_options=location.storage_options, **SMALL)
    storage = open_storage(location)
    for number, (record, start, frames) in enumerate(random_windows(60, seed=1)):
        fields = SELECTIONS[number % len(SELECTIONS)]
        got = storage.read_window(record, start, frames, fields)
        assert_window(got, EXPECTED[record], start, frames, fields)


def test_concurrent_async_windows_equal_numpy_slices(location: Location) -> None:
    write(location.url, storage_options=location.storage_options, **SMALL)
    storage = open_storage(location)
    windows = random_windows(40, seed=2)

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(
                storage.aread_window(r, s, f, SELECTIONS[n % len(SELECTIONS)])
                for n, (r, s, f) in enumerate(windows)
            )
        )

    results = asyncio.run(main())
    for number, ((record, start, frames), got) in enumerate(zip(windows, results, strict=True)):
        assert_window(got, EXPECTED[record], start, frames, SELECTIONS[number % len(SELECTIONS)])


def test_every_field_type_and_trailing_shape_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    records = []
    for frames in (5, 17):
        records.append(
            {
                "i8": rng.integers(-100, 100, size=(frames,), dtype=np.int8),
                "u16": rng.integers(0, 60000, size=(frames, 3), dtype=np.uint16),
                "f16": rng.standard_normal((frames, 2, 3)).astype(np.float16),
                "c64": (rng.standard_normal((frames, 2)) + 1j).astype(np.complex64),
                "big": rng.standard_normal((frames, 4)).astype(">f8"),
                "flag": rng.random((frames, 2)) > 0.5,
            }
        )
    groups = [["i8", "c64", "flag"], ["f16", "big"]]
    write(str(tmp_path / "ds"), records, [0, 0], field_groups=groups, chunk_bytes=64)
    storage = TemporalArrayStorage(tmp_path / "ds")
    for index, record in enumerate(records):
        got = storage[index]
        for name, want in record.items():
            assert got[name].dtype == want.dtype.newbyteorder("<"), name
            assert got[name].shape == want.shape and np.array_equal(got[name], want), name
    window = storage.read_window(1, 3, 9, ["big", "u16"])
    assert np.array_equal(window["big"], records[1]["big"][3:12])
    assert np.array_equal(window["u16"], records[1]["u16"][3:12])


def test_torch_tensors_written_come_back_as_torch_tensors_of_their_dtype(
    tmp_path: Path,
) -> None:
    import torch

    record = {
        "features": torch.arange(24, dtype=torch.float32).reshape(6, 4),
        "valid": torch.tensor([True, False, True, True, False, True]),
        "ids": torch.arange(6, dtype=torch.int64),
        "plain": np.arange(12, dtype=np.int16).reshape(6, 2),  # numpy stays numpy
    }
    write(str(tmp_path / "ds"), [record], [0], field_groups=[["valid", "ids"]])
    storage = TemporalArrayStorage(tmp_path / "ds")
    for got in (storage.read_window(0, 1, 4), asyncio.run(storage.aread_window(0, 1, 4))):
        for name in ("features", "valid", "ids"):
            tensor = record[name]
            assert isinstance(got[name], torch.Tensor), name
            assert got[name].dtype == tensor.dtype and got[name].shape == (4, *tensor.shape[1:])
            assert torch.equal(got[name], tensor[1:5]), name
        assert type(got["plain"]) is np.ndarray
        assert np.array_equal(got["plain"], record["plain"][1:5])


def test_a_torch_tensor_without_a_numpy_dtype_is_refused_by_name(tmp_path: Path) -> None:
    import torch

    storage = TemporalArrayStorage(tmp_path / "ds")
    with (
        storage.sync_writer() as writer,
        pytest.raises(InvalidRecordError, match=r"'features'.*bfloat16"),
    ):
        writer.append(0, {"features": torch.zeros((3, 2), dtype=torch.bfloat16)})


def test_fields_empty_returns_an_empty_dict_without_requests(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    before = storage.stats.copy()
    assert storage.read_window(2, 3, 4, []) == {}
    assert asyncio.run(storage.aread_window(2, 3, 4, [])) == {}
    assert (storage.stats - before).requests == 0


def test_an_empty_dataset_has_no_records(tmp_path: Path) -> None:
    with TemporalArrayStorage(tmp_path / "ds").sync_writer():
        pass
    storage = TemporalArrayStorage(tmp_path / "ds")
    assert len(storage) == 0
    assert storage.frame_counts.tolist() == []
    with pytest.raises(OutOfRangeError, match="0 records"):
        storage.read_window(0, 0, 1)


def test_group_arrays_and_the_record_index_are_zarr_arrays_zarr_python_reads(
    tmp_path: Path,
) -> None:
    write(str(tmp_path / "ds"), **SMALL)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_text())["attributes"]["rangestream"]
    prefix = tmp_path / "ds" / root["data_prefix"]
    index = zarr.open_array(prefix / "index" / "record_rows", mode="r")[:]
    assert index.shape == (len(SHARDS), 2)
    assert (index[:, 1] - index[:, 0]).tolist() == [FRAMES[i] for i in ORDER]
    record = 0
    for shard in sorted(set(SHARDS)):
        mine = [RECORDS[i] for i in range(len(SHARDS)) if SHARDS[i] == shard]
        features = zarr.open_array(prefix / "shards" / str(shard) / "features", mode="r")[:]
        group = zarr.open_array(prefix / "shards" / str(shard) / "group_1", mode="r")
        assert group.attrs["rangestream_fields"] == ["clock", "valid", "pose"]
        rows = np.ascontiguousarray(group[:]).view(
            np.dtype([("clock", "<f8"), ("valid", "?"), ("pose", "<f4", (7,))])
        )[:, 0]
        assert features.dtype == np.float32
        assert len(features) == len(rows) == index[record + len(mine) - 1, 1]
        used = np.zeros(len(rows), dtype=bool)
        for expected in mine:
            first, end = index[record]
            assert np.array_equal(features[first:end], expected["features"])
            for name in ("clock", "valid", "pose"):
                assert np.array_equal(rows[name][first:end], expected[name]), name
            used[first:end] = True
            record += 1
        assert not features[~used].any() and not rows[~used].view(np.uint8).any()  # padding


# -- the request contract --------------------------------------------------------------------
def block_geometry(location: Location) -> dict[str, tuple[int, int, int]]:
    """Per array read by a features+pose window: (block rows, inner chunk rows, stored bytes
    per inner chunk), from the Zarr metadata as zarr-python reads it."""
    fs_options = location.storage_options
    root = zarr.open_group(location.url, mode="r", storage_options=fs_options or None)
    prefix = root.attrs["rangestream"]["data_prefix"]
    geometry = {}
    for array in ("features", "group_1"):
        stored = zarr.open_array(
            f"{location.url}/{prefix}/shards/{SHARDS[0]}/{array}",
            mode="r",
            storage_options=fs_options or None,
        )
        block_rows, chunk_rows = stored.shards[0], stored.chunks[0]  # type: ignore[index]
        row_nbytes = stored.dtype.itemsize * int(np.prod(stored.shape[1:]))
        geometry[array] = (block_rows, chunk_rows, chunk_rows * row_nbytes + 4)
    return geometry


def record_first_rows(location: Location) -> np.ndarray:
    """The row where each record starts in its shard's group arrays, as zarr-python reads it."""
    fs_options = location.storage_options or None
    root = zarr.open_group(location.url, mode="r", storage_options=fs_options)
    prefix = root.attrs["rangestream"]["data_prefix"]
    index = zarr.open_array(
        f"{location.url}/{prefix}/index/record_rows", mode="r", storage_options=fs_options
    )
    return np.asarray(index[:, 0])


def expected_cost(
    geometry: dict[str, tuple[int, int, int]], offset: int, start: int, frames: int
) -> tuple[int, int]:
    """Requests and bytes a features+pose window must cost, from the stored geometry, for
    a record starting at row ``offset`` of its shard."""
    first, stop = offset + start, offset + start + frames
    requests = nbytes = 0
    for block_rows, chunk_rows, stored in geometry.values():
        for block in range(first // block_rows, (stop - 1) // block_rows + 1):
            low = max(first, block * block_rows) - block * block_rows
            high = min(stop, (block + 1) * block_rows) - block * block_rows
            requests += 1
            nbytes += ((high - 1) // chunk_rows - low // chunk_rows + 1) * stored
    return requests, nbytes


def test_opening_reads_two_objects_and_every_window_one_range_per_group(
    location: Location,
) -> None:
    write(location.url, storage_options=location.storage_options)  # default 4 MiB blocks
    storage = open_storage(location)
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    assert storage.stats.requests == 2
    geometry = block_geometry(location)
    first_rows = record_first_rows(location)
    for record, start, frames in [(4, 10, 64), *random_windows(20, seed=4)]:
        before = storage.stats.copy()
        storage.read_window(record, start, frames, ["features", "pose"])
        spent = storage.stats - before
        assert spent.requests == 2
        assert spent.by_key_kind == {"features": 1, "group_1": 1}
        offset = int(first_rows[record])
        assert (spent.requests, spent.bytes) == expected_cost(geometry, offset, start, frames)


def test_the_first_async_window_after_opening_costs_one_range_per_group(
    location: Location,
) -> None:
    write(location.url, storage_options=location.storage_options)
    storage = open_storage(location)
    got = asyncio.run(storage.aread_window(5, 100, 96, ["features", "pose"]))
    assert_window(got, EXPECTED[5], 100, 96, ["features", "pose"])
    assert storage.stats.requests == 2 + 2
    assert storage.stats.by_key_kind == {
        "zarr.json": 1,
        "record_rows": 1,
        "features": 1,
        "group_1": 1,
    }


def test_a_window_costs_one_more_range_per_block_boundary_it_crosses(tmp_path: Path) -> None:
    location = Location(str(tmp_path / "ds"), {})
    write(location.url, **SMALL)
    storage = open_storage(location)
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    geometry = block_geometry(location)
    first_rows = record_first_rows(location)
    crossed = 0
    for record, start, frames in random_windows(40, seed=5):
        before = storage.stats.copy()
        storage.read_window(record, start, frames, ["features", "pose"])
        spent = storage.stats - before
        expected = expected_cost(geometry, int(first_rows[record]), start, frames)
        assert (spent.requests, spent.bytes) == expected
        crossed += expected[0] > 2
    assert crossed > 10  # the small blocks did make windows cross


def test_records_that_fit_in_a_block_never_straddle_one(tmp_path: Path) -> None:
    """The writer starts a record that would cross a block boundary at the boundary (zero
    rows in between), so its windows are one range per group; a record longer than a block
    is not padded. SMALL blocks: both groups' blocks are 28 rows here."""
    rng = np.random.default_rng(11)
    frames = [int(n) for n in rng.integers(1, 29, 60)] + [40, 3, 57]
    records = [make_record(100 + i, n) for i, n in enumerate(frames)]
    location = Location(str(tmp_path / "ds"), {})
    write(location.url, records, [SHARDS[0]] * len(records), **SMALL)
    geometry = block_geometry(location)
    assert {rows for rows, _, _ in geometry.values()} == {28}
    first_rows = record_first_rows(location)
    end = 0
    for record, n in enumerate(frames):  # padding only where a record would cross a block
        used = end % 28
        pad = 28 - used if used and n <= 28 and used + n > 28 else 0
        assert first_rows[record] == end + pad, record
        end += pad + n
    assert int(first_rows[-1]) + frames[-1] > sum(frames)  # there was padding
    storage = open_storage(location)
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    for record, n in enumerate(frames):
        before = storage.stats.copy()
        got = storage.read_window(record, 0, n, ["features", "pose"])
        assert_window(got, records[record], 0, n, ["features", "pose"])
        spent = storage.stats - before
        if n <= 28:
            assert spent.requests == 2, (record, n, int(first_rows[record]))
        else:
            assert spent.requests > 2  # crosses wherever it starts
        assert (spent.requests, spent.bytes) == expected_cost(
            geometry, int(first_rows[record]), 0, n
        )


def test_without_dense_chunks_each_block_index_is_fetched_once_then_cached(
    tmp_path: Path,
) -> None:
    write(str(tmp_path / "ds"), dense_chunks=False)
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    assert storage.stats.requests == 3  # root, index block's chunk index, index data
    before = storage.stats.copy()
    assert_window(storage.read_window(6, 10, 50, ["features", "pose"]), EXPECTED[6], 10, 50,
                  ["features", "pose"])  # fmt: skip
    assert (storage.stats - before).requests == 4  # two chunk indexes, two ranges
    before = storage.stats.copy()
    assert_window(storage.read_window(7, 0, 9, ["pose"]), EXPECTED[7], 0, 9, ["pose"])
    assert (storage.stats - before).requests == 1


def test_a_corrupted_chunk_is_named_by_the_windows_that_read_it(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"), **SMALL)  # features: 4 rows (256 B + 4 B crc) per inner chunk
    root = json.loads((tmp_path / "ds" / "zarr.json").read_text())["attributes"]["rangestream"]
    block = tmp_path / "ds" / root["data_prefix"] / "shards" / "0" / "features" / "c" / "0" / "0"
    data = bytearray(block.read_bytes())
    data[2 * 260 + 77] ^= 0xFF  # inner chunk 2: rows 8..11 of shard 0
    block.write_bytes(bytes(data))
    storage = TemporalArrayStorage(tmp_path / "ds")
    # EXPECTED[1] is shard 0's second record: its frames start at shard row 1
    with pytest.raises(ChecksumError, match=r"features/c/0/0 .*inner chunk 2 of the block"):
        storage.read_window(1, 0, 20, ["features"])  # rows 1..20: chunks 0..5
    with pytest.raises(ChecksumError, match="inner chunk 2"):
        asyncio.run(storage.aread_window(1, 5, 4, ["features", "pose"]))
    untouched = storage.read_window(1, 12, 10, ["features"])  # rows 13..22: chunks 3..5
    assert_window(untouched, EXPECTED[1], 12, 10, ["features"])
    unchecked = TemporalArrayStorage(tmp_path / "ds", verify_checksums=False)
    assert not np.array_equal(
        unchecked.read_window(1, 0, 20, ["features"])["features"], EXPECTED[1]["features"][:20]
    )


# -- concurrency and cancellation ------------------------------------------------------------
class CountingStore(LocalStore):
    """A local store whose async range reads wait (a delay or a gate) and count in flight."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.in_flight = 0
        self.peak = 0
        self.delay = 0.02
        self.gate: asyncio.Event | None = None

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(self.delay)
            return await super().get_range(key, start, end)
        finally:
            self.in_flight -= 1


class CountingStorage(TemporalArrayStorage):
    def new_store(self) -> ObjectStore:
        self.store = CountingStore(self.url)
        return self.store


@pytest.fixture
def ungrouped(tmp_path: Path) -> CountingStorage:
    """Every field alone: a window of all four fields is four ranges."""
    write(str(tmp_path / "ds"), field_groups=None)
    storage = CountingStorage(str(tmp_path / "ds"))
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    return storage


def test_max_concurrent_reads_bounds_the_requests_of_one_call(ungrouped: CountingStorage) -> None:
    asyncio.run(ungrouped.aread_window(6, 0, 50, max_concurrent_reads=2))
    assert ungrouped.store.peak == 2
    ungrouped.store.peak = 0
    got = asyncio.run(ungrouped.aread_window(6, 0, 50, max_concurrent_reads=8))
    assert ungrouped.store.peak == 4
    assert_window(got, EXPECTED[6], 0, 50, None)


def test_the_process_bound_holds_across_concurrent_calls(ungrouped: CountingStorage) -> None:
    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(ungrouped.aread_window(r, s, f, ["pose"]) for r, s, f in random_windows(12, 6))
        )

    set_process_max_concurrency(3)
    try:
        results = asyncio.run(main())
    finally:
        set_process_max_concurrency(DEFAULT_PROCESS_MAX_CONCURRENCY)
    assert ungrouped.store.peak == 3
    for (record, start, frames), got in zip(random_windows(12, 6), results, strict=True):
        assert_window(got, EXPECTED[record], start, frames, ["pose"])


def test_cancelling_a_call_drains_its_requests_and_spares_the_others(
    ungrouped: CountingStorage,
) -> None:
    store = ungrouped.store

    async def main() -> None:
        store.gate = asyncio.Event()
        victim = asyncio.create_task(ungrouped.aread_window(6, 0, 50))
        survivor = asyncio.create_task(ungrouped.aread_window(2, 5, 30, ["pose"]))
        while store.in_flight < 5:
            await asyncio.sleep(0.001)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        assert store.in_flight == 1  # the victim's four requests are gone, not orphaned
        store.gate.set()
        assert_window(await survivor, EXPECTED[2], 5, 30, ["pose"])
        assert store.in_flight == 0

    asyncio.run(main())
    store.gate = None
    assert_window(asyncio.run(ungrouped.aread_window(6, 0, 50)), EXPECTED[6], 0, 50, None)


def test_async_windows_work_from_several_event_loops_in_turn(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    for record in range(3):
        got = asyncio.run(storage.aread_window(record, 0, 1, ["clock"]))
        assert_window(got, EXPECTED[record], 0, 1, ["clock"])
    assert storage.stats.by_key_kind["zarr.json"] == 1  # opened once per process


def test_closing_releases_connections_and_later_reads_reopen_them(location: Location) -> None:
    write(location.url, storage_options=location.storage_options)
    storage = open_storage(location)
    storage.close()  # never opened: nothing to release
    assert_window(storage.read_window(4, 3, 5), EXPECTED[4], 3, 5, None)
    storage.close()
    assert_window(storage.read_window(4, 9, 5), EXPECTED[4], 9, 5, None)

    async def main() -> dict[str, np.ndarray]:
        got = await storage.aread_window(5, 1, 2, ["pose"])
        await storage.aclose()
        return got

    assert_window(asyncio.run(main()), EXPECTED[5], 1, 2, ["pose"])
    assert storage.stats.by_key_kind["zarr.json"] == 1  # closing kept the frame index


# -- processes -----------------------------------------------------------------------------------
_INHERITED: TemporalArrayStorage | None = None


def _read_in_child(window: tuple[int, int, int]) -> dict[str, np.ndarray]:
    assert _INHERITED is not None
    return _INHERITED.read_window(*window, ["features", "clock"])


def test_a_storage_used_in_the_parent_reads_correctly_in_forked_children(
    tmp_path: Path,
) -> None:
    global _INHERITED
    write(str(tmp_path / "ds"), **SMALL)
    _INHERITED = TemporalArrayStorage(tmp_path / "ds")
    _INHERITED.read_window(3, 0, 2)  # parent opened files and loaded the index
    windows = random_windows(6, seed=7)
    context = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            results = list(pool.map(_read_in_child, windows))
    finally:
        _INHERITED = None
    for (record, start, frames), got in zip(windows, results, strict=True):
        assert_window(got, EXPECTED[record], start, frames, ["features", "clock"], owned=False)


def test_a_used_storage_pickles_small_and_reads_after_unpickling(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.read_window(5, 0, 300)
    payload = pickle.dumps(storage)
    assert len(payload) < 2048  # no manifest, index or arrays travel with it
    clone = pickle.loads(payload)
    assert clone.stats.requests == 0
    assert_window(clone.read_window(5, 7, 100), EXPECTED[5], 7, 100, None)


# -- bad windows and fields ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> TemporalArrayStorage:
    path = tmp_path_factory.mktemp("written") / "ds"
    write(str(path))
    return TemporalArrayStorage(path)


@pytest.mark.parametrize("fields", [None, [], ["pose"], ["features", "valid"]],
                         ids=["all", "none", "grouped", "two-groups"])  # fmt: skip
@pytest.mark.parametrize(
    ("start", "frames"),
    [(-1, 5), (0, 38), (30, 8), (37, 1), (0, 0), (3, -2)],
    ids=["negative-start", "past-end", "overhang", "start-at-end", "zero-frames", "negative"],
)
def test_a_window_outside_the_record_is_refused_without_padding(
    written: TemporalArrayStorage, start: int, frames: int, fields: list[str] | None
) -> None:
    record = ORDER.index(0)  # 37 frames
    with pytest.raises(WindowError, match=f"record {record}"):
        written.read_window(record, start, frames, fields)
    with pytest.raises(WindowError, match=f"record {record}"):
        asyncio.run(written.aread_window(record, start, frames, fields))


@pytest.mark.parametrize("reader", ["sync", "async"])
def test_an_empty_field_selection_checks_the_window_of_an_uncached_record(
    tmp_path: Path, reader: str
) -> None:
    # A fresh storage whose record index cache holds none of the record's entries: the
    # empty selection must read the entry (one request) to know the record's frames.
    write(str(tmp_path / "ds"))
    record = ORDER.index(0)  # 37 frames

    def read(start: int, frames: int) -> dict[str, Any]:
        storage = TemporalArrayStorage(tmp_path / "ds")
        if reader == "sync":
            return storage.read_window(record, start, frames, [])
        return asyncio.run(storage.aread_window(record, start, frames, []))

    assert read(30, 7) == {}
    with pytest.raises(WindowError, match=rf"window \[30, 38\).*record {record}"):
        read(30, 8)


def test_a_record_index_outside_the_dataset_is_refused(written: TemporalArrayStorage) -> None:
    for record in (-1, len(RECORDS)):
        with pytest.raises(OutOfRangeError, match=f"record {record} is outside"):
            written.read_window(record, 0, 1)
    with pytest.raises(OutOfRangeError):
        written[len(RECORDS)]
    with pytest.raises(TypeError, match="integer"):
        written.read_window(1.5, 0, 1)  # type: ignore[arg-type]


def test_an_unknown_field_is_refused_with_the_known_ones(written: TemporalArrayStorage) -> None:
    with pytest.raises(UnknownFieldError, match=r"\['speed'\].*'features', 'clock'") as caught:
        written.read_window(0, 0, 1, ["pose", "speed"])
    assert isinstance(caught.value, KeyError)
    with pytest.raises(TypeError, match="list of field names"):
        written.read_window(0, 0, 1, "pose")  # type: ignore[arg-type]


def test_reading_with_other_field_groups_than_stored_is_refused(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    with pytest.raises(SchemaMismatchError, match="stores field groups"):
        TemporalArrayStorage(tmp_path / "ds", field_groups=[["clock", "pose"]]).frame_counts  # noqa: B018
    same = TemporalArrayStorage(tmp_path / "ds", field_groups=[["pose", "clock", "valid"]])
    assert len(same) == len(RECORDS)


def test_a_missing_dataset_or_another_kind_is_refused_by_url(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no dataset at"):
        TemporalArrayStorage(tmp_path / "nothing").frame_counts  # noqa: B018
    stream = StreamStorage(tmp_path / "stream", StreamNumpyFormat(np.dtype([("t", "<i4")])))
    with stream.sync_writer() as writer:
        writer.append(0, {"t": np.arange(3, dtype=np.int32)})
    with pytest.raises(SchemaMismatchError, match="'stream' dataset"):
        TemporalArrayStorage(tmp_path / "stream").frame_counts  # noqa: B018


# -- bad records: refused by name, nothing partial written ----------------------------------------
def _bad(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = dict(make_record(99, 10))
    for name, value in changes.items():
        if value is None:
            del record[name]
        else:
            record[name] = value
    return record


BAD_RECORDS = {
    "missing-field": (_bad(pose=None), r"missing \['pose'\]"),
    "extra-field": (_bad(speed=np.zeros(10)), r"unexpected \['speed'\]"),
    "dtype": (
        _bad(clock=np.zeros(10, np.float32)),
        "'clock': expected dtype float64, found float32",
    ),
    "trailing-shape": (_bad(pose=np.zeros((10, 6), np.float32)), r"'pose'.*\(7,\).*\(6,\)"),
    "frame-counts": (_bad(valid=np.ones(9, bool)), "same number of frames.*valid: 9"),
    "object": (_bad(clock=np.array([object()] * 10)), "'clock' has dtype object"),
    "string": (_bad(clock=np.array(["a"] * 10)), "'clock' has dtype <U1"),
    "not-an-array": (_bad(clock=range(10)), "'clock' must be a numpy array"),
    "scalar": (_bad(clock=np.array(1.0)), "'clock' is a scalar"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_bad_record_is_refused_by_name_and_writes_nothing(tmp_path: Path, case: str) -> None:
    record, message = BAD_RECORDS[case]
    storage = TemporalArrayStorage(tmp_path / "ds", field_groups=GROUPS)
    with storage.sync_writer() as writer:
        writer.append(0, RECORDS[0])
        with pytest.raises(InvalidRecordError, match=message):
            writer.append(0, record)
        writer.append(0, RECORDS[1])
    written = TemporalArrayStorage(tmp_path / "ds")
    assert written.frame_counts.tolist() == [FRAMES[0], FRAMES[1]]
    assert_window(written[1], RECORDS[1], 0, FRAMES[1], None)


def test_a_zero_frame_record_is_refused(tmp_path: Path) -> None:
    storage = TemporalArrayStorage(tmp_path / "ds")
    with storage.sync_writer() as writer, pytest.raises(InvalidRecordError, match="zero frames"):
        writer.append(0, make_record(0, 0))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({}, "at least one field"),
        ([np.zeros(3)], "mapping"),
        ({"x": np.zeros((3, 0))}, "trailing dimensions must be non-zero"),
    ],
    ids=["empty", "not-a-mapping", "zero-width"],
)
def test_a_first_record_that_cannot_define_a_schema_is_refused(
    tmp_path: Path, record: Any, message: str
) -> None:
    storage = TemporalArrayStorage(tmp_path / "ds")
    with storage.sync_writer() as writer:
        with pytest.raises(InvalidRecordError, match=message):
            writer.append(0, record)
        writer.append(0, RECORDS[0])  # the schema comes from the first good record
    assert len(TemporalArrayStorage(tmp_path / "ds")) == 1


def test_field_groups_must_name_each_field_once_and_only_fields_of_the_record(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="'pose' is listed in field_groups\\[0\\] and"):
        TemporalArrayStorage(tmp_path / "ds", field_groups=[["pose", "clock"], ["pose"]])
    storage = TemporalArrayStorage(tmp_path / "ds", field_groups=[["pose", "speed"]])
    with (
        pytest.raises(InvalidRecordError, match="'speed', which the record does not have"),
        storage.sync_writer() as writer,
    ):
        writer.append(0, RECORDS[0])
    assert not storage.exists()


def test_an_error_escaping_the_writer_commits_nothing(location: Location) -> None:
    storage = TemporalArrayStorage(location.url, storage_options=location.storage_options)
    with pytest.raises(InvalidRecordError), storage.sync_writer() as writer:
        writer.append(0, RECORDS[0])
        writer.append(1, _bad(pose=None))
    assert not storage.exists()


def test_parallel_writers_with_different_schemas_commit_nothing(tmp_path: Path) -> None:
    storage = TemporalArrayStorage(tmp_path / "ds", field_groups=GROUPS)
    session = storage.parallel_write()
    with session.sync_writer() as writer:
        writer.append(0, RECORDS[0])
    with session.sync_writer() as writer:
        writer.append(1, _bad(pose=np.zeros((10, 3), np.float32)))
    with pytest.raises(
        SchemaMismatchError, match=r"'pose'.*\(frames, [37]\) vs .*\(frames, [37]\)"
    ):
        session.commit()
    assert not storage.exists()


# -- local sync windows through the bounded mmap cache -------------------------------------------
def block_file(root: Path, shard: int, array: str, block: int) -> Path:
    attributes = json.loads((root / "zarr.json").read_text())["attributes"]["rangestream"]
    return root / attributes["data_prefix"] / "shards" / str(shard) / array / "c" / str(block) / "0"


# Layouts sized for windows of 256 frames: features rows are 64 bytes, so 32 frames (2048 B
# + 4 B crc) per inner chunk, and one block per shard: every window of the test records is
# served from a mapping. (Sized for the default 64-frame windows, chunks hold 8 frames.)
CHUNKS_OF_32 = {"window_frames": 256}
FEATURE_CHUNK_ROWS, FEATURE_STORED = 32, 32 * 64 + 4


@pytest.fixture
def no_pread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any ``pread`` of a block fail, so a passing read proves the mmap path served it."""
    original = LocalStore.get_range_sync

    def refuse_blocks(self: LocalStore, key: str, start: int, end: int) -> bytes:
        if "/features/c/" in key or "/group_1/c/" in key:  # the window arrays
            raise AssertionError(f"pread of {key}: the window did not come from a mapping")
        return original(self, key, start, end)

    monkeypatch.setattr(LocalStore, "get_range_sync", refuse_blocks)


@pytest.mark.usefixtures("no_pread")
def test_local_sync_windows_come_from_mapped_blocks_and_equal_numpy_slices(
    tmp_path: Path, copies: Copies
) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    opened_with = copies.calls
    fields_read = 0
    for fields in [*SELECTIONS, ["pose", "features", "valid"], ["valid"]]:
        for record, start, frames in random_windows(25, seed=11):
            got = storage.read_window(record, start, frames, fields)
            assert_window(got, EXPECTED[record], start, frames, fields)
            fields_read += len(got)
    assert storage.read_window(2, 0, 5, []) == {}
    # one copy per returned field: no window was copied twice or through a second path
    assert copies.calls - opened_with == (fields_read if copies.kind == "compiled" else 0)


@pytest.mark.usefixtures("no_pread", "copies")
def test_mapped_windows_of_a_field_alone_in_its_group_start_anywhere_in_a_chunk(
    tmp_path: Path,
) -> None:
    """``features`` is copied as chunk runs: every start in a chunk, every length class."""
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    storage = TemporalArrayStorage(tmp_path / "ds")
    record = ORDER.index(6)  # 300 frames, inside one block
    chunk = FEATURE_CHUNK_ROWS
    lengths = (1, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk - 1, 150)
    assert len(storage.frame_counts.tolist()) == len(EXPECTED)  # opens, reads the index
    before = storage.stats.copy()
    reads = 0
    for start in range(2 * chunk + 1):
        for frames in lengths:
            got = storage.read_window(record, start, frames, ["features"])
            assert_window(got, EXPECTED[record], start, frames, ["features"])
            got["features"][:] = 0  # owned: writing it changes nothing stored
            reads += 1
    assert_window(storage.read_window(record, 0, 300, ["features"]), EXPECTED[record], 0, 300,
                  ["features"])  # fmt: skip
    spent = storage.stats - before
    assert spent.requests == reads + 1 == spent.by_key_kind["features"]


def test_a_mapped_window_whose_later_group_falls_back_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mapped path copies and counts group by group: when a later group cannot be
    copied there (here its block is no longer mapped and its copier refuses to map it),
    the window is read by the program, and the earlier groups' counts are taken back, so
    it costs what the program alone counts."""
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    fields = ["features", "pose"]
    record = next(i for i, r in enumerate(EXPECTED) if len(r["clock"]) >= 60)
    start, frames = 5, 40
    storage.read_window(record, start, frames, fields)  # opens, caches entry and selection
    before = storage.stats.copy()
    assert_window(storage.read_window(record, start, frames, fields), EXPECTED[record], start,
                  frames, fields)  # fmt: skip
    mapped_cost = storage.stats - before
    assert mapped_cost.requests == 2  # one copy per group, counted as one request each
    before = storage.stats.copy()
    storage.read_window(record, start, frames, fields, max_concurrency=1)  # the program
    program_cost = storage.stats - before
    assert (program_cost.requests, program_cost.bytes) == (mapped_cost.requests,
                                                            mapped_cost.bytes)  # fmt: skip
    opened = storage._reader().opened
    groups = opened.selection(fields).groups
    assert len(groups) == 2
    later = groups[1][0]
    refused: list[int] = []

    def refuse(part: int, first: int, rows: int, outputs: Any) -> bool:
        refused.append(rows)
        return False

    copiers = list(opened.copiers)
    copiers[later] = refuse
    monkeypatch.setattr(opened, "copiers", copiers)
    opened._window_readers.clear()
    opened.mapped.maps.clear()  # not mapped: each group's inline try misses, copiers are asked
    before = storage.stats.copy()
    assert_window(storage.read_window(record, start, frames, fields), EXPECTED[record], start,
                  frames, fields)  # fmt: skip
    fallback_cost = storage.stats - before
    assert refused == [frames]  # the first group was copied, the second refused
    assert (fallback_cost.requests, fallback_cost.bytes) == (program_cost.requests,
                                                              program_cost.bytes)  # fmt: skip
    assert fallback_cost.by_key_kind == program_cost.by_key_kind


@pytest.mark.usefixtures("no_pread", "copies")
def test_async_local_windows_come_from_mapped_blocks_inline_or_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")

    async def windows() -> list[dict[str, np.ndarray]]:
        return [await storage.aread_window(r, s, f, ["pose", "features"]) for r, s, f in chosen]

    chosen = random_windows(10, seed=12)
    inline = asyncio.run(windows())
    monkeypatch.setattr("rangestream.storage.temporal.readers.INLINE_READ_BYTES", 0)  # threads
    threaded = asyncio.run(windows())
    for (record, start, frames), first, second in zip(chosen, inline, threaded, strict=True):
        assert_window(first, EXPECTED[record], start, frames, ["pose", "features"])
        assert_window(second, EXPECTED[record], start, frames, ["pose", "features"])


@pytest.mark.usefixtures("no_pread", "copies")
def test_a_corrupted_chunk_is_detected_on_its_first_read_from_a_mapping(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    block = block_file(tmp_path / "ds", 0, "features", 0)
    data = bytearray(block.read_bytes())
    data[FEATURE_STORED + 100] ^= 0x01  # inner chunk 1: shard 0 rows 32..63
    block.write_bytes(bytes(data))
    storage = TemporalArrayStorage(tmp_path / "ds")
    # EXPECTED[1] is shard 0's second record: its frames start at shard row 1
    with pytest.raises(ChecksumError, match=r"features/c/0/0 .*inner chunk 1 of the block"):
        storage.read_window(1, 40, 10, ["features"])  # rows 41..50: chunk 1 only
    with pytest.raises(ChecksumError, match="inner chunk 1"):  # a failed chunk is never trusted
        storage.read_window(1, 20, 30, ["features", "pose"])  # rows 21..50: chunks 0 and 1
    assert_window(storage.read_window(1, 0, 30), EXPECTED[1], 0, 30, None)  # chunk 0 is intact


@pytest.mark.usefixtures("copies")
def test_each_mapped_inner_chunk_is_verified_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rangestream.layout.checksums as checksums

    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.frame_counts.tolist()  # opens, and reads the record index whole
    checked: list[int] = []
    original = checksums.crc32c_value

    def counting(data: Any) -> int:
        checked.append(len(data))
        return original(data)

    monkeypatch.setattr(checksums, "crc32c_value", counting)
    storage.read_window(1, 40, 40, ["features"])  # rows 41..80: chunks 1 and 2
    assert checked == [FEATURE_STORED, FEATURE_STORED]
    storage.read_window(1, 35, 50, ["features"])  # rows 36..85: the same chunks
    storage.read_window(1, 70, 10, ["features"])
    assert len(checked) == 2  # trusted once verified
    storage.read_window(1, 90, 10, ["features"])  # rows 91..100: chunks 2 and 3
    assert checked == [FEATURE_STORED] * 3


@pytest.mark.usefixtures("copies")
def test_a_block_shorter_than_its_layout_fails_only_for_the_missing_chunks(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    block = block_file(tmp_path / "ds", 0, "features", 0)
    with open(block, "r+b") as handle:
        handle.truncate(2 * FEATURE_STORED)  # chunks 0 and 1 left, no chunk index
    storage = TemporalArrayStorage(tmp_path / "ds")
    assert_window(storage.read_window(1, 0, 60), EXPECTED[1], 0, 60, None)  # rows 1..60
    with pytest.raises(TruncatedObjectError) as caught:
        storage.read_window(1, 60, 10, ["features"])  # rows 61..70: chunks 1 and 2
    message = str(caught.value)
    assert str(block) in message and f"bytes [{FEATURE_STORED}, {3 * FEATURE_STORED})" in message


_MAPPED: TemporalArrayStorage | None = None


def _read_mapped_in_child(window: tuple[int, int, int]) -> dict[str, np.ndarray]:
    assert _MAPPED is not None
    return _MAPPED.read_window(*window, ["pose", "features"])


@pytest.mark.usefixtures("no_pread", "copies")
def test_a_forked_child_reads_mapped_windows_through_its_own_mappings(tmp_path: Path) -> None:
    global _MAPPED
    write(str(tmp_path / "ds"))
    _MAPPED = TemporalArrayStorage(tmp_path / "ds")
    windows = random_windows(8, seed=13)
    for window in windows:
        _MAPPED.read_window(*window, ["pose", "features"])  # the parent maps every block
    context = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            results = list(pool.map(_read_mapped_in_child, windows))
        after = [_MAPPED.read_window(*window, ["pose", "features"]) for window in windows]
    finally:
        _MAPPED = None
    for (record, start, frames), got, again in zip(windows, results, after, strict=True):
        assert_window(got, EXPECTED[record], start, frames, ["pose", "features"], owned=False)
        assert_window(again, EXPECTED[record], start, frames, ["pose", "features"])


@pytest.mark.usefixtures("no_pread", "copies")
def test_windows_starting_anywhere_in_a_block_equal_numpy_slices(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    storage = TemporalArrayStorage(tmp_path / "ds")
    rng = np.random.default_rng(14)
    for _ in range(40):  # short windows, from any row of their block
        record = int(rng.integers(len(EXPECTED)))
        total = FRAMES[ORDER[record]]
        frames = int(rng.integers(1, min(32, total) + 1))
        start = int(rng.integers(0, total - frames + 1))
        got = storage.read_window(record, start, frames, ["pose", "features", "clock"])
        assert_window(got, EXPECTED[record], start, frames, ["pose", "features", "clock"])
    # global record 5 (shard 2's third record) starts at shard row 287
    assert_window(storage.read_window(5, 100, 30), EXPECTED[5], 100, 30, None)


@pytest.mark.usefixtures("copies")
def test_threads_reading_while_the_bounded_cache_drops_blocks_get_exact_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr("rangestream.io.mapped.DEFAULT_MAX_MAPPED_FILES", 3)  # before opening
    write(str(tmp_path / "ds"), chunk_bytes=256, block_bytes=4096)  # dozens of blocks
    storage = TemporalArrayStorage(tmp_path / "ds")
    windows = random_windows(400, seed=15)

    def read(window: tuple[int, int, int]) -> dict[str, np.ndarray]:
        return storage.read_window(*window, ["features", "pose"])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read, windows))
    for (record, start, frames), got in zip(windows, results, strict=True):
        assert_window(got, EXPECTED[record], start, frames, ["features", "pose"])
    opened = storage.default_opening.opened.value
    assert opened is not None and len(opened.mapped.maps) <= 3


def test_a_dataset_of_the_older_unpadded_layout_is_refused_by_name(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"))
    root_path = tmp_path / "ds" / "zarr.json"
    root = json.loads(root_path.read_text())
    root["attributes"]["rangestream"]["schema"]["version"] = 1
    root_path.write_text(json.dumps(root))
    with pytest.raises(MetadataError, match=r"temporal schema version 1 is not supported.*rewrite"):
        TemporalArrayStorage(tmp_path / "ds").read_window(0, 0, 1)


# -- LitData's contract: argument validation, the mapped switch, errors ----------------------
def test_read_window_takes_max_concurrent_reads_or_max_concurrency(location: Location) -> None:
    write(location.url, storage_options=location.storage_options, **SMALL)
    storage = open_storage(location)
    for options in ({"max_concurrent_reads": 1}, {"max_concurrency": 3}, {}):
        got = storage.read_window(5, 17, 90, ["features", "pose"], **options)  # 300 frames
        assert_window(got, EXPECTED[5], 17, 90, ["features", "pose"])
    with pytest.raises(TypeError, match="not both"):
        storage.read_window(6, 0, 1, max_concurrency=2, max_concurrent_reads=2)


@pytest.mark.parametrize("bound", [True, 1.5, 0, -2, "4"], ids=repr)
def test_a_bound_that_is_not_a_positive_integer_is_a_value_error(
    written: TemporalArrayStorage, bound: Any
) -> None:
    with pytest.raises(ValueError, match="max_concurrent_reads must be an integer >= 1"):
        written.read_window(0, 0, 1, max_concurrent_reads=bound)
    with pytest.raises(ValueError, match="max_concurrent_reads must be an integer >= 1"):
        asyncio.run(written.aread_window(0, 0, 1, max_concurrent_reads=bound))
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        written.read_window(0, 0, 1, max_concurrency=bound)


def test_a_field_asked_for_twice_is_refused(written: TemporalArrayStorage) -> None:
    with pytest.raises(ValueError, match=r"\['valid'\] are asked for more than once"):
        written.read_window(0, 0, 1, ["valid", "pose", "valid"])
    with pytest.raises(ValueError, match="more than once"):
        asyncio.run(written.aread_window(0, 0, 1, ["clock", "clock"]))


@pytest.mark.parametrize("groups", [["clock"], "clock", [["pose"], "valid"]], ids=repr)
def test_a_string_where_a_field_group_is_expected_is_a_value_error(
    tmp_path: Path, groups: Any
) -> None:
    with pytest.raises(ValueError, match="string"):
        TemporalArrayStorage(tmp_path / "ds", field_groups=groups)


def _mapped_in_use(storage: TemporalArrayStorage) -> bool:
    opened = storage.default_opening.opened.value
    assert opened is not None
    return opened.mapped is not None


@pytest.mark.parametrize("switch", ["option", "read_options", "environment"])
def test_mapped_reads_can_be_switched_off_and_windows_come_from_pread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    from rangestream.storage.core.options import ReadOptions

    write(str(tmp_path / "ds"))
    preads: list[str] = []
    original = LocalStore.get_range_sync

    def counting(self: LocalStore, key: str, start: int, end: int) -> bytes:
        preads.append(key)
        return original(self, key, start, end)

    monkeypatch.setattr(LocalStore, "get_range_sync", counting)
    if switch == "option":
        storage = TemporalArrayStorage(tmp_path / "ds", mapped=False)
    elif switch == "read_options":
        storage = TemporalArrayStorage(tmp_path / "ds", read_options=ReadOptions(mapped=False))
    else:
        monkeypatch.setenv("RANGESTREAM_MAPPED_READS", "0")
        storage = TemporalArrayStorage(tmp_path / "ds")
    for record, start, frames in random_windows(10, seed=31):
        assert_window(storage.read_window(record, start, frames), EXPECTED[record], start, frames,
                      None)  # fmt: skip
    assert not _mapped_in_use(storage)
    assert sum("/features/c/" in key for key in preads) == 10  # one pread per window and group
    monkeypatch.delenv("RANGESTREAM_MAPPED_READS", raising=False)
    mapped = TemporalArrayStorage(tmp_path / "ds")  # the default maps blocks
    mapped.read_window(0, 0, 1)
    assert _mapped_in_use(mapped)


def test_storage_errors_are_oserrors_and_keep_the_library_base() -> None:
    from rangestream.errors import (
        CorruptDataError,
        MissingObjectError,
        RangestreamError,
        StorageError,
    )

    for error in (TruncatedObjectError, ChecksumError, MissingObjectError, MetadataError,
                  CorruptDataError, StorageError):  # fmt: skip
        assert issubclass(error, OSError) and issubclass(error, RangestreamError), error
    assert issubclass(TruncatedObjectError, ValueError)  # as it was
    assert str(TruncatedObjectError("x of y")) == "x of y"  # not OSError's "[Errno ...]"


@pytest.mark.usefixtures("copies")
def test_a_truncated_block_is_caught_as_an_oserror(tmp_path: Path) -> None:
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    block = block_file(tmp_path / "ds", 0, "features", 0)
    with open(block, "r+b") as handle:
        handle.truncate(FEATURE_STORED)
    storage = TemporalArrayStorage(tmp_path / "ds")
    with pytest.raises(OSError, match="shorter than the dataset's metadata says") as caught:
        storage.read_window(1, 60, 10, ["features"])
    assert isinstance(caught.value, TruncatedObjectError)


# -- a block truncated while mapped ------------------------------------------------------------
def _truncate_while_mapped(path: str, block: str, queue: Any) -> None:
    """In a child (a SIGBUS kills it, not the test): map and verify a block through windows,
    truncate it, then read windows that lie past the cut and across it."""
    storage = TemporalArrayStorage(path)
    outcomes = []
    # shard 0 holds EXPECTED[0..2] from row 0: rows 0, 1..120, 121..195; 32 rows a chunk
    for record, start, frames in [(1, 0, 120), (2, 0, 75)]:
        storage.read_window(record, start, frames, ["features"])  # mapped, chunks verified
    with open(block, "r+b") as handle:
        handle.truncate(3 * FEATURE_STORED + 100)  # chunks 0..2 whole, chunk 3 cut
    for record, start, frames in [(2, 10, 10), (1, 95, 20), (1, 0, 60)]:
        try:
            got = storage.read_window(record, start, frames, ["features"])
        except TruncatedObjectError as error:
            outcomes.append(("truncated", str(error)))
        else:
            want = EXPECTED[record]["features"][start : start + frames]
            outcomes.append(("equal" if np.array_equal(got["features"], want) else "wrong", ""))
    queue.put(outcomes)


def test_a_block_truncated_while_mapped_raises_instead_of_sigbus_or_zeros(
    tmp_path: Path, copies: Copies
) -> None:
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    block = block_file(tmp_path / "ds", 0, "features", 0)
    assert block.stat().st_size > 3 * 4096  # pages past the cut fault when touched
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(
        target=_truncate_while_mapped, args=(str(tmp_path / "ds"), str(block), queue)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0, f"the reader died (exit code {child.exitcode}, -7 is SIGBUS)"
    past, across, before = queue.get(timeout=5)
    # rows 131..140: chunk 4, in a page wholly past the new end (SIGBUS when touched)
    assert past[0] == "truncated" and str(block) in past[1]
    # rows 96..115: chunk 3, verified before the cut, now past the end in its last page
    # (whose bytes past the end read as zeros)
    assert across[0] == "truncated"
    assert before == ("equal", "")  # rows 1..60 are still there and still read


def test_compiled_windows_ask_the_file_size_only_in_a_blocks_last_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled copier guards against truncation with a fault handler and one byte read
    past the piece, not a system call per window: the size is asked only where no page
    follows the piece in the mapping (and by the numpy copier, which cannot guard)."""
    import rangestream.io.mapped as mapped_files
    from rangestream.layout import copy as row_copy

    assert row_copy.compiled()
    from rangestream.layout import _chunked

    assert _chunked.GUARDS_FAULTS == 1
    # Format 2 stores an array that fits in one block as a block of its own size, whose
    # small chunk index ends in the pieces' last page (the size is then asked, rightly);
    # kept at the full grid here, every piece has a page of chunk index after it.
    monkeypatch.setattr(ArrayLayout, "stored_for", lambda self, length: self)
    write(str(tmp_path / "ds"), **CHUNKS_OF_32)
    asked: list[int] = []
    original = mapped_files.map_file

    def counting(path: str, root: str, units: int = 0) -> Any:
        found = original(path, root, units)
        size_now = found.live_size

        def live_size() -> int:
            asked.append(1)
            return size_now()

        found.live_size = live_size
        return found

    monkeypatch.setattr(mapped_files, "map_file", counting)
    storage = TemporalArrayStorage(tmp_path / "ds")
    for record in range(len(EXPECTED)):  # every chunk read once, so verified (the size is
        storage.read_window(record, 0, FRAMES[ORDER[record]], ["features"])  # asked then)
    asked.clear()
    # a block's chunk index follows its chunks, so a page follows every piece: no size asked
    for record, start, frames in random_windows(50, seed=41):
        assert_window(storage.read_window(record, start, frames, ["features"]),
                      EXPECTED[record], start, frames, ["features"])  # fmt: skip
    assert asked == []
    # blocks smaller than a page: every piece ends in the last page, where a cut leaves
    # zeros rather than a fault: the size is asked, once per piece
    write(str(tmp_path / "small"), **SMALL)
    small = TemporalArrayStorage(tmp_path / "small")
    small.read_window(1, 0, 120, ["features"])  # verifies record 1's chunks
    asked.clear()
    for start in (0, 50, 119):  # one frame: one piece of one block
        assert_window(small.read_window(1, start, 1, ["features"]), EXPECTED[1], start, 1,
                      ["features"])  # fmt: skip
    assert asked == [1, 1, 1]
