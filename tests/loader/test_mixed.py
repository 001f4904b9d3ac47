"""A weighted mixture through the real loader: proportions, exactly-once, resume, curriculum.

The expected global order comes from :class:`MixedOrder` built afresh from the same mixture
(its prefix bound, bijectivity and curriculum are tested on their own in
``test_mixing.py``), then cut into batches by plain slicing; the loader must reproduce it
batch for batch over ranks, workers and resumes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError, StateError
from rangestream.io.range_reader import DEFAULT_COALESCE_GAP
from rangestream.layout.block import ArrayLayout
from rangestream.loader import (
    BatchIterableDataset,
    BatchOptions,
    IndexedSource,
    LoaderPosition,
    StatefulDataLoader,
)
from rangestream.loader.mixing.mixed_order import MixedOrder
from rangestream.loader.mixing.mixed_source import MixedSource
from rangestream.loader.mixing.mixture import Mixture, MixtureSource
from rangestream.loader.orders.geometry import WindowGeometry
from rangestream.loader.orders.phases import EpochPosition, reader_region

from .fakes import FakeStreamDataset, FakeStreamStorage

WINDOW = 4
OFFSET = 1_000_000  # source s holds tokens s * OFFSET + k: a window names its source


def fake_sources(sizes: list[int]) -> dict[str, IndexedSource]:
    sources = {}
    for number, size in enumerate(sizes):
        storage = FakeStreamStorage(size * WINDOW)
        storage.tokens += number * OFFSET
        sources[f"s{number}"] = IndexedSource(FakeStreamDataset(storage, WINDOW), shuffle=False)
    return sources


def mixed_loader(
    sizes: list[int],
    weights: list[float],
    *,
    rank: int = 0,
    world_size: int = 1,
    batch_size: int = 3,
    num_workers: int = 0,
    drop_last: bool = False,
    num_samples: int | None = None,
) -> StatefulDataLoader:
    sources = fake_sources(sizes)
    source = MixedSource(sources, dict(zip(sources, weights, strict=True)),
                         num_samples=num_samples, seed=11)  # fmt: skip
    options = BatchOptions(batch_size=batch_size, rank=rank, world_size=world_size,
                           drop_last=drop_last)  # fmt: skip
    return StatefulDataLoader(BatchIterableDataset(source, options), num_workers=num_workers)


def expected_order(sizes: list[int], weights: list[float], epoch: int = 0) -> list[tuple[int, int]]:
    mixture = Mixture(
        tuple(
            MixtureSource(f"s{n}", size, w)
            for n, (size, w) in enumerate(zip(sizes, weights, strict=True))
        ),
        seed=11,
    )
    order = MixedOrder(mixture)
    sources, samples = order.locate(np.arange(mixture.samples_per_epoch), epoch)
    return list(zip(sources.tolist(), samples.tolist(), strict=True))


def samples_of(batch: dict[str, Any]) -> list[tuple[int, int]]:
    first = batch["tokens"][:, 0].numpy()
    return [(int(t) // OFFSET, int(t) % OFFSET // WINDOW) for t in first]


def global_steps(per_rank: list[list[list[tuple[int, int]]]]) -> list[tuple[int, int]]:
    return [s for step in zip(*per_rank, strict=True) for batch in step for s in batch]


def cut(order: list[tuple[int, int]], steps: int, global_batch: int, start: int = 0) -> list:
    n = len(order)
    return [order[i % n] for i in range(start, start + steps * global_batch)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(5, 40), min_size=2, max_size=4),
    raw_weights=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    world_size=st.integers(1, 3),
    batch_size=st.integers(1, 4),
    resumed_world=st.integers(1, 3),
    resumed_batch=st.integers(1, 4),
    stop=st.floats(0, 1),
)
def test_ranks_load_the_mixture_order_exactly_and_resume_elastically(
    sizes: list[int],
    raw_weights: list[int],
    world_size: int,
    batch_size: int,
    resumed_world: int,
    resumed_batch: int,
    stop: float,
) -> None:
    weights = [w / 10 for w in raw_weights[: len(sizes)]]
    order = expected_order(sizes, weights)
    n = len(order)
    loaders = [
        mixed_loader(sizes, weights, rank=r, world_size=world_size, batch_size=batch_size)
        for r in range(world_size)
    ]
    total_steps = -(-n // (world_size * batch_size))
    k = int(stop * total_steps)
    iterators = [iter(loader) for loader in loaders]
    seen = [[samples_of(next(it)) for _ in range(k)] for it in iterators]
    state = loaders[0].state_dict()
    assert state == json.loads(json.dumps(state))  # plain data
    consumed = k * world_size * batch_size
    assert global_steps(seen) == cut(order, k, world_size * batch_size)
    if consumed >= n:
        return
    resumed = []
    for rank in range(resumed_world):
        loader = mixed_loader(sizes, weights, rank=rank, world_size=resumed_world,
                              batch_size=resumed_batch)  # fmt: skip
        loader.load_state_dict(state)
        resumed.append([samples_of(batch) for batch in loader])
    steps = -(-(n - consumed) // (resumed_world * resumed_batch))
    assert global_steps(resumed) == cut(order, steps, resumed_world * resumed_batch, consumed)
    # every prefix of the epoch holds each source within the mixture's bound of its share
    sources = np.array([s for s, _ in order])
    share = np.asarray(weights) / sum(weights)
    counts = np.cumsum(sources[:, None] == np.arange(len(sizes))[None, :], axis=0)
    prefix = np.arange(1, n + 1)[:, None]
    bound = Mixture(tuple(MixtureSource(f"s{i}", s, w) for i, (s, w) in
                          enumerate(zip(sizes, weights, strict=True)))).bound  # fmt: skip
    assert (np.abs(counts - share[None, :] * prefix) <= bound + 1e-9).all()


def test_two_ranks_with_two_workers_load_each_sample_once_when_weights_follow_sizes() -> None:
    sizes, weights = [30, 18], [0.625, 0.375]  # 30:18 = 0.625:0.375
    per_rank = [
        [samples_of(b) for b in mixed_loader(sizes, weights, rank=r, world_size=2,
                                              batch_size=4, num_workers=2, drop_last=True)]
        for r in range(2)
    ]  # fmt: skip
    loaded = global_steps(per_rank)
    assert sorted(loaded) == sorted([(0, i) for i in range(30)] + [(1, i) for i in range(18)])
    assert loaded == expected_order(sizes, weights)


def test_a_second_epoch_reshuffles_every_source() -> None:
    loader = mixed_loader([20, 10], [2 / 3, 1 / 3], batch_size=5)
    first = [s for batch in loader for s in samples_of(batch)]
    second = [s for batch in loader for s in samples_of(batch)]
    assert first == expected_order([20, 10], [2 / 3, 1 / 3], epoch=0)
    assert second == expected_order([20, 10], [2 / 3, 1 / 3], epoch=1)
    assert sorted(first) == sorted(second) and first != second


def test_set_weights_mid_epoch_takes_over_at_the_next_batch_and_resumes_with_it() -> None:
    sizes = [40, 40]
    loader = mixed_loader(sizes, [0.5, 0.5], batch_size=4, num_workers=2)
    iterator = iter(loader)
    head = [samples_of(next(iterator)) for _ in range(3)]
    loader.set_weights({"s0": 0.9, "s1": 0.1})
    middle = [samples_of(next(iterator)) for _ in range(2)]
    state = loader.state_dict()
    rest = [samples_of(b) for b in iterator]

    mixture = Mixture((MixtureSource("s0", 40, 0.5), MixtureSource("s1", 40, 0.5)), seed=11)
    order = MixedOrder(mixture)
    order.set_weights({"s0": 0.9, "s1": 0.1}, epoch=0, position=12)
    sources, samples = order.locate(np.arange(order.samples_per_epoch), 0)
    expected = list(zip(sources.tolist(), samples.tolist(), strict=True))
    loaded = [s for batch in head + middle + rest for s in batch]
    assert loaded == expected[: len(loaded)]
    assert sum(1 for s, _ in expected[12:32] if s == 0) == 18  # 0.9 of 20

    resumed = mixed_loader(sizes, [0.5, 0.5], batch_size=2, world_size=1)
    resumed.load_state_dict(state)  # built as the saved run was: its curriculum continues
    again = [s for batch in resumed for s in samples_of(batch)]
    assert again == expected[20 : 20 + len(again)]


def test_resuming_with_new_weights_starts_a_phase_at_the_saved_position() -> None:
    first = mixed_loader([40, 40], [0.5, 0.5], batch_size=4)
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    resumed = mixed_loader([40, 40], [0.25, 0.75], batch_size=4)
    resumed.load_state_dict(state)
    rest = [s for batch in resumed for s in samples_of(batch)]
    order = MixedOrder(Mixture((MixtureSource("s0", 40, 0.5), MixtureSource("s1", 40, 0.5)),
                               seed=11))  # fmt: skip
    order.set_weights([0.25, 0.75], epoch=0, position=12)
    sources, samples = order.locate(np.arange(12, order.samples_per_epoch), 0)
    assert rest == list(zip(sources.tolist(), samples.tolist(), strict=True))


def test_a_state_of_other_sources_is_refused() -> None:
    state = mixed_loader([20, 10], [0.5, 0.5]).state_dict()
    with pytest.raises(StateError, match="sizes"):
        mixed_loader([20, 11], [0.5, 0.5]).load_state_dict(state)


# -- real storages ----------------------------------------------------------------------------

TOKENS = np.dtype([("tokens", "<i4")])


def write_windows(
    url: str, options: dict[str, Any], first: int, windows: int, length: int
) -> StreamStorage:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options,
                            chunk_bytes=64, block_bytes=1024)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(first, first + windows * length, dtype="<i4")})
    return storage


def test_from_storages_reads_every_window_of_two_storages_once_with_exact_stats(
    location: Location,
) -> None:
    a = write_windows(location.child("a"), location.storage_options, 0, 42, 8)
    b = write_windows(location.child("b"), location.storage_options, OFFSET, 18, 8)
    loader = StatefulDataLoader.from_storages(
        {a: 0.7, b: 0.3}, sequence_length=8, batch_size=4, num_workers=0, rank=0,
        world_size=1, names={a: "web", b: "code"}, drop_last=True, shuffle="window",
    )  # fmt: skip
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(10)]
    stats = loader.source_stats()
    batches += list(iterator)
    starts = np.concatenate([batch["tokens"][:, 0].numpy() for batch in batches])
    assert sorted(starts.tolist()) == [8 * i for i in range(42)] + [
        OFFSET + 8 * i for i in range(18)
    ]
    assert stats["web"]["samples"] == 28 and stats["code"]["samples"] == 12  # 0.7 / 0.3 of 40
    # requests: the open, then one coalesced read per source for each stretch: the lead-in
    # batch alone, then stretches of 8 batches (the default prefetch of 64 holds two
    # stretches of 32 samples), by the window arithmetic of the shuffle module
    stretches = [batches[:1]] + [batches[i : i + 8] for i in range(1, len(batches), 8)]
    geometry_requests = {"web": 1, "code": 1}
    for stretch in stretches:
        starts = np.concatenate([batch["tokens"][:, 0].numpy() for batch in stretch])
        for name, first in (("web", 0), ("code", OFFSET)):
            mine = starts[(starts >= first) & (starts < first + OFFSET)] - first
            geometry_requests[name] += _requests_of(mine // 8)
    final = loader.source_stats()
    assert {name: final[name]["requests"] for name in final} == geometry_requests


def _requests_of(windows: np.ndarray) -> int:
    """Range requests of one read of ``windows`` (of 8 tokens) as the read path makes them
    (whole inner chunks, one range per block, merged within the coalescing gap)."""
    if not windows.size:
        return 0
    layout = ArrayLayout.for_sizes(TOKENS, (), chunk_bytes=64, block_bytes=1024)
    geometry = WindowGeometry(stream_bounds=(0, 8 * 42), block_rows=layout.block_rows,
                              chunk_rows=layout.chunk_rows,
                              stored_chunk_bytes=layout.stored_chunk_nbytes, stride=8,
                              window_length=8, coalesce_gap_bytes=DEFAULT_COALESCE_GAP)  # fmt: skip
    return geometry.requests(windows)


def test_from_storages_refuses_storages_of_other_sample_shapes(tmp_path: Path) -> None:
    a = write_windows(str(tmp_path / "a"), {}, 0, 10, 8)
    b = write_windows(str(tmp_path / "b"), {}, 0, 10, 8)
    with pytest.raises(LoaderConfigError, match="one length"):
        StatefulDataLoader.from_storages({a: 0.5, b: 0.5}, sequence_length=8,
                                         per_source={b: {"sequence_length": 4}})  # fmt: skip
    with pytest.raises(LoaderConfigError, match="both named"):
        StatefulDataLoader.from_storages({a: 0.5, b: 0.5}, sequence_length=8,
                                         names={a: "x", b: "x"})  # fmt: skip
    with pytest.raises(LoaderConfigError, match="shuffle must be"):
        StatefulDataLoader.from_storages({a: 0.5, b: 0.5}, sequence_length=8, shuffle="runs")


# -- each source with its own block shuffle ------------------------------------------------


def block_mixed_dataset(
    sizes: list[int], weights: list[float], *, rank: int, world: int, batch: int,
    drop_last: bool, run_windows: int, buffer_runs: int,
) -> BatchIterableDataset:  # fmt: skip
    sources = fake_sources(sizes)
    source = MixedSource(
        sources, dict(zip(sources, weights, strict=True)), seed=11, shuffle="block",
        run_windows=[run_windows] * len(sizes), buffer_runs=[buffer_runs] * len(sizes),
    )  # fmt: skip
    options = BatchOptions(batch_size=batch, rank=rank, world_size=world, drop_last=drop_last)
    return BatchIterableDataset(source, options)


def load_as_workers(
    dataset: BatchIterableDataset, workers: int, monkeypatch: pytest.MonkeyPatch
) -> dict[int, list[tuple[int, int]]]:
    """``step -> samples`` of one rank, each worker's share loaded as that worker would."""
    dataset.tag_steps()
    dataset.iterated_by_loader(True)  # as the loader's workers iterate it
    dataset.workers_per_rank = workers
    out = {}
    for worker in range(workers):
        info = SimpleNamespace(id=worker, num_workers=workers)
        monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda info=info: info)
        for step, batch, _ in (tagged for bundle in dataset for tagged in bundle):
            out[step] = samples_of(batch)
    monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda: None)
    return out


