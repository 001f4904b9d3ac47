"""The block shuffle through the real loader: exactly once, resume, requests per run.

Ranks are simulated with explicit ``rank``/``world_size`` in one process; DataLoader workers
with real worker processes where a test needs them, and in the hypothesis tests by giving the
iterating process a worker identity (``get_worker_info``), so that many settings run in
seconds. The expected batches are the pure module's (:func:`simulate_epoch`, whose
exactly-once and resume properties are tested in ``test_shuffle.py``); the expected request
counts are :class:`WindowGeometry`'s arithmetic over the plan's reads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location

from rangestream import DocumentDataset, DocumentStorage, StreamNumpyFormat, StreamStorage
from rangestream.layout.block import ArrayLayout
from rangestream.loader import (
    BatchIterableDataset,
    BatchOptions,
    IndexedSource,
    LoaderPosition,
    StatefulDataLoader,
)
from rangestream.loader.orders.block_shuffle import BlockShuffle, simulate_epoch
from rangestream.loader.orders.geometry import WindowGeometry
from rangestream.loader.orders.phases import EpochPosition
from rangestream.loader.reading.blocks import RUNS_IN_FLIGHT
from rangestream.loader.transport import BUNDLE_BATCHES
from rangestream.types import DocumentStorageFormat
from testkit import LatencyProxy

from .fakes import FakeStreamDataset, FakeStreamStorage

WINDOW = 4
SEED = 13


def fake_block_dataset(
    n: int, run_windows: int, buffer_runs: int, *, rank: int, world: int, batch: int,
    drop_last: bool, delay: float = 0.0, prefetch: int | None = None,
) -> BatchIterableDataset:  # fmt: skip
    windows = FakeStreamDataset(FakeStreamStorage(n * WINDOW), WINDOW, delay=delay)
    source = IndexedSource(windows, shuffle="block", seed=SEED, run_windows=run_windows,
                           buffer_runs=buffer_runs)  # fmt: skip
    options = BatchOptions(batch_size=batch, rank=rank, world_size=world, drop_last=drop_last,
                           prefetch=prefetch)  # fmt: skip
    return BatchIterableDataset(source, options)


def iterate_as_workers(
    dataset: BatchIterableDataset, workers: int, monkeypatch: pytest.MonkeyPatch
) -> dict[int, list[int]]:
    """``step -> windows`` of one rank, each worker's share read as that worker would."""
    dataset.tag_steps()
    dataset.iterated_by_loader(True)  # as the loader's workers iterate it
    dataset.workers_per_rank = workers
    out: dict[int, list[int]] = {}
    for worker in range(workers):
        info = SimpleNamespace(id=worker, num_workers=workers)
        monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda info=info: info)
        bundles = list(dataset)  # a worker's messages: bundles of tagged batches
        assert [len(bundle) for bundle in bundles[:1]] == [1][: len(bundles)]
        assert all(1 <= len(bundle) <= BUNDLE_BATCHES for bundle in bundles)
        for step, batch, _ in (tagged for bundle in bundles for tagged in bundle):
            assert step % workers == worker  # the DataLoader's round robin
            out[step] = [int(p) for p in batch["position"]]
    monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda: None)
    return out


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(1, 300),
    run_windows=st.integers(1, 12),
    buffer_runs=st.integers(1, 5),
    world=st.integers(1, 3),
    batch=st.integers(1, 5),
    workers=st.integers(1, 3),
    drop_last=st.booleans(),
    stop=st.floats(0, 1),
    new_world=st.integers(1, 3),
    new_batch=st.integers(1, 5),
    new_workers=st.integers(1, 3),
)  # fmt: skip
def test_ranks_and_workers_load_the_block_order_and_resume_elastically(
    monkeypatch: pytest.MonkeyPatch, n: int, run_windows: int, buffer_runs: int, world: int,
    batch: int, workers: int, drop_last: bool, stop: float, new_world: int, new_batch: int,
    new_workers: int,
) -> None:  # fmt: skip
    if n < world * batch and (drop_last or n == 0):
        return  # an epoch without a batch is refused (tested elsewhere)
    shuffle = BlockShuffle(n, SEED, run_windows, buffer_runs)
    first = EpochPosition.start(world_size=world, batch_size=batch, num_workers=workers,
                                drop_last=drop_last)  # fmt: skip
    expected = simulate_epoch(shuffle, 1, first)
    steps = max(step for _, step in expected) + 1
    k = int(stop * steps)
    loaded: dict[tuple[int, int], list[int]] = {}
    for rank in range(world):
        dataset = fake_block_dataset(n, run_windows, buffer_runs, rank=rank, world=world,
                                     batch=batch, drop_last=drop_last)  # fmt: skip
        dataset.seek(LoaderPosition(1, 0, first))
        for step, windows in iterate_as_workers(dataset, workers, monkeypatch).items():
            loaded[(rank, step)] = windows
    assert loaded == {key: value.tolist() for key, value in expected.items()}

    # stop after k steps of every rank; resume with another setting
    position = first.advance(k)
    saved = LoaderPosition(1, position.consumed_samples, position)
    state = json.loads(json.dumps(saved.state_dict()))
    resumed_position = LoaderPosition.from_state_dict(state)
    after = resumed_position.phases.resume(  # type: ignore[union-attr]
        world_size=new_world, batch_size=new_batch, num_workers=new_workers, drop_last=False
    )
    loaded_after: dict[tuple[int, int], list[int]] = {}
    for rank in range(new_world):
        dataset = fake_block_dataset(n, run_windows, buffer_runs, rank=rank, world=new_world,
                                     batch=new_batch, drop_last=False)  # fmt: skip
        dataset.seek(LoaderPosition(1, after.consumed_samples, after))
        for step, windows in iterate_as_workers(dataset, new_workers, monkeypatch).items():
            loaded_after[(rank, step)] = windows
    expected_after = simulate_epoch(shuffle, 1, after)
    assert loaded_after == {key: value.tolist() for key, value in expected_after.items()}
    # every window not consumed before the stop is loaded after it; only padding repeats
    seen = {w for (_, step), ws in expected.items() if step < k for w in ws.tolist()}
    rest = [w for ws in loaded_after.values() for w in ws]
    assert set(range(n)) - seen <= set(rest)
    assert len(rest) - len(set(range(n)) - seen) < new_world * new_batch


