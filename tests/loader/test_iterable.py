from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data
import torchdata.stateful_dataloader

from rangestream.errors import LoaderConfigError, StateError
from rangestream.io.process import io_loop
from rangestream.loader import BatchIterableDataset, LoaderPosition

from .expected import epoch_order, expected_rank_batches, flatten
from .fakes import FakeStreamDataset, FakeStreamStorage, indexed_batches, positions_of

SEQUENCE_LENGTH = 4


def make_dataset(
    num_windows: int,
    *,
    batch_size: int = 4,
    seed: int = 3,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    prefetch: int = 8,
    delay: float = 0.0,
    fail_at: int | None = None,
) -> BatchIterableDataset:
    windows = FakeStreamDataset(
        FakeStreamStorage(num_windows * SEQUENCE_LENGTH),
        SEQUENCE_LENGTH,
        delay=delay,
        fail_at=fail_at,
    )
    return indexed_batches(
        windows,
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        prefetch=prefetch,
    )


def fake_of(dataset: BatchIterableDataset) -> FakeStreamDataset:
    fake = dataset.source.dataset
    assert isinstance(fake, FakeStreamDataset)
    return fake


def test_batches_follow_the_epoch_order_although_reads_finish_out_of_order() -> None:
    dataset = make_dataset(23, delay=0.002)
    batches = list(dataset)
    expected = expected_rank_batches(
        epoch_order(23, seed=3, epoch=0), batch_size=4, world_size=1, rank=0, drop_last=False
    )
    assert [positions_of(batch) for batch in batches] == expected
    for batch in batches:
        starts = batch["position"].numpy() * SEQUENCE_LENGTH
        assert np.array_equal(batch["tokens"].numpy(), starts[:, None] + np.arange(SEQUENCE_LENGTH))


def test_reads_in_flight_reach_but_never_exceed_prefetch() -> None:
    dataset = make_dataset(40, prefetch=6, delay=0.003)
    list(dataset)
    assert fake_of(dataset).stats.max_in_flight == 6


def test_reads_started_ahead_of_delivered_samples_stay_within_prefetch() -> None:
    dataset = make_dataset(40, batch_size=3, prefetch=5, delay=0.001)
    stats = fake_of(dataset).stats
    delivered = 0
    ahead = []
    for batch in dataset:
        delivered += len(batch["position"])
        # Give the prefetcher time to fill up to its bound (a loaded machine may otherwise
        # deliver before it got there); it must then stop exactly at the bound.
        target = min(5, 40 - delivered)
        deadline = time.monotonic() + 5
        while stats.started - delivered < target and time.monotonic() < deadline:
            time.sleep(0.001)
        ahead.append(stats.started - delivered)
    assert max(ahead) == 5
    assert ahead[-1] == 0


def test_prefetch_of_one_reads_strictly_one_window_at_a_time() -> None:
    dataset = make_dataset(9, batch_size=4, prefetch=1, delay=0.001)
    batches = [positions_of(batch) for batch in dataset]
    assert fake_of(dataset).stats.max_in_flight == 1
    order = epoch_order(9, seed=3, epoch=0)
    assert batches == [order[0:4], order[4:8], [order[8], *order[0:3]]]


def test_set_epoch_restarts_another_epoch_but_keeps_the_position_of_the_current_one() -> None:
    dataset = make_dataset(16)
    dataset.seek(LoaderPosition(0, 8))
    dataset.set_epoch(0)
    assert [positions_of(b) for b in dataset] == [
        epoch_order(16, 3, 0)[8:12],
        epoch_order(16, 3, 0)[12:16],
    ]
    dataset.set_epoch(1)
    assert flatten([positions_of(b) for b in dataset]) == epoch_order(16, 3, 1)


def test_in_process_state_resumes_with_another_batch_size_and_world_size() -> None:
    first = make_dataset(37, batch_size=4)
    iterator = iter(first)
    seen = [positions_of(next(iterator)) for _ in range(3)]
    state = first.state_dict()
    assert state["worker_batches"] == 3 and state["num_workers"] == 1
    rest = []
    for rank in range(2):
        resumed = make_dataset(37, batch_size=3, rank=rank, world_size=2)
        resumed.load_state_dict(state)
        rest.append([positions_of(batch) for batch in resumed])
    order = epoch_order(37, seed=3, epoch=0)
    assert flatten(seen) == order[:12]
    interleaved = [i for step in zip(*rest, strict=True) for batch in step for i in batch]
    # 25 remain; 5 steps of 6 wrap 5 positions around to the start of the order.
    assert interleaved == order[12:] + order[:5]