def expected_sources(
    order: MixedOrder, position: EpochPosition, rank: int, worker: int, batch: int
) -> dict[int, list[int]]:
    """``step -> sources`` of a reader: its region of the global order, cut into steps."""
    steps, intervals = reader_region(order.samples_per_epoch, position, rank=rank,
                                     worker_id=worker)  # fmt: skip
    positions = np.concatenate([np.arange(low, high) for low, high in intervals] or [[]])
    sources = order.draws(positions.astype(np.int64), 0)[0].tolist() if positions.size else []
    workers = position.phase.num_workers
    return {
        int(steps[0]) + k * workers: sources[k * batch : (k + 1) * batch]
        for k in range(len(sources) // batch)
    }


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(4, 60), min_size=2, max_size=3),
    world=st.integers(1, 3), batch=st.integers(1, 4), workers=st.integers(1, 3),
    run_windows=st.integers(1, 9), buffer_runs=st.integers(1, 4), stop=st.floats(0, 1),
    new_world=st.integers(1, 3), new_batch=st.integers(1, 4), new_workers=st.integers(1, 3),
)  # fmt: skip
def test_a_block_shuffled_mixture_loads_each_window_once_and_resumes_elastically(
    monkeypatch: pytest.MonkeyPatch, sizes: list[int], world: int, batch: int, workers: int,
    run_windows: int, buffer_runs: int, stop: float, new_world: int, new_batch: int,
    new_workers: int,
) -> None:  # fmt: skip
    weights = [size / sum(sizes) for size in sizes]  # about every window once per epoch
    mixture = Mixture(tuple(MixtureSource(f"s{s}", size, w) for s, (size, w) in
                            enumerate(zip(sizes, weights, strict=True))), seed=11)  # fmt: skip
    n, quotas = mixture.samples_per_epoch, mixture.quotas
    assert all(q <= size for q, size in zip(quotas, sizes, strict=True))  # no repeats
    if n < world * batch:
        return
    order = MixedOrder(mixture)
    first = EpochPosition.start(world_size=world, batch_size=batch, num_workers=workers,
                                drop_last=True)  # fmt: skip
    loaded: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for rank in range(world):
        dataset = block_mixed_dataset(sizes, weights, rank=rank, world=world, batch=batch,
                                      drop_last=True, run_windows=run_windows,
                                      buffer_runs=buffer_runs)  # fmt: skip
        dataset.seek(LoaderPosition(0, 0, first))
        for step, samples in load_as_workers(dataset, workers, monkeypatch).items():
            loaded[(rank, step)] = samples
        for worker in range(workers):  # each position takes the source the interleave says
            for step, sources in expected_sources(order, first, rank, worker, batch).items():
                assert [s for s, _ in loaded[(rank, step)]] == sources
    steps = n // (world * batch)
    epoch = [s for samples in loaded.values() for s in samples]
    assert len(epoch) == len(set(epoch)) == steps * world * batch  # nothing twice
    assert all(0 <= i < sizes[s] for s, i in epoch)

    k = int(stop * steps)
    after = first.advance(k).resume(world_size=new_world, batch_size=new_batch,
                                    num_workers=new_workers, drop_last=False)  # fmt: skip
    rest = []
    for rank in range(new_world):
        dataset = block_mixed_dataset(sizes, weights, rank=rank, world=new_world,
                                      batch=new_batch, drop_last=False, run_windows=run_windows,
                                      buffer_runs=buffer_runs)  # fmt: skip
        dataset.seek(LoaderPosition(0, after.consumed_samples, after))
        for samples in load_as_workers(dataset, new_workers, monkeypatch).values():
            rest.extend(samples)
    seen = [s for (_, step), samples in loaded.items() if step < k for s in samples]
    both = set(seen) | set(rest)
    # every source drawn its quota of distinct windows, resumed elastically; only the
    # padding of the last global batch repeats
    assert [sum(1 for s, _ in both if s == number) for number in range(len(sizes))] == list(quotas)
    assert len(seen) + len(rest) - n < new_world * new_batch


