"""TemporalRecords: whole records by index, slice and iteration; readers with read_many;
seeded splits that keep the temporal API with their own record numbers; torch's
random_split turned into a TemporalRecords."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.s3 import Location

from rangestream import TemporalArrayStorage, TemporalRecords, train_test_split
from rangestream.errors import OutOfRangeError

FRAMES = [12, 3, 40, 7, 25, 1, 18, 9, 30, 5, 14, 2]
SHARDS = [0, 0, 1, 1, 1, 0, 2, 2, 0, 1, 2, 2]


def make(seed: int, frames: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "image": torch.from_numpy(rng.standard_normal((frames, 2, 3)).astype(np.float32)),
        "clock": np.arange(frames, dtype=np.float64) + 100 * seed,
        "valid": rng.random(frames) > 0.5,
    }


RECORDS = [make(seed, n) for seed, n in enumerate(FRAMES)]
ORDER = sorted(range(len(SHARDS)), key=lambda i: (SHARDS[i], i))  # global = shard by shard
EXPECTED = [RECORDS[i] for i in ORDER]


def write(url: str, storage_options: dict[str, Any] | None = None) -> TemporalArrayStorage:
    storage = TemporalArrayStorage(url, [["clock", "valid"]], storage_options=storage_options or {})
    with storage.sync_writer() as writer:
        for shard, record in zip(SHARDS, RECORDS, strict=True):
            writer.append(shard, record)
    return TemporalArrayStorage(url, storage_options=storage_options or {})


def assert_record(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    assert isinstance(got["image"], torch.Tensor) and got["image"].dtype == torch.float32
    assert torch.equal(got["image"], want["image"])
    for name in ("clock", "valid"):
        assert type(got[name]) is np.ndarray and got[name].dtype == want[name].dtype
        assert np.array_equal(got[name], want[name])


@pytest.fixture
def storage(location: Location) -> TemporalArrayStorage:
    return write(location.url, location.storage_options)


def test_records_by_index_slice_and_iteration_equal_what_was_written(
    storage: TemporalArrayStorage,
) -> None:
    records = TemporalRecords(storage)
    assert len(records) == len(EXPECTED)
    for index, want in enumerate(EXPECTED):
        assert_record(records[index], want)
    assert_record(records[-1], EXPECTED[-1])
    for got, want in zip(records[2:9:3], EXPECTED[2:9:3], strict=True):
        assert_record(got, want)
    for got, want in zip(records, EXPECTED, strict=True):
        assert_record(got, want)
    with pytest.raises(OutOfRangeError):
        records[len(EXPECTED)]


def test_the_storage_itself_indexes_and_iterates_whole_records(
    storage: TemporalArrayStorage,
) -> None:
    assert_record(storage[4], EXPECTED[4])
    got = list(storage)
    assert len(got) == len(EXPECTED)
    for record, want in zip(got, EXPECTED, strict=True):
        assert_record(record, want)


def test_read_many_reads_adjacent_records_of_a_shard_as_one_range_per_group(
    tmp_path: Path,
) -> None:
    storage = write(str(tmp_path / "ds"))
    with TemporalRecords(storage).sync_reader() as reader:
        reader.read_many([0])  # opens, reads the index
        before = reader.stats.copy()
        got = reader.read_many([1, 2, 3])  # shard 0's records 1..3: back to back
        spent = reader.stats - before
    for record, index in zip(got, [1, 2, 3], strict=True):
        assert_record(record, EXPECTED[index])
    assert spent.by_key_kind == {"image": 1, "group_1": 1}


def test_async_reader_reads_records_and_slices(storage: TemporalArrayStorage) -> None:
    async def main() -> tuple[Any, list[Any], list[Any]]:
        async with TemporalRecords(storage).async_reader() as reader:
            return await reader[5], await reader[1:4], await reader.read_many([11, 0, 6])

    one, some, many = asyncio.run(main())
    assert_record(one, EXPECTED[5])
    for got, want in zip(some, EXPECTED[1:4], strict=True):
        assert_record(got, want)
    for got, index in zip(many, [11, 0, 6], strict=True):
        assert_record(got, EXPECTED[index])


def test_fields_select_what_records_return(tmp_path: Path) -> None:
    storage = write(str(tmp_path / "ds"))
    records = TemporalRecords(storage, fields=["valid", "image"])
    got = records[3]
    assert list(got) == ["valid", "image"]
    assert np.array_equal(got["valid"], EXPECTED[3]["valid"])


def test_seeded_splits_are_disjoint_sized_and_keep_the_temporal_api(
    storage: TemporalArrayStorage,
) -> None:
    train, test = train_test_split(storage, splits=[0.5, 0.25], seed=7)
    assert (len(train), len(test)) == (6, 3)
    train_ids = [train.record_id(i) for i in range(len(train))]
    test_ids = [test.record_id(i) for i in range(len(test))]
    assert not set(train_ids) & set(test_ids)
    assert train_ids == sorted(train_ids)  # in the storage's order
    # the same seed draws the same splits; another seed (here) others
    again = train_test_split(TemporalRecords(storage), splits=[0.5, 0.25], seed=7)
    assert [again[0].record_id(i) for i in range(6)] == train_ids
    other = train_test_split(storage, splits=[0.5, 0.25], seed=8)
    assert [other[0].record_id(i) for i in range(6)] != train_ids
    # record i of a split is record ids[i] of the dataset, for windows and frame counts
    counts = [len(EXPECTED[r]["clock"]) for r in test_ids]
    assert test.frame_counts.tolist() == counts
    for index, record in enumerate(test_ids):
        frames = counts[index]
        window = test.read_window(index, frames - 1, 1, ["clock", "image"])
        assert np.array_equal(window["clock"], EXPECTED[record]["clock"][-1:])
        assert torch.equal(window["image"], EXPECTED[record]["image"][-1:])
        awaited = asyncio.run(test.aread_window(index, 0, frames, max_concurrent_reads=2))
        assert_record(awaited, EXPECTED[record])
        assert_record(test[index], EXPECTED[record])


def test_splits_of_all_records_cover_each_record_exactly_once(
    storage: TemporalArrayStorage,
) -> None:
    parts = train_test_split(storage, splits=[0.25, 0.5, 0.25], seed=3)
    ids = sorted(p.record_id(i) for p in parts for i in range(len(p)))
    assert ids == list(range(len(EXPECTED)))
    nested = train_test_split(parts[1], splits=[0.5, 0.5], seed=1)  # a split of a split
    inner = sorted(p.record_id(i) for p in nested for i in range(len(p)))
    assert inner == sorted(parts[1].record_id(i) for i in range(len(parts[1])))


@pytest.mark.parametrize(
    "splits", [[0.7, 0.5], [0.0, 0.5], [-0.1], [1.5], "0.5", [], [True], [float("nan")]]
)
def test_bad_split_fractions_are_refused(tmp_path: Path, splits: Any) -> None:
    storage = TemporalArrayStorage(tmp_path / "unused")
    with pytest.raises(ValueError, match="splits"):
        train_test_split(storage, splits=splits, seed=0)


def test_torch_random_split_subsets_become_temporal_records(tmp_path: Path) -> None:
    storage = write(str(tmp_path / "ds"))
    records = TemporalRecords(storage)
    first, second = torch.utils.data.random_split(
        records, [8, 4], generator=torch.Generator().manual_seed(0)
    )
    assert_record(first[0], EXPECTED[first.indices[0]])  # torch's Subset reads records
    split = TemporalRecords.from_subset(second)
    assert [split.record_id(i) for i in range(4)] == list(second.indices)
    assert split.frame_counts.tolist() == [FRAMES[ORDER[i]] for i in second.indices]
    record = second.indices[2]
    window = split.read_window(2, 0, 1, ["valid"])
    assert np.array_equal(window["valid"], EXPECTED[record]["valid"][:1])
    from_storage = TemporalRecords.from_subset(torch.utils.data.Subset(storage, [3, 1]))
    assert_record(from_storage[0], EXPECTED[3])


def test_a_split_pickles_small_and_reads_after_unpickling(tmp_path: Path) -> None:
    storage = write(str(tmp_path / "ds"))
    (train,) = train_test_split(storage, splits=[0.5], seed=2)
    train.frame_counts  # noqa: B018 - cached in this process, not pickled
    clone = pickle.loads(pickle.dumps(train))
    assert len(pickle.dumps(train)) < 4096
    assert_record(clone[0], EXPECTED[train.record_id(0)])


def test_records_listed_twice_or_out_of_range_are_refused(tmp_path: Path) -> None:
    storage = write(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="more than once"):
        TemporalRecords(storage, [1, 2, 1])
    with pytest.raises(OutOfRangeError):
        TemporalRecords(storage, [0, -1])
    with pytest.raises(OutOfRangeError):
        TemporalRecords(storage, [0, 40])[1]
    with pytest.raises(TypeError, match="TemporalArrayStorage"):
        TemporalRecords(object())


# -- the dataset side of a whole-record loader ---------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_the_indexed_loader_iterates_whole_records_and_resumes_exactly(
    location: Location, shuffle: bool
) -> None:
    """``TemporalRecords`` is an indexed dataset like the other kinds: through the loader's
    ``IndexedSource``, every record once per epoch, in order or shuffled, and a resume from
    ``state_dict`` continues with exactly the records not yet seen."""
    from rangestream.loader import BatchIterableDataset, BatchOptions, IndexedSource

    storage = write(location.url, location.storage_options)

    def loader() -> BatchIterableDataset:
        return BatchIterableDataset(
            IndexedSource(TemporalRecords(storage), shuffle=shuffle, seed=5),
            BatchOptions(batch_size=3, rank=0, world_size=1, drop_last=False, collate_fn=list),
        )

    def clocks(batch: list[dict[str, Any]]) -> list[float]:
        return [float(record["clock"][0]) for record in batch]

    first = loader()
    iterator = iter(first)
    seen = [clocks(next(iterator)) for _ in range(2)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [clocks(batch) for batch in resumed]
    order = [float(record["clock"][0]) for record in EXPECTED]
    got = [c for batch in seen + rest for c in batch]
    if shuffle:
        assert sorted(got) == sorted(order) and got != order
    else:
        assert got == order
    for batch in seen + rest:
        assert len(batch) == 3  # 12 records, batches of 3
