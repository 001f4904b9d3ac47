from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed
from support.s3 import Location

from rangestream import (
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
)
from rangestream.errors import LoaderConfigError, StateError
from rangestream.io import process_io_stats
from rangestream.loader import (
    DEFAULT_PREFETCH,
    Pad,
    PadCollate,
    StatefulDataLoader,
    WindowSampler,
    stack_collate,
)
from rangestream.loader.reading.sequential import STRETCH_READ_BYTES

from .expected import epoch_order, expected_global_batches, expected_rank_batches, flatten
from .fakes import (
    FakeDocumentDataset,
    FakeDocumentStorage,
    FakeStreamDataset,
    FakeStreamStorage,
    indexed_batches,
    positions_of,
    run_training_with_checkpoints,
)

SEQUENCE_LENGTH = 4
SEED = 5


def make_loader(
    num_windows: int,
    *,
    batch_size: int = 4,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    drop_last: bool = False,
    shuffle: bool = True,
    seed: int = SEED,
    run_steps: int | None = None,
    **kwargs: Any,
) -> StatefulDataLoader:
    """A loader over fake windows; ``run_steps`` makes the windows report a size for which
    a sequential run is exactly that many batches (see ``STRETCH_READ_BYTES``)."""
    span = None if run_steps is None else STRETCH_READ_BYTES // (run_steps * batch_size)
    windows = FakeStreamDataset(
        FakeStreamStorage(num_windows * SEQUENCE_LENGTH), SEQUENCE_LENGTH, span_bytes=span
    )
    dataset = indexed_batches(
        windows,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        prefetch=DEFAULT_PREFETCH if run_steps is None else 2 * run_steps * batch_size,
    )
    return StatefulDataLoader(dataset, num_workers=num_workers, **kwargs)


def epoch_batches(loader: StatefulDataLoader) -> list[list[int]]:
    return [positions_of(batch) for batch in loader]


def ranks_epoch(world_size: int, **options: Any) -> list[list[list[int]]]:
    """One epoch of every rank (each rank's own loader, as separate processes would have)."""
    return [
        epoch_batches(make_loader(rank=rank, world_size=world_size, **options))
        for rank in range(world_size)
    ]


@pytest.fixture
def fake_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve from_storage with the fake datasets in place of rangestream.dataset's."""
    monkeypatch.setattr("rangestream.dataset.StreamDataset", FakeStreamDataset, raising=False)
    monkeypatch.setattr("rangestream.dataset.DocumentDataset", FakeDocumentDataset, raising=False)


# -- coverage of an epoch ----------------------------------------------------------------


def test_every_position_is_yielded_once_per_epoch_across_two_ranks_and_two_workers() -> None:
    loaders = [make_loader(40, rank=r, world_size=2, num_workers=2) for r in range(2)]
    for epoch in range(2):
        per_rank = [epoch_batches(loader) for loader in loaders]
        assert [len(batches) for batches in per_rank] == [5, 5]
        positions = flatten(per_rank[0]) + flatten(per_rank[1])
        assert sorted(positions) == list(range(40)), f"epoch {epoch}"


def test_drop_last_drops_the_same_tail_on_every_rank_of_an_uneven_epoch() -> None:
    per_rank = ranks_epoch(2, num_windows=45, num_workers=2, drop_last=True)
    assert [len(batches) for batches in per_rank] == [5, 5]
    positions = flatten(per_rank[0]) + flatten(per_rank[1])
    order = epoch_order(45, SEED, 0)
    assert len(set(positions)) == 40
    assert set(positions) == set(order[:40])


def test_without_drop_last_every_rank_steps_together_and_the_padding_repeats_the_first() -> None:
    per_rank = ranks_epoch(2, num_windows=45, num_workers=2, drop_last=False)
    assert [len(batches) for batches in per_rank] == [6, 6]
    counts = Counter(flatten(per_rank[0]) + flatten(per_rank[1]))
    order = epoch_order(45, SEED, 0)
    assert set(counts) == set(range(45))
    assert sorted(p for p, c in counts.items() if c == 2) == sorted(order[:3])
    assert max(counts.values()) == 2


# -- shuffle and epochs ------------------------------------------------------------------


def test_shuffle_is_deterministic_per_seed_and_epoch_and_differs_between_epochs() -> None:
    first, second = make_loader(32), make_loader(32)
    first_epochs = [flatten(epoch_batches(first)) for _ in range(2)]
    second_epochs = [flatten(epoch_batches(second)) for _ in range(2)]
    assert first_epochs == second_epochs
    assert first_epochs[0] != first_epochs[1]
    assert first_epochs == [epoch_order(32, SEED, 0), epoch_order(32, SEED, 1)]
    assert flatten(epoch_batches(make_loader(32, seed=SEED + 1))) != first_epochs[0]


def test_without_shuffle_batches_follow_storage_order_every_epoch() -> None:
    loader = make_loader(10, shuffle=False)
    assert epoch_batches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert epoch_batches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


def test_finishing_a_loop_starts_the_next_epoch_and_breaking_keeps_the_position() -> None:
    loader = make_loader(16)
    for index, _batch in enumerate(loader):
        if index == 1:
            break
    assert (loader.epoch, loader.consumed_samples) == (0, 8)
    assert flatten(epoch_batches(loader)) == epoch_order(16, SEED, 0)[8:]
    assert (loader.epoch, loader.consumed_samples) == (1, 0)