@pytest.mark.parametrize("stop", [1, 3, 5])
def test_a_block_shuffled_mixture_worker_resumes_from_its_own_state_exactly(
    monkeypatch: pytest.MonkeyPatch, stop: int
) -> None:
    sizes, weights = [30, 20], [0.6, 0.4]

    def dataset() -> BatchIterableDataset:
        return block_mixed_dataset(sizes, weights, rank=0, world=1, batch=2, drop_last=True,
                                   run_windows=3, buffer_runs=2)  # fmt: skip

    info = SimpleNamespace(id=1, num_workers=2)  # a torchdata per-worker state
    monkeypatch.setattr("rangestream.loader.iterable.get_worker_info", lambda: info)
    whole = [samples_of(batch) for batch in dataset()]
    assert len(whole) > 5
    interrupted = dataset()
    batches = iter(interrupted)
    seen = [samples_of(next(batches)) for _ in range(stop)]
    state = interrupted.state_dict()
    del batches
    assert state["worker_batches"] == stop and state["num_workers"] == 2
    resumed = dataset()
    resumed.load_state_dict(state)
    assert seen + [samples_of(batch) for batch in resumed] == whole


def test_from_storages_defaults_to_block_shuffles_over_object_storage(
    location: Location,
) -> None:
    a = write_windows(location.child("a"), location.storage_options, 0, 300, 8)
    b = write_windows(location.child("b"), location.storage_options, OFFSET, 200, 8)
    per_rank = []
    for rank in range(2):
        loader = StatefulDataLoader.from_storages(
            {a: 0.6, b: 0.4}, sequence_length=8, batch_size=5, num_workers=2, rank=rank,
            world_size=2, names={a: "a", b: "b"}, drop_last=True,
        )  # fmt: skip
        per_rank.append([batch["tokens"][:, 0].tolist() for batch in loader])
        stats = loader.source_stats()
    state = loader.state_dict()
    assert state["shuffle"] == ("block" if location.is_s3 else True)
    starts = sorted(s for batches in per_rank for batch in batches for s in batch)
    assert starts == [8 * i for i in range(300)] + [OFFSET + 8 * i for i in range(200)]
    requests = sum(one["requests"] for one in stats.values())
    if location.is_s3:  # runs read whole: far fewer requests than the rank's 250 windows
        assert requests < 250 / 4