def test_plain_dataloader_with_two_workers_yields_the_rank_order_read_in_the_workers() -> None:
    dataset = make_dataset(30, rank=1, world_size=2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    batches = list(loader)
    expected = expected_rank_batches(
        epoch_order(30, seed=3, epoch=0), batch_size=4, world_size=2, rank=1, drop_last=False
    )
    assert [positions_of(batch) for batch in batches] == expected
    reading_pids = {int(pid) for batch in batches for pid in batch["pid"]}
    assert len(reading_pids) == 2 and os.getpid() not in reading_pids
    assert fake_of(dataset).stats.opened == 0


@pytest.mark.filterwarnings("ignore:.*set_vital.*:UserWarning")
def test_torchdata_loader_resumes_the_per_worker_state_with_the_same_workers() -> None:
    def loader_for(dataset: BatchIterableDataset) -> Any:
        return torchdata.stateful_dataloader.StatefulDataLoader(
            dataset, batch_size=None, num_workers=2
        )

    first = loader_for(make_dataset(44))
    iterator = iter(first)
    seen = [positions_of(next(iterator)) for _ in range(5)]
    state = first.state_dict()
    del iterator
    resumed = loader_for(make_dataset(44))
    resumed.load_state_dict(state)
    rest = [positions_of(batch) for batch in resumed]
    expected = expected_rank_batches(
        epoch_order(44, seed=3, epoch=0), batch_size=4, world_size=1, rank=0, drop_last=False
    )
    assert seen == expected[:5]
    assert rest == expected[5:]


def test_per_worker_state_refuses_another_split() -> None:
    state = {**make_dataset(20).state_dict(), "worker_id": 1, "num_workers": 2, "worker_batches": 2}
    with pytest.raises(StateError, match="batch_size=4"):
        make_dataset(20, batch_size=5).load_state_dict(state)
    same_split = make_dataset(20)
    same_split.load_state_dict(state)
    with pytest.raises(StateError, match="worker 1 of 2 cannot resume worker 0 of 1"):
        iter(same_split)


def test_state_from_another_seed_is_refused() -> None:
    state = make_dataset(20, seed=1).state_dict()
    with pytest.raises(StateError, match="seed=1"):
        make_dataset(20, seed=2).load_state_dict(state)


def tasks_on_the_io_loop() -> int:
    """Tasks of any kind still on this process's I/O loop (the loader's reads run there)."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # not this one

    return asyncio.run_coroutine_threadsafe(count(), io_loop()).result(timeout=10)


def test_a_failed_read_propagates_and_cancels_the_iterations_other_reads() -> None:
    threads_before = {thread.name for thread in threading.enumerate()}
    order = epoch_order(20, seed=3, epoch=0)
    dataset = make_dataset(20, fail_at=order[6], delay=0.001)
    seen = []
    with pytest.raises(OSError, match=f"position {order[6]} failed"):
        for batch in dataset:
            seen.append(positions_of(batch))
    assert seen == [order[0:4]]
    assert tasks_on_the_io_loop() == 0  # the reads beside the failed one are drained
    assert fake_of(dataset).stats.in_flight == 0
    # the reads ran on the process's one I/O loop: no thread of their own
    assert {thread.name for thread in threading.enumerate()} - threads_before <= {"rangestream-io"}


def test_abandoning_an_iteration_cancels_and_drains_its_reads() -> None:
    dataset = make_dataset(200, delay=0.02)
    iterator = iter(dataset)
    next(iterator)
    assert iterator.tasks.pending() > 0  # type: ignore[attr-defined]  # reads in flight
    iterator.close()  # type: ignore[attr-defined]
    assert iterator.tasks.pending() == 0  # type: ignore[attr-defined]
    assert tasks_on_the_io_loop() == 0
    stats = fake_of(dataset).stats
    assert stats.in_flight == 0 and stats.started < 200


@pytest.mark.parametrize(("drop_last", "expected"), [(True, 5), (False, 6)])
def test_len_counts_the_batches_of_a_whole_epoch(drop_last: bool, expected: int) -> None:
    dataset = make_dataset(45, rank=1, world_size=2, drop_last=drop_last)
    dataset.seek(LoaderPosition(0, 16))
    assert len(dataset) == expected


def test_invalid_batch_size_and_prefetch_are_refused() -> None:
    with pytest.raises(LoaderConfigError, match="batch_size"):
        make_dataset(4, batch_size=0)
    with pytest.raises(LoaderConfigError, match="prefetch"):
        make_dataset(4, prefetch=0)


def test_the_first_read_starts_when_the_iterator_is_made_and_goes_alone() -> None:
    # In a DataLoader worker iter(dataset) runs before the start-up handshake; the open and
    # the first reads must overlap it instead of waiting for the first next().
    dataset = make_dataset(40, batch_size=4, prefetch=8, delay=0.001)
    stats = fake_of(dataset).stats
    iterator = iter(dataset)
    deadline = time.monotonic() + 5
    while stats.started < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # time enough for more reads to start, if any would
    assert stats.opened == 1
    # the first batch's read goes alone: nothing competes with what the loop waits for
    assert stats.started == 4
    assert positions_of(next(iterator)) == epoch_order(40, seed=3, epoch=0)[:4]
    # then the read-ahead fills the budget
    deadline = time.monotonic() + 5
    while stats.started < 12 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert stats.started == 12


def test_an_iterator_dropped_before_its_first_batch_cancels_its_reads() -> None:
    dataset = make_dataset(40, delay=0.02)
    iterator = iter(dataset)
    del iterator
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and tasks_on_the_io_loop():
        time.sleep(0.01)
    assert tasks_on_the_io_loop() == 0
    assert fake_of(dataset).stats.in_flight == 0


EXIT_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from loader.fakes import FakeStreamDataset, FakeStreamStorage, indexed_batches
dataset = indexed_batches(
    FakeStreamDataset(FakeStreamStorage(400 * 4), 4, delay=0.001), batch_size=4, prefetch=8
)
iterator = iter(dataset)
next(iterator)
print("left with reads in flight", flush=True)
"""


def test_a_process_that_leaves_an_iterator_with_reads_in_flight_exits() -> None:
    # The loop thread is a daemon: once interpreter finalisation starts it never runs again,
    # so an iterator dropped then must not wait for it (it used to hang the exit).
    tests_dir = str(Path(__file__).resolve().parents[1])
    result = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, tests_dir],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "left with reads in flight" in result.stdout