def test_set_epoch_restarts_only_when_the_epoch_changes() -> None:
    loader = make_loader(16)
    next(iter(loader))
    loader.set_epoch(0)
    assert loader.consumed_samples == 4
    loader.set_epoch(3)
    assert flatten(epoch_batches(loader)) == epoch_order(16, SEED, 3)


def test_an_iterator_superseded_by_a_new_one_refuses_to_continue() -> None:
    loader = make_loader(16)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(StateError, match="superseded"):
        next(old)
    assert positions_of(next(new)) == epoch_order(16, SEED, 0)[4:8]


def test_len_is_the_number_of_batches_per_epoch_on_this_rank() -> None:
    assert len(make_loader(45, world_size=2, drop_last=False)) == 6
    assert len(make_loader(45, world_size=2, drop_last=True)) == 5


# -- runs of consecutive steps per worker (sequential order) -----------------------------


def pids_of(batch: dict[str, Any]) -> set[int]:
    return set(batch["pid"].tolist())


def test_sequential_workers_build_runs_of_steps_and_the_loader_restores_step_order() -> None:
    loader = make_loader(90, shuffle=False, num_workers=2, run_steps=3)
    batches = list(loader)
    # 90 windows, batches of 4, padded by wrapping: 23 steps; a lead-in of one step per
    # worker, then runs of 3 dealt to the 2 workers
    assert [positions_of(b) for b in batches] == expected_rank_batches(
        list(range(90)), batch_size=4, world_size=1, rank=0, drop_last=False
    )
    readers = [pids_of(batch) for batch in batches]
    assert all(len(pids) == 1 for pids in readers)
    first, second = readers[0], readers[1]
    assert first != second
    assert readers == [first, second] + ([first] * 3 + [second] * 3) * 3 + [first] * 3


def test_a_worker_reads_each_run_of_batches_with_one_read_many() -> None:
    loader = make_loader(90, shuffle=False, num_workers=0, run_steps=3)
    list(loader)
    fake = loader.dataset.source.dataset
    assert isinstance(fake, FakeStreamDataset)
    # the lead-in step alone, then 22 steps in runs of 3 batches of 4 windows
    assert fake.stats.read_many_sizes == [4] + [12] * 7 + [4]


def test_shuffled_or_untagged_multi_worker_reads_keep_one_step_per_run() -> None:
    shuffled = make_loader(40, num_workers=0, run_steps=3)
    list(shuffled)
    assert shuffled.dataset.source.dataset.stats.read_many_sizes == [4] * 10  # type: ignore[attr-defined]
    # a plain DataLoader does not re-sort: its workers take single steps in round robin
    dataset = make_loader(40, shuffle=False, run_steps=3).dataset
    dataset.tag_steps(False)
    plain = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert [positions_of(b) for b in plain] == [list(range(i, i + 4)) for i in range(0, 40, 4)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("first_workers", "resumed_workers"), [(2, 0), (0, 3), (2, 1), (3, 2)])
def test_a_run_stopped_inside_a_worker_run_resumes_exactly(
    first_workers: int, resumed_workers: int
) -> None:
    options: dict[str, Any] = {"shuffle": False, "run_steps": 3}
    uninterrupted = collect(make_loader(70, num_workers=first_workers, **options), epochs=2)
    interrupted = make_loader(70, num_workers=first_workers, **options)
    iterator = iter(interrupted)
    seen = [positions_of(next(iterator)) for _ in range(4)]  # stops in the middle of a run
    state = interrupted.state_dict()
    del iterator
    resumed = make_loader(70, num_workers=resumed_workers, **options)
    resumed.load_state_dict(state)
    assert seen == uninterrupted[:4]
    assert collect(resumed, epochs=2) == uninterrupted[4:]


def test_a_batch_missing_at_the_end_of_the_epoch_is_an_error_not_a_silent_skip() -> None:
    loader = make_loader(16, shuffle=False)
    loader._start_workers = lambda start: iter([(0, "a", None), (2, "c", None)])  # type: ignore[method-assign]
    iterator = iter(loader)
    assert next(iterator) == "a"
    with pytest.raises(StateError, match="without step 1"):
        next(iterator)


# -- resume ------------------------------------------------------------------------------


def collect(loader: StatefulDataLoader, epochs: int) -> list[list[int]]:
    return [batch for _ in range(epochs) for batch in epoch_batches(loader)]


@pytest.mark.parametrize(("first_workers", "resumed_workers"), [(2, 0), (0, 2), (1, 2)])
def test_resumed_run_yields_exactly_the_batches_an_uninterrupted_run_yields_next(
    first_workers: int, resumed_workers: int
) -> None:
    uninterrupted = collect(make_loader(22, num_workers=first_workers), epochs=2)
    interrupted = make_loader(22, num_workers=first_workers)
    iterator = iter(interrupted)
    seen = [positions_of(next(iterator)) for _ in range(3)]
    state = interrupted.state_dict()
    del iterator
    resumed = make_loader(22, num_workers=resumed_workers)
    resumed.load_state_dict(state)
    rest = collect(resumed, epochs=2)  # rest of epoch 0, then epoch 1
    assert seen == uninterrupted[:3]
    assert rest == uninterrupted[3:]


@pytest.fixture(scope="module")
def saved_state() -> dict[str, Any]:
    """Position after 3 steps of a 2-rank run with 4 samples per rank (24 of 45 consumed)."""
    loader = make_loader(45, rank=0, world_size=2, batch_size=4)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    return loader.state_dict()