def real_stream(location_url: str, options: dict[str, Any], tokens: int) -> StreamStorage:
    storage = StreamStorage(location_url, StreamNumpyFormat(np.dtype([("tokens", "<i4")])),
                            storage_options=options, chunk_bytes=64, block_bytes=1024)  # fmt: skip
    with storage.sync_writer(overwrite=True) as writer:
        writer.append(0, {"tokens": np.arange(tokens // 3, dtype="<i4")})
        writer.append(1, {"tokens": np.arange(tokens // 3, tokens, dtype="<i4")})
    return storage


def geometry_for(tokens: int, window: int) -> WindowGeometry:
    layout = ArrayLayout.for_sizes(np.dtype([("tokens", "<i4")]), (), chunk_bytes=64,
                                   block_bytes=1024)  # fmt: skip
    return WindowGeometry(
        stream_bounds=(0, tokens // 3, tokens), block_rows=layout.block_rows,
        chunk_rows=layout.chunk_rows, stored_chunk_bytes=layout.stored_chunk_nbytes,
        stride=window, window_length=window,
    )  # fmt: skip


def test_each_run_is_read_with_the_requests_its_geometry_makes(location: Location) -> None:
    tokens, window = 4000, 8  # 500 windows over two shards and 16 blocks
    storage = real_stream(location.url, location.storage_options, tokens)
    loader = StatefulDataLoader.from_storage(
        storage, sequence_length=window, batch_size=5, num_workers=0, shuffle="block",
        run_windows=40, buffer_runs=3, shuffle_seed=SEED, rank=0, world_size=1,
    )  # fmt: skip
    starts = [s for batch in loader for s in (batch["tokens"][:, 0] // window).tolist()]
    assert sorted(starts) == list(range(500))  # 100 steps of 5: every window once
    shuffle = BlockShuffle(500, SEED, 40, 3)
    start = EpochPosition.start(world_size=1, batch_size=5, num_workers=1, drop_last=True)
    plan = shuffle.worker_plan(0, start, rank=0, worker_id=0)
    geometry = geometry_for(tokens, window)
    groups = list(plan.groups())
    reads = [read for group in groups for read in group.reads]
    assert len(reads) == 13  # every run once: 12 of 40 windows and the short one of 20
    assert all(read.whole for read in reads)  # one reader: no region cuts a run
    # a group's runs that touch in storage are read together (their shared chunks once)
    together = [_touching(sorted((r.start, r.stop) for r in group.reads)) for group in groups]
    assert sum(len(spans) for spans in together) < 13  # some do touch here
    if location.is_s3:  # the first step's runs (a few KiB) are read first, together
        first = groups[0]
        step = first.windows[first.steps == first.steps[0]]
        holding = [(a, b) for a, b in together[0] if ((step >= a) & (step < b)).any()]
        together[0] = [span for span in together[0] if span not in holding]
        expected = 1 + geometry.requests(np.concatenate([np.arange(a, b) for a, b in holding]))
    else:
        expected = 1
    expected += sum(geometry.requests(np.arange(a, b)) for spans in together for a, b in spans)
    assert loader.source_stats()["source"]["requests"] == expected
    assert expected < 1 + 500 / 10  # far below a request per window


def _touching(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``[start, stop)`` spans with those that touch joined."""
    out: list[tuple[int, int]] = []
    for start, stop in spans:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def test_workers_in_their_own_processes_resume_elastically_over_s3_and_local(
    location: Location,
) -> None:
    tokens, window = 4000, 8
    storage = real_stream(location.url, location.storage_options, tokens)

    def loader(rank: int, world: int, workers: int, batch: int) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, sequence_length=window, batch_size=batch, num_workers=workers,
            shuffle="block", run_windows=30, shuffle_seed=SEED, rank=rank, world_size=world,
            drop_last=False,
        )  # fmt: skip

    first = [loader(rank, 2, 2, 4) for rank in range(2)]
    iterators = [iter(one) for one in first]
    seen = [s for it in iterators for _ in range(7) for s in _starts(next(it), window)]
    states = [one.state_dict() for one in first]
    # every rank holds the same position
    assert {**states[0], "rank": 1} == states[1]
    assert states[0]["phases"] == [[2, 4, 2, 0, 7]]
    del iterators
    rest = []
    for rank in range(3):
        resumed = loader(rank, 3, 2, 3)
        resumed.load_state_dict(states[1])
        rest.extend(s for batch in resumed for s in _starts(batch, window))
    assert len(set(seen)) == len(seen) == 56
    # 444 windows remain: 50 steps of 9, the last 6 padded from the start of the order
    assert len(rest) == 450 and set(seen) | set(rest) == set(range(500))
    assert len(set(rest) - set(seen)) == 444


def _starts(batch: dict[str, Any], window: int) -> list[int]:
    return (batch["tokens"][:, 0] // window).tolist()


def test_reads_in_flight_stay_within_the_prefetch_budget() -> None:
    dataset = fake_block_dataset(400, 20, 4, rank=0, world=1, batch=4, drop_last=True,
                                 delay=0.002, prefetch=40)  # fmt: skip
    windows = [int(p) for batch in dataset for p in batch["position"]]
    assert sorted(windows) == list(range(400))
    stats = dataset.source.dataset.stats  # type: ignore[attr-defined]
    assert stats.max_in_flight <= 40
    # the first step's 4 windows alone (ahead of the runs that hold them: the fake's
    # samples have no storage span, so its runs' bytes are unknown), then one read_many
    # per run, or per chain of a buffer's runs that touch in storage, by first use
    start = EpochPosition.start(world_size=1, batch_size=4, num_workers=1, drop_last=True)
    plan = BlockShuffle(400, SEED, 20, 4).worker_plan(0, start, rank=0, worker_id=0)
    sizes = []
    for group in plan.groups():
        runs = group.windows // 20
        first_use = {int(run): int(np.flatnonzero(runs == run)[0]) for run in np.unique(runs)}
        chains = _touching(sorted((20 * run, 20 * run + 20) for run in first_use))
        uses = [min(first_use[run] for run in range(a // 20, b // 20)) for a, b in chains]
        sizes.extend(b - a for _, (a, b) in sorted(zip(uses, chains, strict=True)))
    assert stats.read_many_sizes == [4, *sizes]
    assert len(sizes) < 20  # some runs of a buffer touch here


def test_the_next_buffer_is_read_ahead_two_runs_at_a_time() -> None:
    """By default a worker reads one buffer ahead (``K`` runs not yet taken), two run
    reads running at once: the next starts as one ends, not when the consumer asks."""
    dataset = fake_block_dataset(400, 20, 4, rank=0, world=1, batch=4, drop_last=True,
                                 delay=0.002)  # fmt: skip
    assert dataset.prefetch == 4 * 20  # one buffer
    windows = [int(p) for batch in dataset for p in batch["position"]]
    assert sorted(windows) == list(range(400))
    stats = dataset.source.dataset.stats  # type: ignore[attr-defined]
    assert stats.max_read_many_running == RUNS_IN_FLIGHT == 2
    assert stats.max_in_flight <= 80  # the budget: never more samples requested


def test_block_state_carries_its_parameters_and_phases(tmp_path: Path) -> None:
    storage = real_stream(str(tmp_path / "t"), {}, 4000)
    loader = StatefulDataLoader.from_storage(storage, sequence_length=8, shuffle="block",
                                             num_workers=0, rank=0, world_size=1)  # fmt: skip
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert state == json.loads(json.dumps(state))
    assert state["shuffle"] == "block" and state["phases"] == [[1, 8, 1, 1, 1]]
    assert state["run_windows"] == (4 << 20) // 32 and state["buffer_runs"] == 1


def real_documents(location_url: str, options: dict[str, Any], count: int) -> DocumentStorage:
    """``count`` documents of 5 to 40 bytes over three shards, document ``i`` starting
    with its index (4 bytes) so a loaded document names itself."""
    storage = DocumentStorage(location_url, DocumentBytes(), storage_options=options,
                              chunk_bytes=64, block_bytes=2048)  # fmt: skip
    with storage.sync_writer(overwrite=True) as writer:
        for i in range(count):
            writer.append(3 * i // count, i.to_bytes(4, "little") + bytes(1 + i % 37))
    return storage


class DocumentBytes(DocumentStorageFormat[bytes, bytes]):
    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, encoded_data: Any, shard: int) -> bytes:
        return bytes(encoded_data)


def _document_ids(batch: list[bytes]) -> list[int]:
    return [int.from_bytes(document[:4], "little") for document in batch]


def test_documents_are_block_shuffled_by_runs_exactly_once(location: Location) -> None:
    storage = real_documents(location.url, location.storage_options, 600)
    mean = DocumentDataset(storage).sample_span_bytes
    assert mean == -(-sum(5 + i % 37 for i in range(600)) // 600)
    loader = StatefulDataLoader.from_storage(
        storage, list, batch_size=6, num_workers=0, shuffle="block", run_windows=50,
        buffer_runs=3, shuffle_seed=SEED, rank=0, world_size=1,
    )  # fmt: skip
    order = [i for batch in loader for i in _document_ids(batch)]
    assert sorted(order) == list(range(600))
    start = EpochPosition.start(world_size=1, batch_size=6, num_workers=1, drop_last=True)
    steps = simulate_epoch(BlockShuffle(600, SEED, 50, 3), 0, start)
    assert order == [int(p) for key in sorted(steps) for p in steps[key]]
    requests = loader.source_stats()["source"]["requests"]
    # the open, then 12 runs of 50 documents: each an offsets range and a heap range, a
    # few split by a shard's end or a heap block's (26 here); over S3 the first step's 6
    # documents are also read alone, ahead of their runs. A document read alone costs ~2.
    assert requests <= 1 + 2 * 12 + 4 + (6 if location.is_s3 else 0) < 600 / 10


def test_documents_default_to_the_block_shuffle_over_object_storage_only(
    location: Location,
) -> None:
    storage = real_documents(location.url, location.storage_options, 120)
    loader = StatefulDataLoader.from_storage(storage, list, batch_size=4, num_workers=0)
    assert loader.dataset.source.shuffle == ("block" if location.is_s3 else "window")
    assert sorted(i for batch in loader for i in _document_ids(batch)) == list(range(120))


def test_block_shuffled_documents_resume_elastically_in_worker_processes(
    location: Location,
) -> None:
    storage = real_documents(location.url, location.storage_options, 500)

    def loader(rank: int, world: int, workers: int, batch: int) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, list, batch_size=batch, num_workers=workers, shuffle="block",
            run_windows=30, shuffle_seed=SEED, rank=rank, world_size=world, drop_last=False,
        )  # fmt: skip

    first = [loader(rank, 2, 2, 4) for rank in range(2)]
    iterators = [iter(one) for one in first]
    seen = [i for it in iterators for _ in range(7) for i in _document_ids(next(it))]
    state = first[1].state_dict()
    del iterators
    rest = []
    for rank in range(3):
        resumed = loader(rank, 3, 2, 3)
        resumed.load_state_dict(state)
        rest.extend(i for batch in resumed for i in _document_ids(batch))
    assert len(set(seen)) == len(seen) == 56
    # 444 documents remain: 50 steps of 9, the last 6 padded from the start of the order
    assert len(rest) == 450 and set(seen) | set(rest) == set(range(500))
    assert len(set(rest) - set(seen)) == 444


@pytest.mark.parametrize(("world", "workers"), [(1, 4), (2, 2)], ids=["1x4", "2x2"])
def test_four_readers_over_s3_read_each_byte_of_data_about_once(
    s3_url: Location, s3_proxy: LatencyProxy, world: int, workers: int
) -> None:
    """One block-shuffled epoch read by four readers (one rank's 4 workers, or 2 ranks of 2
    as separate loaders), counted at the proxy: every body byte, opens included, against
    the bytes of the windows handed out. Readers' regions end inside runs (batches of 6),
    so runs are shared by two readers; each reads its own span of them only."""
    window, count = 256, 4096  # 4 MiB of int32 tokens
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(np.dtype([("tokens", "<i4")])),
                            storage_options=s3_url.storage_options, chunk_bytes=16 << 10,
                            block_bytes=256 << 10)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(count * window // 3, dtype="<i4")})
        writer.append(1, {"tokens": np.arange(count * window // 3, count * window, dtype="<i4")})
    s3_proxy.reset_stats()
    through_proxy = StreamStorage(s3_url.url, storage_options=s3_proxy.storage_options)
    starts: list[int] = []
    for rank in range(world):
        loader = StatefulDataLoader.from_storage(
            through_proxy, sequence_length=window, batch_size=6, num_workers=workers,
            shuffle="block", run_windows=64, shuffle_seed=SEED, rank=rank, world_size=world,
        )  # fmt: skip
        starts.extend(s for batch in loader for s in _starts(batch, window))
        assert loader.state_dict()["buffer_runs"] == 8  # 16 runs per reader, capped at 8
    assert len(starts) == len(set(starts)) == 4092  # 682 steps of 6 (drop_last: 4 left)
    data_bytes = len(starts) * window * 4
    ratio = s3_proxy.stats().response_bytes / data_bytes
    print(f"block shuffle, {world} rank(s) x {workers} workers: {ratio:.4f} bytes per byte")
    assert 1.0 <= ratio <= 1.2


def test_a_kept_worker_sends_the_next_epochs_first_read_before_that_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A persistent worker (a shared position, a worker identity) plans its next epoch
    once this one has issued its last read; from its second epoch on (a loader iterated
    again) it also sends that epoch's first read then, and the epoch uses it instead of
    making it again. A moved position leaves it unused; a loader iterated once reads
    nothing beyond its epoch."""
    dataset = fake_block_dataset(400, 20, 4, rank=0, world=1, batch=4, drop_last=True)
    dataset.share_position()
    info = SimpleNamespace(id=0, num_workers=1)
    monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda: info)
    stats = dataset.source.dataset.stats  # type: ignore[attr-defined]
    shuffle = BlockShuffle(400, SEED, 20, 4)
    start = EpochPosition.start(world_size=1, batch_size=4, num_workers=1, drop_last=True)

    def reads(epoch: int) -> list[int]:
        """An epoch's read_many sizes: its first step's windows alone (the fake's samples
        have no storage span), then each group's runs, those touching joined."""
        groups = list(shuffle.worker_plan(epoch, start, rank=0, worker_id=0).groups())
        first = groups[0]
        sizes = [len(np.unique(first.windows[first.steps == first.steps[0]]))]
        for group in groups:  # by first use
            runs = group.windows // 20
            use = {int(run): int(np.flatnonzero(runs == run)[0]) for run in np.unique(runs)}
            chains = _touching(sorted((20 * run, 20 * run + 20) for run in use))
            uses = [min(use[run] for run in range(a // 20, b // 20)) for a, b in chains]
            sizes.extend(b - a for _, (a, b) in sorted(zip(uses, chains, strict=True)))
        return sizes

    def epoch_windows() -> list[int]:
        return [int(p) for batch in dataset for p in batch["position"]]

    def expected_windows(epoch: int) -> list[int]:
        steps = simulate_epoch(shuffle, epoch, start)
        return [int(p) for key in sorted(steps) for p in steps[key]]

    def settle() -> None:  # the read sent ahead has finished (a bounded wait, no timing)
        ahead = dataset._epoch_ahead._ahead
        assert ahead is not None
        for _ in range(2000):
            if ahead._started is not None and ahead._started.done() and not ahead.tasks.pending():
                return
            time.sleep(0.005)
        raise AssertionError("the next epoch's first read never finished")

    assert epoch_windows() == expected_windows(0)
    settle()
    assert stats.read_many_sizes == reads(0)  # epoch 1 planned, nothing read for it
    dataset.seek(LoaderPosition(1))
    assert epoch_windows() == expected_windows(1)
    settle()
    # epoch 1's reads, then epoch 2's first one (its first step's 4 windows), before it
    assert sorted(stats.read_many_sizes) == sorted([*reads(0), *reads(1), reads(2)[0]])
    assert reads(2)[0] == 4  # (it may start before epoch 1's last reads: its own gate)
    dataset.seek(LoaderPosition(2))
    assert epoch_windows() == expected_windows(2)
    settle()  # epoch 3's first read, sent ahead in turn
    # epoch 2 did not make its first read again
    made = len(reads(0)) + len(reads(1)) + len(reads(2))
    assert len(stats.read_many_sizes) == made + 1
    dataset.seek(LoaderPosition(5))  # a moved position: epoch 3's read is left unused
    assert epoch_windows() == expected_windows(5)
    settle()
    assert len(stats.read_many_sizes) == made + 1 + len(reads(5)) + 1