# -- an epoch without a single batch is a configuration error, not a silent no-op ------------


@pytest.mark.parametrize(
    ("windows", "batch_size", "world_size"),
    [(3, 4, 1), (7, 2, 4), (0, 1, 1)],
)
def test_an_epoch_with_no_batch_raises_saying_samples_batch_size_and_world_size(
    windows: int, batch_size: int, world_size: int
) -> None:
    dataset = make_dataset(windows, batch_size=batch_size, world_size=world_size, drop_last=True)
    with pytest.raises(LoaderConfigError) as caught:
        list(dataset)
    message = str(caught.value)
    assert f"{windows} samples" in message
    assert f"batch_size {batch_size}" in message and f"world_size {world_size}" in message


def test_an_empty_dataset_raises_even_without_drop_last() -> None:
    with pytest.raises(LoaderConfigError, match="0 samples"):
        list(make_dataset(0, drop_last=False))


def test_the_end_of_a_resumed_epoch_is_not_an_error() -> None:
    dataset = make_dataset(8, batch_size=4, drop_last=True)
    dataset.seek(LoaderPosition(0, 8))
    assert list(dataset) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sequence_length_longer_than_the_data_stops_the_loader_with_the_numbers(
    tmp_path: Path, num_workers: int
) -> None:
    from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage

    storage = StreamStorage(str(tmp_path / "ds"), StreamNumpyFormat(np.dtype([("t", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(100, dtype="<i4")})
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=512, batch_size=2, num_workers=num_workers
    )
    with pytest.raises(LoaderConfigError, match=r"0 samples.*batch_size 2.*world_size 1"):
        list(loader)