@pytest.mark.parametrize("batch_size", [4, 3])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_resume_with_another_worker_count_world_size_or_batch_size_yields_what_remains(
    saved_state: dict[str, Any], num_workers: int, world_size: int, batch_size: int
) -> None:
    assert saved_state["consumed_samples"] == 24
    loaders = [
        make_loader(
            45, rank=r, world_size=world_size, batch_size=batch_size, num_workers=num_workers
        )
        for r in range(world_size)
    ]
    for loader in loaders:
        loader.load_state_dict(saved_state)
    yielded = {}
    for epoch, consumed in ((0, 24), (1, 0)):
        per_rank = [epoch_batches(loader) for loader in loaders]
        steps = [flatten(step) for step in zip(*per_rank, strict=True)]
        expected = expected_global_batches(
            epoch_order(45, SEED, epoch),
            batch_size=batch_size,
            world_size=world_size,
            drop_last=False,
            consumed=consumed,
        )
        assert steps == expected, f"epoch {epoch}"
        yielded[epoch] = flatten(steps)
    # The union over ranks of the rest of epoch 0 is what remained, plus wrap-around padding.
    order = epoch_order(45, SEED, 0)
    padding = len(yielded[0]) - 21
    assert 0 <= padding < batch_size * world_size
    assert Counter(yielded[0]) == Counter(order[24:] + order[:padding])


def test_resume_with_drop_last_and_a_new_batch_size_drops_only_the_new_remainder() -> None:
    first = make_loader(45, batch_size=4, drop_last=True)
    iterator = iter(first)
    seen = flatten([positions_of(next(iterator)) for _ in range(5)])
    resumed = make_loader(45, batch_size=6, drop_last=True)
    resumed.load_state_dict(first.state_dict())
    rest = flatten(epoch_batches(resumed))
    order = epoch_order(45, SEED, 0)
    assert seen == order[:20]
    assert rest == order[20:44]  # 25 remain: four batches of 6, one sample dropped


def test_a_state_saved_after_the_last_batch_resumes_with_an_empty_rest_of_epoch() -> None:
    loader = make_loader(12)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    assert (state["epoch"], state["consumed_samples"]) == (0, 12)
    resumed = make_loader(12)
    resumed.load_state_dict(state)
    assert epoch_batches(resumed) == []
    assert flatten(epoch_batches(resumed)) == epoch_order(12, SEED, 1)


def test_state_dict_is_plain_json_data_that_round_trips() -> None:
    loader = make_loader(20, rank=1, world_size=2)
    next(iter(loader))
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state == {
        "version": 1,
        "epoch": 0,
        "consumed_samples": 8,
        "seed": SEED,
        "kind": "indexed",
        "shuffle": True,
        "num_samples": 20,
        "sequence_length": 4,
        "stride": 4,
        "next_token": False,
        "batch_size": 4,
        "world_size": 2,
        "rank": 1,
        "drop_last": False,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": SEED + 1}, "seed="),
        ({"shuffle": False}, "shuffle="),
        ({"version": 99}, "version 99"),
        ({"consumed_samples": -8}, "consumed_samples"),
        ({"epoch": "1"}, "epoch"),
    ],
)
def test_a_state_that_does_not_fit_the_loader_is_refused(
    change: dict[str, Any], message: str
) -> None:
    state = {**make_loader(20).state_dict(), **change}
    with pytest.raises(StateError, match=message):
        make_loader(20).load_state_dict(state)


def test_a_killed_training_process_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.json"
    num_windows, batch_size = 18, 4
    child = multiprocessing.get_context("fork").Process(
        target=run_training_with_checkpoints,
        args=(str(checkpoint), num_windows * SEQUENCE_LENGTH, SEQUENCE_LENGTH, batch_size, 2),
        kwargs={"seed": SEED, "pause": 0.02},
    )
    child.start()
    deadline = time.monotonic() + 60
    try:
        while not checkpoint.exists() or len(json.loads(checkpoint.read_text())["batches"]) < 7:
            assert time.monotonic() < deadline, "the training process made no progress"
            assert child.is_alive(), f"the training process exited with {child.exitcode}"
            time.sleep(0.005)
    finally:
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
    assert child.exitcode == -signal.SIGKILL
    saved = json.loads(checkpoint.read_text())
    done = len(saved["batches"])
    resumed = make_loader(num_windows, batch_size=batch_size, num_workers=1)
    resumed.load_state_dict(saved["state"])
    rest: list[list[int]] = []
    while len(rest) < 8:
        rest.extend(epoch_batches(resumed))
    uninterrupted = [
        batch
        for epoch in range(6)
        for batch in expected_rank_batches(
            epoch_order(num_windows, SEED, epoch),
            batch_size=batch_size,
            world_size=1,
            rank=0,
            drop_last=False,
        )
    ]
    assert done >= 7
    assert saved["batches"] == uninterrupted[:done]
    assert rest[:8] == uninterrupted[done : done + 8]


# -- processes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start_method", "num_workers"),
    # One worker where each start imports torch afresh: the point is pickling and placement.
    [("fork", 2), ("spawn", 1), ("forkserver", 1)],
)
def test_workers_read_in_their_own_processes_with_every_start_method(
    start_method: str, num_workers: int
) -> None:
    loader = make_loader(
        24,
        rank=1,
        world_size=2,
        num_workers=num_workers,
        multiprocessing_context=multiprocessing.get_context(start_method),
    )
    batches = list(loader)
    expected = expected_rank_batches(
        epoch_order(24, SEED, 0), batch_size=4, world_size=2, rank=1, drop_last=False
    )
    assert [positions_of(batch) for batch in batches] == expected
    reading_pids = {int(pid) for batch in batches for pid in batch["pid"]}
    assert len(reading_pids) == num_workers and os.getpid() not in reading_pids


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 4}, "batch_size belong"),
        ({"collate_fn": list}, "collate_fn belong"),
        ({"in_order": False}, "in_order"),
    ],
)
def test_options_that_would_break_the_order_are_refused(
    options: dict[str, Any], message: str
) -> None:
    windows = FakeStreamDataset(FakeStreamStorage(16), SEQUENCE_LENGTH)
    with pytest.raises(LoaderConfigError, match=message):
        StatefulDataLoader(indexed_batches(windows, rank=0, world_size=1), **options)


