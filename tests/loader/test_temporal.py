from __future__ import annotations

import itertools
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location
from support.temporal import write_bulk

from rangestream import TemporalArrayStorage
from rangestream.errors import LoaderConfigError, StateError
from rangestream.io import process_io_stats
from rangestream.loader import (
    BatchIterableDataset,
    BatchOptions,
    StatefulDataLoader,
    TemporalWindowSource,
    WindowSampler,
)
from rangestream.loader.orders.window_sampler import answer

from .expected import epoch_order, flatten
from .fakes import FakeTemporalStorage

FRAME_COUNTS = [3, 10, 1, 6, 8, 2, 12, 5]  # frames >= 5: records 1, 3, 4, 6, 7
ELIGIBLE = [1, 3, 4, 6, 7]
FRAMES = 5


def windows_of(batch: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """(record, start) of each window, read back from the window's own frames."""
    return [(int(r[0]), int(f[0])) for r, f in zip(batch["record"], batch["frame"], strict=True)]


def make_temporal(
    *, rank: int = 0, world_size: int = 1, batch_size: int = 3, samples: int = 26
) -> BatchIterableDataset:
    source = TemporalWindowSource(
        FakeTemporalStorage(FRAME_COUNTS, delay=0.001), FRAMES, seed=7, samples_per_epoch=samples
    )
    options = BatchOptions(batch_size=batch_size, rank=rank, world_size=world_size,
                           drop_last=False)  # fmt: skip
    return BatchIterableDataset(source, options)


def expected_windows(epoch: int, counters: list[int]) -> list[tuple[int, int]]:
    records, starts = WindowSampler.of_counts(FRAME_COUNTS, FRAMES).draw(
        np.array(counters), seed=7, epoch=epoch
    )
    return list(zip(records.tolist(), starts.tolist(), strict=True))


def test_two_ranks_with_two_workers_draw_every_sample_of_the_epoch_once() -> None:
    per_rank = []
    for rank in range(2):
        loader = StatefulDataLoader(make_temporal(rank=rank, world_size=2), num_workers=2)
        per_rank.append([windows_of(batch) for batch in loader])
    assert [len(batches) for batches in per_rank] == [5, 5]  # ceil(26 / 6)
    steps = [flatten(step) for step in zip(*per_rank, strict=True)]
    # Counters 0..25, then 26..29 wrap around to 0..3.
    counters = [i % 26 for i in range(30)]
    assert flatten(steps) == expected_windows(0, counters)


def test_temporal_loader_resumes_with_another_world_size() -> None:
    first = StatefulDataLoader(make_temporal(world_size=1, batch_size=4), num_workers=0)
    iterator = iter(first)
    seen = [windows_of(next(iterator)) for _ in range(2)]
    state = first.state_dict()
    loaders = [
        StatefulDataLoader(make_temporal(rank=r, world_size=2), num_workers=1) for r in (0, 1)
    ]
    for loader in loaders:
        loader.load_state_dict(state)
    per_rank = [[windows_of(batch) for batch in loader] for loader in loaders]
    rest = flatten([flatten(step) for step in zip(*per_rank, strict=True)])
    assert flatten(seen) == expected_windows(0, list(range(8)))
    assert rest == expected_windows(0, list(range(8, 26)))  # 18 left: 3 steps of 6, no padding


def test_temporal_state_with_another_window_length_is_refused() -> None:
    state = StatefulDataLoader(make_temporal()).state_dict()
    other = BatchIterableDataset(
        TemporalWindowSource(FakeTemporalStorage(FRAME_COUNTS), 4, seed=7, samples_per_epoch=26),
        BatchOptions(rank=0, world_size=1),
    )
    with pytest.raises(StateError, match="frames=5"):
        StatefulDataLoader(other).load_state_dict(state)


def test_epoch_length_defaults_to_the_number_of_eligible_records() -> None:
    dataset = BatchIterableDataset(
        TemporalWindowSource(FakeTemporalStorage(FRAME_COUNTS), FRAMES),
        BatchOptions(batch_size=1, rank=0, world_size=1),
    )
    assert len(dataset) == len(ELIGIBLE)
    assert len(list(dataset)) == len(ELIGIBLE)


def test_from_storage_reads_selected_fields_of_temporal_windows() -> None:
    loader = StatefulDataLoader.from_storage(
        FakeTemporalStorage(FRAME_COUNTS),
        sequence_length=FRAMES,
        fields=["frame"],
        samples_per_epoch=6,
        batch_size=2,
        num_workers=0,
        rank=0,
        world_size=1,
    )
    batches = list(loader)
    assert len(batches) == 3
    assert all(set(batch) == {"frame"} and batch["frame"].shape == (2, FRAMES) for batch in batches)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs sequence_length"),
        ({"sequence_length": 5, "stride": 2}, "stride do"),
        ({"sequence_length": 5, "shuffle": False}, "shuffle=False"),
    ],
)
def test_from_storage_refuses_options_that_do_not_apply_to_temporal_records(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(LoaderConfigError, match=message):
        StatefulDataLoader.from_storage(
            FakeTemporalStorage(FRAME_COUNTS), rank=0, world_size=1, **options
        )


SCALE_RECORDS = 10**7


@pytest.fixture(scope="module")
def ten_million(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    path = str(tmp_path_factory.mktemp("scale") / "ds")
    counts = 1 + np.arange(SCALE_RECORDS, dtype=np.int64) % 3  # 1, 2, 3, 1, 2, 3, ...
    write_bulk(path, [counts])
    return path, counts


def _trace_memory(worker_id: int) -> None:
    tracemalloc.start()


def _with_worker_costs(samples: list[dict[str, Any]]) -> tuple[list[Any], int, int, Any]:
    held, _peak = tracemalloc.get_traced_memory()
    return samples, os.getpid(), held, process_io_stats()


class CyclicCounts:
    """The index questions of records of 1, 2, 3, 1, 2, 3, ... frames, in closed form (the
    ground truth of the scale tests: no per-record array)."""

    OFFSETS = np.asarray([0, 1, 3])  # first frame of each record of a triple

    def __init__(self, records: int) -> None:
        self.records = records

    def frame_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        per = [(self.records - j + 2) // 3 for j in range(3)]
        return np.asarray([1, 2, 3]), np.asarray(per)

    def locate_frames(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        triple, rest = np.divmod(positions, 6)
        offset = np.select([rest < 1, rest < 3], [0, 1], 2)
        return 3 * triple + offset, rest - self.OFFSETS[offset]

    def frame_counts_of(self, records: np.ndarray) -> np.ndarray:
        return 1 + records % 3

    def first_frame(self, record: int) -> int:
        return 6 * (record // 3) + int(self.OFFSETS[record % 3])


def test_a_worker_draws_windows_over_ten_million_records_without_per_record_memory(
    ten_million: tuple[str, np.ndarray],
) -> None:
    """The loader counts an epoch from the histogram alone, and a DataLoader worker draws
    800 windows of 3 frames (records of 3 frames: one in three, proposed by global frame)
    holding at most 16 MB, reading the cumulative index and the index chunks it touches,
    never the record index whole (160 MB)."""
    path, _counts = ten_million
    storage = TemporalArrayStorage(path)
    loader = StatefulDataLoader.from_storage(
        storage, _with_worker_costs, sequence_length=3, batch_size=8, num_workers=1,
        head_start=False, worker_init_fn=_trace_memory, rank=0, world_size=1,
    )  # fmt: skip
    assert len(loader) == SCALE_RECORDS // 3 // 8  # records of 3 frames, batches of 8
    assert storage.stats.by_key_kind == {"zarr.json": 2, "frame_histogram": 1}
    truth = CyclicCounts(SCALE_RECORDS)
    sampler = WindowSampler(truth.frame_histogram(), 3)
    assert sampler.proposal == "frame"
    asked: list[int] = []

    class Counting(CyclicCounts):
        def locate_frames(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            asked.append(positions.size)
            return super().locate_frames(positions)

    # a worker asks one proposal per round where the index is not in memory
    draws = sampler.draws(np.arange(800), seed=0, epoch=0, candidates=1)
    records, starts = answer(draws, Counting(SCALE_RECORDS))
    got, costs = [], []
    for batch, pid, held, stats in itertools.islice(loader, 100):
        assert pid != os.getpid()
        got.extend(window["x"].tolist() for window in batch)
        costs.append((held, stats))
    held, stats = costs[-1]
    want = [
        ((truth.first_frame(record) + start + np.arange(3)) % 251).tolist()
        for record, start in zip(records.tolist(), starts.tolist(), strict=True)
    ]
    assert got == want and (records % 3 == 2).all()
    worker = stats.by_key_kind
    assert worker["zarr.json"] == 2 and worker["frame_histogram"] == 1
    assert worker["frame_starts"] == 1
    # at most one index chunk per proposal asked about (local: several a round), read by
    # range: a fraction of the 160 MB index, in proportion to the windows drawn
    assert worker["record_rows"] <= sum(asked)  # proposals of every round, all counters
    assert stats.bytes_by_key_kind["record_rows"] < 160 * 10**6 / 4
    assert held <= 16 * 1024 * 1024


# -- real storage under the loader: persistent workers, object storage, whole records ------------
TRACKS = [6, 2, 9, 4, 12, 7, 3, 10, 5, 8]  # frames of each record, written to shards 0 and 1


def write_tracks(location: Location) -> TemporalArrayStorage:
    storage = TemporalArrayStorage(location.url, storage_options=location.storage_options)
    with storage.sync_writer() as writer:
        for record, frames in enumerate(TRACKS):
            writer.append(record % 2, {"record": np.full(frames, record, dtype=np.int64),
                                       "frame": np.arange(frames, dtype=np.int64)})  # fmt: skip
    return TemporalArrayStorage(location.url, storage_options=location.storage_options)


#: Global record order: shard 0's records, then shard 1's.
TRACK_ORDER = [*range(0, len(TRACKS), 2), *range(1, len(TRACKS), 2)]
TRACK_COUNTS = [TRACKS[r] for r in TRACK_ORDER]


def _with_io(samples: list[dict[str, Any]]) -> tuple[list[Any], int, Any]:
    return samples, os.getpid(), process_io_stats()


def test_persistent_workers_draw_every_epoch_and_a_new_epoch_opens_and_reads_nothing_again(
    location: Location,
) -> None:
    """Over local disk (sync reads) and S3 (the I/O loop): each worker opens the dataset and
    reads the histogram once for all three epochs, and each epoch's windows are the draws
    of its own epoch, read from the records they name."""
    storage = write_tracks(location)
    loader = StatefulDataLoader.from_storage(
        storage, _with_io, sequence_length=4, samples_per_epoch=12, batch_size=3,
        num_workers=2, persistent_workers=True, shuffle_seed=11, rank=0, world_size=1,
    )  # fmt: skip
    sampler = WindowSampler.of_counts(TRACK_COUNTS, 4)
    opens: list[dict[int, tuple[int, int]]] = []
    here: list[int] = []  # batches read in this process (the first epoch's head start)
    for epoch in range(3):
        windows, by_worker = [], {}
        here.append(0)
        for batch, pid, stats in loader:
            windows.extend((int(w["record"][0]), int(w["frame"][0])) for w in batch)
            for window in batch:
                assert window["frame"].tolist() == list(
                    range(window["frame"][0], window["frame"][0] + 4)
                )
            if pid == os.getpid():
                here[-1] += 1
                continue
            by_worker[pid] = (stats.by_key_kind["zarr.json"], stats.by_key_kind["frame_histogram"])
        records, starts = sampler.draw(np.arange(12), seed=11, epoch=epoch)
        ids = [TRACK_ORDER[r] for r in records.tolist()]
        assert windows == list(zip(ids, starts.tolist(), strict=True))
        opens.append(by_worker)
    assert len(opens[0]) == 2
    # local disk reads the first epoch's first batches here before the workers start;
    # the workers, kept, read every later epoch
    assert here[1:] == [0, 0] and (here[0] > 0) == (not location.is_s3)
    assert opens[0] == opens[1] == opens[2]
    assert set(opens[0].values()) == {(2, 1)}  # the root and the histogram's metadata; its data


@pytest.mark.parametrize("shuffle", [False, True])
def test_whole_records_load_in_order_or_shuffled_and_resume_exactly(
    location: Location, shuffle: bool
) -> None:
    """``TemporalRecords`` under ``from_storage``: every record once per epoch, whole, in
    storage order (or a seeded shuffle), with two workers; a state taken after two batches
    resumes with exactly the records not yet seen."""
    from rangestream import TemporalRecords

    storage = write_tracks(location)

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            TemporalRecords(storage), list, batch_size=2, shuffle=shuffle, shuffle_seed=5,
            num_workers=2, drop_last=False, rank=0, world_size=1,
        )  # fmt: skip

    def ids(batch: list[dict[str, Any]]) -> list[int]:
        for record in batch:
            frames = TRACKS[int(record["record"][0])]
            assert record["frame"].tolist() == list(range(frames))  # whole
        return [int(record["record"][0]) for record in batch]

    first = loader()
    iterator = iter(first)
    seen = [ids(next(iterator)) for _ in range(2)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    got = [r for batch in seen + [ids(batch) for batch in resumed] for r in batch]
    if shuffle:
        assert sorted(got) == sorted(TRACK_ORDER) and got != TRACK_ORDER
        assert got == [TRACK_ORDER[p] for p in epoch_order(len(TRACKS), 5, 0)]
    else:
        assert got == TRACK_ORDER


def test_a_split_loads_its_own_records_whole_or_as_windows(tmp_path: Path) -> None:
    """``train_test_split`` halves load whole (only their records) or as random windows of
    their records (their ``frame_counts``, drawn in memory)."""
    from rangestream import train_test_split

    storage = write_tracks(Location(str(tmp_path / "ds"), {}))
    train, test = train_test_split(storage, [0.6, 0.4], seed=2)
    train_ids = {TRACK_ORDER[train.record_id(i)] for i in range(len(train))}
    whole = StatefulDataLoader.from_storage(
        train, list, batch_size=2, shuffle=False, num_workers=0, drop_last=False,
        rank=0, world_size=1,
    )  # fmt: skip
    assert [int(r["record"][0]) for batch in whole for r in batch] == sorted(
        train_ids, key=TRACK_ORDER.index
    )
    windows = StatefulDataLoader.from_storage(
        train, list, sequence_length=3, samples_per_epoch=30, batch_size=5, num_workers=1,
        rank=0, world_size=1,
    )  # fmt: skip
    drawn = [int(w["record"][0]) for batch in windows for w in batch]
    assert len(drawn) == 30 and set(drawn) <= train_ids
    assert not set(drawn) & {TRACK_ORDER[test.record_id(i)] for i in range(len(test))}


def test_whole_records_refuse_options_of_windows() -> None:
    from rangestream import TemporalRecords

    records = TemporalRecords.__new__(TemporalRecords)
    with pytest.raises(LoaderConfigError, match="shuffle='block'"):
        StatefulDataLoader.from_storage(records, shuffle="block", rank=0, world_size=1)
    with pytest.raises(LoaderConfigError, match="samples_per_epoch do"):
        StatefulDataLoader.from_storage(records, samples_per_epoch=3, rank=0, world_size=1)


def test_a_mixture_of_splits_draws_windows_of_each_in_proportion(tmp_path: Path) -> None:
    """Two splits of one dataset mixed 3:1 as windows: every window comes from its own
    split's records, and the counts per source are the mixture's."""
    from rangestream import train_test_split

    storage = write_tracks(Location(str(tmp_path / "ds"), {}))
    first, second = train_test_split(storage, [0.5, 0.5], seed=4)
    ids = [{TRACK_ORDER[s.record_id(i)] for i in range(len(s))} for s in (first, second)]
    loader = StatefulDataLoader.from_storages(
        {first: 3.0, second: 1.0}, _with_io, names={first: "a", second: "b"},
        sequence_length=2, num_samples=40, batch_size=4, num_workers=0, rank=0, world_size=1,
    )  # fmt: skip
    drawn = [int(w["record"][0]) for batch, _pid, _io in loader for w in batch]
    assert len(drawn) == 40
    assert sum(r in ids[0] for r in drawn) == 30 and sum(r in ids[1] for r in drawn) == 10
