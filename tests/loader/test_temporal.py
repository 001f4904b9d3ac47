from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader import (
    BatchIterableDataset,
    BatchOptions,
    StatefulDataLoader,
    TemporalWindowSource,
    WindowSampler,
)

from .expected import flatten
from .fakes import FakeTemporalStorage

FRAME_COUNTS = [3, 10, 1, 6, 8, 2, 12, 5]  # frames >= 5: records 1, 3, 4, 6, 7
ELIGIBLE = [1, 3, 4, 6, 7]
FRAMES = 5


def windows_of(batch: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """(record, start) of each window, read back from the window's own frames."""
    return [(int(r[0]), int(f[0])) for r, f in zip(batch["record"], batch["frame"], strict=True)]


def test_drawn_windows_lie_inside_eligible_records() -> None:
    records, starts = WindowSampler(FRAME_COUNTS, FRAMES).draw(np.arange(5000), seed=1, epoch=0)
    counts = np.asarray(FRAME_COUNTS)
    assert set(records.tolist()) == set(ELIGIBLE)
    assert (starts >= 0).all() and (starts + FRAMES <= counts[records]).all()


def test_a_draw_depends_only_on_seed_epoch_and_counter() -> None:
    sampler = WindowSampler(FRAME_COUNTS, FRAMES)
    block = sampler.draw(np.arange(100, 200), seed=4, epoch=2)
    one_by_one = [sampler.draw(np.array([i]), seed=4, epoch=2) for i in range(100, 200)]
    assert block[0].tolist() == [int(r[0]) for r, _ in one_by_one]
    assert block[1].tolist() == [int(s[0]) for _, s in one_by_one]
    other_epoch = sampler.draw(np.arange(100, 200), seed=4, epoch=3)
    assert (block[0] != other_epoch[0]).any() or (block[1] != other_epoch[1]).any()


def test_record_sampling_draws_eligible_records_uniformly() -> None:
    records, _ = WindowSampler(FRAME_COUNTS, FRAMES).draw(np.arange(50_000), seed=0, epoch=0)
    counts = Counter(records.tolist())
    assert all(abs(counts[r] - 10_000) < 400 for r in ELIGIBLE), counts


def test_window_sampling_draws_every_valid_window_uniformly() -> None:
    sampler = WindowSampler(FRAME_COUNTS, FRAMES, sampling="window")
    records, starts = sampler.draw(np.arange(63_000), seed=0, epoch=0)
    valid = [(r, s) for r in ELIGIBLE for s in range(FRAME_COUNTS[r] - FRAMES + 1)]
    assert sampler.num_windows == len(valid) == 21
    counts = Counter(zip(records.tolist(), starts.tolist(), strict=True))
    assert set(counts) == set(valid)
    assert all(abs(c - 3_000) < 250 for c in counts.values()), counts


def test_no_eligible_record_is_a_clear_error() -> None:
    with pytest.raises(LoaderConfigError, match=r"no record has 13 frames.*longest: 12"):
        WindowSampler(FRAME_COUNTS, 13)


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
    records, starts = WindowSampler(FRAME_COUNTS, FRAMES).draw(
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