# -- from_storage ------------------------------------------------------------------------


@pytest.mark.usefixtures("fake_datasets")
def test_from_storage_builds_stream_windows_with_stride_and_next_token() -> None:
    loader = StatefulDataLoader.from_storage(
        FakeStreamStorage(20),
        sequence_length=4,
        stride=2,
        next_token=True,
        batch_size=3,
        num_workers=0,
        shuffle=False,
        rank=0,
        world_size=1,
    )
    batches = list(loader)
    # (20 - 5) // 2 + 1 = 8 windows of 5 tokens starting every 2 tokens; 2 full batches.
    assert [batch["tokens"].tolist() for batch in batches] == [
        [[0, 1, 2, 3, 4], [2, 3, 4, 5, 6], [4, 5, 6, 7, 8]],
        [[6, 7, 8, 9, 10], [8, 9, 10, 11, 12], [10, 11, 12, 13, 14]],
    ]


@pytest.mark.usefixtures("fake_datasets")
def test_from_storage_serves_stream_with_meta_storage_as_windows() -> None:
    loader = StatefulDataLoader.from_storage(
        FakeStreamStorage(16, kind="stream_with_meta"),
        sequence_length=4,
        batch_size=2,
        num_workers=0,
        shuffle="window",
        shuffle_seed=SEED,
        rank=0,
        world_size=1,
    )
    assert flatten(epoch_batches(loader)) == epoch_order(4, SEED, 0)


@pytest.mark.usefixtures("fake_datasets")
def test_from_storage_pads_documents_with_pad_collate() -> None:
    loader = StatefulDataLoader.from_storage(
        FakeDocumentStorage(6),
        PadCollate({"tokens": Pad(value=-1)}),
        batch_size=3,
        shuffle=False,
        num_workers=0,
        rank=0,
        world_size=1,
    )
    first = next(iter(loader))
    assert first["tokens"].tolist() == [[0, -1, -1], [1, 1, -1], [2, 2, 2]]
    assert first["tokens_lengths"].tolist() == [1, 2, 3]


