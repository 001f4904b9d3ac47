"""A weighted mixture through the real loader: proportions, exactly-once, resume, curriculum.

The expected global order comes from :class:`MixedOrder` built afresh from the same mixture
(its prefix bound, bijectivity and curriculum are tested on their own in
``test_mixing.py``), then cut into batches by plain slicing; the loader must reproduce it
batch for batch over ranks, workers and resumes.
"""

from __future__ import annotations

import json
from pathlib import Path
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
    StatefulDataLoader,
)
from rangestream.loader.geometry import WindowGeometry
from rangestream.loader.mixed import MixedSource
from rangestream.loader.mixing import MixedOrder
from rangestream.loader.mixture import Mixture, MixtureSource

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
        world_size=1, names={a: "web", b: "code"}, drop_last=True,
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
    with pytest.raises(LoaderConfigError, match="shuffle"):
        StatefulDataLoader.from_storages({a: 0.5, b: 0.5}, sequence_length=8, shuffle="block")