@pytest.mark.usefixtures("fake_datasets")
@pytest.mark.parametrize(
    ("storage", "options", "message"),
    [
        (FakeStreamStorage(16), {}, "'stream' storage needs sequence_length"),
        (FakeDocumentStorage(4), {"sequence_length": 4}, "sequence_length do"),
        (FakeDocumentStorage(4), {"next_token": True}, "next_token do"),
        (FakeStreamStorage(16), {"sequence_length": 4, "fields": ["a"]}, "fields do"),
        (object(), {"sequence_length": 4}, "kind=None"),
        (FakeStreamStorage(16, kind="video"), {"sequence_length": 4}, "kind='video'"),
    ],
)
def test_from_storage_refuses_options_that_do_not_fit_the_storage_kind(
    storage: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(LoaderConfigError, match=message):
        StatefulDataLoader.from_storage(storage, rank=0, world_size=1, **options)


@pytest.mark.usefixtures("fake_datasets")
def test_from_storage_takes_rank_and_world_size_from_torch_distributed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    loader = StatefulDataLoader.from_storage(
        FakeStreamStorage(96), sequence_length=4, batch_size=2, shuffle="window"
    )
    assert (loader.dataset.options.rank, loader.dataset.options.world_size) == (2, 3)
    expected = expected_rank_batches(
        epoch_order(24, 0, 0), batch_size=2, world_size=3, rank=2, drop_last=True
    )
    assert epoch_batches(loader) == expected


# -- real storages -----------------------------------------------------------------------

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def write_token_stream(url: str, storage_options: dict[str, Any], shard_sizes: list[int]) -> None:
    """Tokens 0, 1, 2, ... over several shards and records, so a window names its start."""
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=storage_options,
                            chunk_bytes=64, block_bytes=512)  # fmt: skip
    start = 0
    with storage.sync_writer() as writer:
        for shard, size in enumerate(shard_sizes):
            for record_size in (size // 3, size - size // 3):
                tokens = np.arange(start, start + record_size, dtype="<i4")
                writer.append(shard, {"tokens": tokens, "loss_mask": (tokens % 2).astype("u1")})
                start += record_size


@pytest.mark.parametrize("shuffle", [True, "block", False, "window"])
def test_a_storage_opened_without_a_format_loads_with_every_shuffle(
    location: Location, shuffle: Any
) -> None:
    """A self-describing storage learns its dtype by opening, a blocking call: the loader
    asks it when it is built, never on the I/O loop where the workers plan (the block
    shuffle's runs and the sequential stretches are sized from it)."""
    write_token_stream(location.url, location.storage_options, [120, 96, 144])  # 360 tokens
    storage = StreamStorage(location.url, storage_options=location.storage_options)
    for workers in (0, 2):
        loader = StatefulDataLoader.from_storage(
            storage, sequence_length=8, batch_size=4, num_workers=workers, drop_last=False,
            shuffle=shuffle, shuffle_seed=SEED,
        )  # fmt: skip
        windows = np.concatenate([batch["tokens"].numpy() for batch in loader])
        starts = windows[:, 0]
        np.testing.assert_array_equal(windows, starts[:, None] + np.arange(8))
        # 45 windows in 12 batches of 4: the last batch wraps around to the epoch's start
        assert len(starts) == 48 and sorted(set(starts.tolist())) == list(range(0, 360, 8))


def test_two_ranks_with_two_workers_read_every_window_of_a_real_stream_once(
    location: Location,
) -> None:
    write_token_stream(location.url, location.storage_options, [120, 96, 144])  # 360 tokens
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options)  # fmt: skip
    per_rank = []
    for rank in range(2):
        loader = StatefulDataLoader.from_storage(
            storage, sequence_length=8, batch_size=4, rank=rank, world_size=2,
            num_workers=2, drop_last=False, shuffle="window", shuffle_seed=SEED,
        )  # fmt: skip
        assert len(loader) == 6  # counted in this process before the workers fork
        per_rank.append([batch["tokens"].numpy() for batch in loader])
    assert [len(batches) for batches in per_rank] == [6, 6]  # 45 windows, 6 steps of 8
    windows = np.concatenate([np.concatenate(batches) for batches in per_rank])
    starts = windows[:, 0]
    np.testing.assert_array_equal(windows, starts[:, None] + np.arange(8))
    counts = Counter((starts // 8).tolist())
    assert set(counts) == set(range(45))
    assert sorted(p for p, c in counts.items() if c == 2) == sorted(epoch_order(45, SEED, 0)[:3])


def test_a_real_stream_resumes_with_another_worker_count(tmp_path: Path) -> None:
    url = str(tmp_path / "tokens")
    write_token_stream(url, {}, [100, 60])

    def loader(num_workers: int) -> StatefulDataLoader:
        storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
        return StatefulDataLoader.from_storage(
            storage, sequence_length=10, batch_size=3, num_workers=num_workers,
            rank=0, world_size=1, shuffle_seed=SEED,
        )  # fmt: skip

    def starts(batches: list[dict[str, Any]]) -> list[list[int]]:
        return [batch["tokens"][:, 0].tolist() for batch in batches]

    whole = loader(0)
    uninterrupted = starts([b for _ in range(2) for b in whole])
    first = loader(2)
    iterator = iter(first)
    seen = starts([next(iterator) for _ in range(2)])
    resumed = loader(0)
    resumed.load_state_dict(first.state_dict())
    rest = starts([b for _ in range(2) for b in resumed])
    assert seen + rest == uninterrupted
    assert flatten(uninterrupted) == [
        10 * p for epoch in range(2) for p in epoch_order(16, SEED, epoch)[:15]
    ]


class DocumentSpans:
    """Tokens with one payload per record: the record's document id (4 bytes)."""

    def __init__(self) -> None:
        self.stream_dtype = np.dtype("<i4")

    def size(self, data: dict[str, Any]) -> int:
        return len(data["tokens"])

    def pack(self, data: dict[str, Any]) -> Any:
        payload = int(data["document"]).to_bytes(4, "little")
        for i in range(len(data["tokens"])):
            yield (0, payload if i == 0 else None)
        return np.asarray(data["tokens"], dtype=self.stream_dtype)

    def unpack(
        self, stream_data: Any, document_shard: Any, document_index: Any, document_data: Any
    ) -> dict[str, Any]:
        documents = [int.from_bytes(bytes(payload), "little") for payload in document_data]
        return {
            "tokens": np.asarray(stream_data),
            "document_of_token": np.asarray(documents, dtype=np.int64)[document_index],
            "documents": documents,
        }


def test_stream_with_meta_windows_batch_with_their_payloads(tmp_path: Path) -> None:
    storage = StreamWithMetaStorage(tmp_path / "spans", DocumentSpans())
    start = 0
    with storage.sync_writer() as writer:
        for document, size in enumerate([5, 9, 3, 7]):
            tokens = np.arange(start, start + size, dtype="<i4")
            writer.append(document % 2, {"document": document, "tokens": tokens})
            start += size
    # Shard 0 holds documents 0 and 2, shard 1 documents 1 and 3; shards concatenate in order.
    document_of_element = np.repeat([0, 2, 1, 3], [5, 3, 9, 7])
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=4, batch_size=2, num_workers=1, shuffle=False,
        rank=0, world_size=1,
    )  # fmt: skip
    batches = list(loader)
    assert len(batches) == 3  # 6 windows of 4 elements
    for step, batch in enumerate(batches):
        for row in range(2):
            window = 2 * step + row
            expected = document_of_element[4 * window : 4 * window + 4]
            assert batch["document_of_token"][row].tolist() == expected.tolist()
            assert batch["documents"][row] == list(dict.fromkeys(expected.tolist()))


def test_real_temporal_windows_match_the_records_they_were_drawn_from(tmp_path: Path) -> None:
    frame_counts = [6, 2, 9, 4, 12]
    records = [
        {
            "frame": np.arange(n, dtype=np.int64),
            "pose": np.random.default_rng(r).normal(size=(n, 3)).astype(np.float32),
        }
        for r, n in enumerate(frame_counts)
    ]
    storage = TemporalArrayStorage(tmp_path / "tracks")
    with storage.sync_writer() as writer:
        for record in records:
            writer.append(0, record)
    per_rank = []
    for rank in range(2):
        loader = StatefulDataLoader.from_storage(
            TemporalArrayStorage(tmp_path / "tracks"), sequence_length=4, samples_per_epoch=20,
            batch_size=5, rank=rank, world_size=2, num_workers=2, shuffle_seed=SEED,
        )  # fmt: skip
        per_rank.append(list(loader))
    got = [(batch["frame"][row], batch["pose"][row]) for step in zip(*per_rank, strict=True)
           for batch in step for row in range(5)]  # fmt: skip
    records_drawn, starts = WindowSampler.of_counts(frame_counts, 4).draw(
        np.arange(20), seed=SEED, epoch=0
    )
    assert len(got) == 20
    for (frames, pose), record, start in zip(got, records_drawn, starts, strict=True):
        assert frames.tolist() == list(range(start, start + 4))
        np.testing.assert_array_equal(pose.numpy(), records[record]["pose"][start : start + 4])


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_workers_read_a_real_stream_with_every_start_method_after_the_parent_read_it(
    location: Location, start_method: str
) -> None:
    write_token_stream(location.url, location.storage_options, [120, 96, 144])  # 360 tokens
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options)  # fmt: skip
    # The parent opens the storage first: its event loop, S3 session and open files must
    # not be what the workers use.
    with storage.sync_reader() as parent:
        assert parent.read(0, 4)["tokens"].tolist() == [0, 1, 2, 3]
        loader = StatefulDataLoader.from_storage(
            storage, sequence_length=8, batch_size=5, num_workers=2, shuffle_seed=SEED,
            multiprocessing_context=multiprocessing.get_context(start_method),
        )  # fmt: skip
        windows = np.concatenate([batch["tokens"].numpy() for batch in loader])
        assert parent.read(352, 8)["tokens"].tolist() == list(range(352, 360))
    starts = windows[:, 0]
    np.testing.assert_array_equal(windows, starts[:, None] + np.arange(8))
    assert sorted((starts // 8).tolist()) == sorted(epoch_order(45, SEED, 0)[:45])


def collate_with_io(samples: list[Any]) -> tuple[Any, int, Any]:
    """Batch plus the worker's own request counters (workers are separate processes)."""
    return stack_collate(samples), os.getpid(), process_io_stats()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sequential_run_of_batches_is_read_with_one_request(
    location: Location, num_workers: int
) -> None:
    tokens = np.arange(64 * 40, dtype="<i4")
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens, "loss_mask": (tokens % 2).astype("u1")})
    # prefetch 32 allows runs of 32 // (2 * 4) = 4 batches, far below STRETCH_READ_BYTES
    loader = StatefulDataLoader.from_storage(
        storage, collate_with_io, sequence_length=16, batch_size=4, num_workers=num_workers,
        shuffle=False, prefetch=32,
    )  # fmt: skip
    before = process_io_stats()
    batches, spent_by_process = [], {}
    for batch, pid, stats in loader:
        batches.append(batch["tokens"].numpy())
        spent_by_process[pid] = stats
    assert len(batches) == 40  # 160 windows of 16 tokens, 4 per batch
    np.testing.assert_array_equal(np.concatenate(batches).reshape(-1), tokens)
    stream_requests = {
        pid: (stats - before if pid == os.getpid() else stats).by_key_kind.get("stream", 0)
        for pid, stats in spent_by_process.items()
    }
    # The 16 adjacent windows of each run of 4 batches come back from one range request;
    # a lead-in of one single-batch run per worker comes first.
    if num_workers == 0:
        assert stream_requests == {os.getpid(): 1 + 10}  # 1 + 39 steps in runs of 4
    elif not location.is_s3:
        # head start: this process reads the lead-in batch, then the first run (5 steps);
        # the workers read 2 lead-in batches, then 33 steps in 9 runs
        assert stream_requests.pop(os.getpid()) == 2
        assert len(stream_requests) == 2 and sum(stream_requests.values()) == 2 + 9
    else:
        assert os.getpid() not in stream_requests  # 2 lead-in batches, 38 steps in 10 runs
        assert len(stream_requests) == 2 and sum(stream_requests.values()) == 2 + 10


def pid_collate(samples: list[Any]) -> dict[str, Any]:
    """Batch plus the process that collated it."""
    return {**stack_collate(samples), "pid": os.getpid()}


def sequential_loader(
    location: Location, *, write: bool = True, **options: Any
) -> StatefulDataLoader:
    tokens = np.arange(64 * 40, dtype="<i4")
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options)  # fmt: skip
    if write:  # a resumed loader reads the same version (a rewrite is another commit)
        with storage.sync_writer(overwrite=True) as writer:
            writer.append(0, {"tokens": tokens, "loss_mask": (tokens % 2).astype("u1")})
    # runs of 4 batches of 4 windows of 16 tokens; 40 steps per epoch
    return StatefulDataLoader.from_storage(
        storage, pid_collate, sequence_length=16, batch_size=4, num_workers=2,
        shuffle=False, prefetch=32, **options,
    )  # fmt: skip


def batch_starts(batch: dict[str, Any]) -> list[int]:
    return (batch["tokens"][:, 0] // 16).tolist()


def test_on_local_disk_the_first_run_is_read_here_before_any_worker_starts(
    location: Location,
) -> None:
    # processes of earlier tests (kept workers of loaders not yet collected) are not this
    # loader's: only a process started since the loader was made would be
    others = set(multiprocessing.active_children())
    loader = sequential_loader(location)
    iterator = iter(loader)
    first = next(iterator)
    assert batch_starts(first) == [0, 1, 2, 3]
    if not location.is_s3:
        assert first["pid"] == os.getpid()
        assert set(multiprocessing.active_children()) - others == set()
    rest = list(iterator)
    pids = [batch["pid"] for batch in [first, *rest]]
    if location.is_s3:  # a remote first read would cost more than it saves
        assert os.getpid() not in pids
    else:
        # the lead-in batch, then the first run of 4
        assert pids[:5] == [os.getpid()] * 5 and os.getpid() not in pids[5:]
    starts = [start for batch in [first, *rest] for start in batch_starts(batch)]
    assert starts == list(range(160))


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize(
    ("num_tokens", "drop_last", "expected_steps"), [(96, False, 3), (40, True, 1)]
)
def test_an_epoch_shorter_than_the_head_start_run_ends_cleanly_every_time(
    tmp_path: Path, num_tokens: int, drop_last: bool, expected_steps: int, persistent: bool
) -> None:
    url = str(tmp_path / "tokens")
    write_token_stream(url, {}, [num_tokens])
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
    loader = StatefulDataLoader.from_storage(
        storage, pid_collate, sequence_length=8, batch_size=4, num_workers=2, shuffle=False,
        drop_last=drop_last, persistent_workers=persistent,
    )  # fmt: skip
    windows = num_tokens // 8  # 12 or 5 windows of 8 tokens
    for epoch in range(3):
        batches = list(loader)
        assert len(batches) == expected_steps, f"epoch {epoch}"
        starts = [start // 8 for batch in batches for start in batch["tokens"][:, 0].tolist()]
        assert starts == [i % windows for i in range(4 * expected_steps)]
        pids = {batch["pid"] for batch in batches}
        if epoch == 0 or not persistent:
            assert pids == {os.getpid()}  # all read here, before any worker ran
        else:
            # the workers started at the first epoch's end are kept: they read the rest
            assert os.getpid() not in pids
        assert loader.epoch == epoch + 1


def test_without_head_start_every_batch_comes_from_a_worker(tmp_path: Path) -> None:
    loader = sequential_loader(Location(str(tmp_path / "tokens"), {}), head_start=False)
    batches = list(loader)
    assert os.getpid() not in {batch["pid"] for batch in batches}
    assert [s for batch in batches for s in batch_starts(batch)] == list(range(160))


_WORKER_INIT_RAN: list[int] = []


def note_worker_init(worker_id: int) -> None:
    _WORKER_INIT_RAN.append(worker_id)


def init_checked_collate(samples: list[Any]) -> dict[str, Any]:
    """Batch plus the process that collated it and whether ``worker_init_fn`` ran there."""
    return {**pid_collate(samples), "init_ran": bool(_WORKER_INIT_RAN)}


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_with_a_worker_init_fn_no_batch_is_read_before_it_ran(tmp_path: Path, method: str) -> None:
    """torchdata's contract: ``worker_init_fn`` runs in a worker before it loads anything.
    On local disk the head start would read the first run in the main process, where the
    function never runs; with one given, every batch comes from a worker that ran it."""
    url = str(tmp_path / "tokens")
    write_token_stream(url, {}, [8 * 40])
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
    loader = StatefulDataLoader.from_storage(
        storage, init_checked_collate, sequence_length=8, batch_size=4, num_workers=2,
        shuffle=False, worker_init_fn=note_worker_init, multiprocessing_context=method,
    )  # fmt: skip
    batches = list(loader)
    assert [b["init_ran"] for b in batches] == [True] * 10
    assert os.getpid() not in {b["pid"] for b in batches}
    assert _WORKER_INIT_RAN == []  # never in this process
    starts = [s // 8 for b in batches for s in b["tokens"][:, 0].tolist()]
    assert starts == list(range(40))


@pytest.mark.parametrize("stop_after", [1, 3, 4, 6])
def test_a_resume_inside_or_after_the_head_run_continues_exactly(
    tmp_path: Path, stop_after: int
) -> None:
    location = Location(str(tmp_path / "tokens"), {})
    interrupted = sequential_loader(location)
    iterator = iter(interrupted)
    seen = [batch_starts(next(iterator)) for _ in range(stop_after)]
    state = interrupted.state_dict()
    del iterator
    resumed = sequential_loader(location, write=False)
    resumed.load_state_dict(state)
    rest = [batch_starts(batch) for batch in resumed]
    assert [s for batch in seen + rest for s in batch] == list(range(160))
    assert len(seen) + len(rest) == 40


LOCAL_PROBE = """
import sys
import numpy as np
from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.io.process import io_loop_started
dtype = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])
storage = StreamStorage(sys.argv[1], StreamNumpyFormat(dtype))
loader = StatefulDataLoader.from_storage(storage, sequence_length=10, batch_size=3,
                                         num_workers=int(sys.argv[2]))
batches = sum(1 for _ in loader)
print(batches, io_loop_started() is None)
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_local_storage_is_read_without_an_event_loop(tmp_path: Path, num_workers: int) -> None:
    url = str(tmp_path / "tokens")
    write_token_stream(url, {}, [100, 60])
    result = subprocess.run(
        [sys.executable, "-c", LOCAL_PROBE, url, str(num_workers)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert result.stdout.split() == [str(16 // 3), "True"]  # 16 windows of 10 tokens


PRELOAD_PROBE = """
import sys
from rangestream import StreamNumpyFormat, StreamStorage, StatefulDataLoader
import numpy as np
storage = StreamStorage("s3://bucket/tokens", StreamNumpyFormat(np.dtype([("t", "<i4")])),
    storage_options={"key": "k", "secret": "s",
                     "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}})
assert "aiohttp" not in sys.modules and "numpy.random" not in sys.modules
StatefulDataLoader.from_storage(storage, sequence_length=8, num_workers=2,
                                multiprocessing_context=sys.argv[1])
print("aiohttp" in sys.modules, "numpy.random" in sys.modules)
"""


@pytest.mark.parametrize(("start_method", "imported"), [("fork", True), ("spawn", False)])
def test_what_workers_import_is_imported_before_they_fork_and_only_then(
    start_method: str, imported: bool
) -> None:
    # Forked workers inherit the parent's imports: importing the S3 client there once saves
    # every worker ~200 ms of CPU before its first batch, and numpy.random (which every
    # worker seeds) ~120 ms in a large parent. Nothing is opened or connected.
    result = subprocess.run(
        [sys.executable, "-c", PRELOAD_PROBE, start_method],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert result.stdout.split() == [str(imported), str(imported)]


# -- persistent workers ------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", ["window", "block"])
def test_persistent_workers_play_every_epoch_and_a_new_epoch_opens_nothing(
    location: Location, shuffle: str
) -> None:
    write_token_stream(location.url, location.storage_options, [400, 240])  # 80 windows
    storage = StreamStorage(location.url, StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options)  # fmt: skip
    loader = StatefulDataLoader.from_storage(
        storage, collate_with_io, sequence_length=8, batch_size=4, num_workers=2,
        shuffle=shuffle, shuffle_seed=SEED, persistent_workers=True, rank=0, world_size=1,
    )  # fmt: skip
    opens: list[dict[int, int]] = []
    epochs = []
    here: list[int] = []  # batches read in this process, per epoch
    for _ in range(3):
        starts, by_worker = [], {}
        here.append(0)
        for batch, pid, stats in loader:
            starts.extend((batch["tokens"][:, 0] // 8).tolist())
            if pid == os.getpid():
                here[-1] += 1
            else:
                by_worker[pid] = stats.by_key_kind.get("zarr.json", 0)
        epochs.append(starts)
        opens.append(by_worker)
    assert all(sorted(starts) == list(range(80)) for starts in epochs)
    assert epochs[0] != epochs[1] != epochs[2]  # a new order each epoch
    if shuffle == "window":
        assert epochs == [epoch_order(80, SEED, epoch) for epoch in range(3)]
    # the same two workers all along, each opened the dataset once
    assert opens[0] == opens[1] == opens[2] and set(opens[0].values()) == {1}
    assert len(opens[0]) == 2
    # only the first epoch's head start (local disk, window shuffle: the lead-in batch and
    # a stretch of one) is read here, before the workers start; later epochs are theirs
    assert here == [2 if shuffle == "window" and not location.is_s3 else 0, 0, 0]


class RawDocuments:
    payload_encoding = "raw"

    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, data: Any, shard: int) -> bytes:
        return bytes(data)


def documents_with_io(samples: list[Any]) -> tuple[list[bytes], int, Any]:
    return list(samples), os.getpid(), process_io_stats()


@pytest.mark.parametrize("shuffle", ["window", False])
def test_persistent_workers_read_the_shard_table_and_offsets_once_then_only_documents(
    location: Location, shuffle: str | bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rangestream.layout import shard_table

    monkeypatch.setattr(shard_table, "INLINE_SHARDS", 4)  # the shards are in index/shards
    documents = [bytes([i]) * (20 + i) for i in range(96)]
    storage = DocumentStorage(location.url, RawDocuments(),
                              storage_options=location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i // 12, document)  # 8 shards of 12
    # no head start: every batch, the first epoch's first ones too, is read by a worker
    loader = StatefulDataLoader.from_storage(
        storage, documents_with_io, batch_size=4, num_workers=2, shuffle=shuffle,
        shuffle_seed=SEED, persistent_workers=True, rank=0, world_size=1, head_start=False,
    )  # fmt: skip
    totals: list[dict[int, dict[str, int]]] = []  # per epoch: each worker's counts so far
    for _ in range(3):
        seen, by_worker = [], {}
        for batch, pid, stats in loader:
            seen.extend(batch)
            by_worker[pid] = stats.by_key_kind
        assert sorted(seen) == sorted(documents)  # every document once per epoch
        totals.append(by_worker)
    assert len(totals[0]) == 2 and os.getpid() not in totals[0]
    for pid, first in totals[0].items():
        # the first epoch opened the dataset (the root, the shard table) and read offsets
        # chunks (batches in flight at once may each miss one before it is kept)
        assert first["zarr.json"] == 1 and first["shards"] == 1 and first["payload_offsets"]
        for later in (totals[1][pid], totals[2][pid]):
            grown = {kind: n - first.get(kind, 0) for kind, n in later.items()}
            # later epochs: documents' bytes only; nothing opened, no offsets read again
            assert {kind for kind, n in grown.items() if n} <= {"payload_heap"}


def test_persistent_workers_resume_mid_epoch_from_a_state(tmp_path: Path) -> None:
    url = str(tmp_path / "tokens")
    write_token_stream(url, {}, [400, 240])
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, sequence_length=8, batch_size=4, num_workers=2, shuffle_seed=SEED,
            persistent_workers=True, rank=0, world_size=1,
        )  # fmt: skip

    first = loader()
    iterator = iter(first)
    seen = [(batch["tokens"][:, 0] // 8).tolist() for batch in (next(iterator) for _ in range(5))]
    resumed = loader()
    list(resumed)  # its workers start and finish an epoch first
    resumed.load_state_dict(first.state_dict())
    rest = [(batch["tokens"][:, 0] // 8).tolist() for batch in resumed]
    assert flatten(seen + rest) == epoch_order(80, SEED, 0)
