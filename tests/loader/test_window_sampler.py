"""Drawing windows (``loader.window_sampler``): in eligible records, a pure function of
seed, epoch and counter, uniform under each policy and each proposal, equal whichever
index answers (counts in memory, the storage's readers by range)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.temporal import write_bulk

from rangestream import TemporalArrayStorage
from rangestream.errors import CorruptDataError, LoaderConfigError
from rangestream.loader import WindowSampler
from rangestream.loader.orders.window_sampler import CountsIndex, answer, answer_async

FRAME_COUNTS = [3, 10, 1, 6, 8, 2, 12, 5]  # frames >= 5: records 1, 3, 4, 6, 7
ELIGIBLE = [1, 3, 4, 6, 7]
FRAMES = 5


def test_drawn_windows_lie_inside_eligible_records() -> None:
    records, starts = WindowSampler.of_counts(FRAME_COUNTS, FRAMES).draw(
        np.arange(5000), seed=1, epoch=0
    )
    counts = np.asarray(FRAME_COUNTS)
    assert set(records.tolist()) == set(ELIGIBLE)
    assert (starts >= 0).all() and (starts + FRAMES <= counts[records]).all()


def test_a_draw_depends_only_on_seed_epoch_and_counter() -> None:
    sampler = WindowSampler.of_counts(FRAME_COUNTS, FRAMES)
    block = sampler.draw(np.arange(100, 200), seed=4, epoch=2)
    one_by_one = [sampler.draw(np.array([i]), seed=4, epoch=2) for i in range(100, 200)]
    assert block[0].tolist() == [int(r[0]) for r, _ in one_by_one]
    assert block[1].tolist() == [int(s[0]) for _, s in one_by_one]
    other_epoch = sampler.draw(np.arange(100, 200), seed=4, epoch=3)
    assert (block[0] != other_epoch[0]).any() or (block[1] != other_epoch[1]).any()


def test_record_sampling_draws_eligible_records_uniformly() -> None:
    records, _ = WindowSampler.of_counts(FRAME_COUNTS, FRAMES).draw(
        np.arange(50_000), seed=0, epoch=0
    )
    counts = Counter(records.tolist())
    assert all(abs(counts[r] - 10_000) < 400 for r in ELIGIBLE), counts


def test_window_sampling_draws_every_valid_window_uniformly() -> None:
    sampler = WindowSampler.of_counts(FRAME_COUNTS, FRAMES, sampling="window")
    records, starts = sampler.draw(np.arange(63_000), seed=0, epoch=0)
    valid = [(r, s) for r in ELIGIBLE for s in range(FRAME_COUNTS[r] - FRAMES + 1)]
    assert sampler.num_windows == len(valid) == 21
    counts = Counter(zip(records.tolist(), starts.tolist(), strict=True))
    assert set(counts) == set(valid)
    assert all(abs(c - 3_000) < 250 for c in counts.values()), counts


def test_no_eligible_record_is_a_clear_error() -> None:
    with pytest.raises(LoaderConfigError, match=r"no record has 13 frames.*longest: 12"):
        WindowSampler.of_counts(FRAME_COUNTS, 13)


# -- every proposal of the sampler ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("counts", "frames", "sampling", "proposal"),
    [
        (FRAME_COUNTS, FRAMES, "record", "record"),
        ([5, 5, 5, 1, 1, 1, 1, 1, 1, 1], 5, "record", "frame"),
        (FRAME_COUNTS, FRAMES, "window", "frame"),
        ([6] * 8, 5, "window", "record"),
        ([100] + [1] * 2000, 50, "record", "exact"),
        ([100, 60] + [1] * 2000, 50, "window", "exact"),
    ],
)
def test_every_proposal_draws_its_policy_uniformly(
    counts: list[int], frames: int, sampling: str, proposal: str
) -> None:
    """Whichever proposal the histogram selects, each valid window is drawn with the
    policy's probability: 1 / windows (``"window"``), or 1 / (eligible records x the
    record's starts) (``"record"``), checked cell by cell against a numpy count."""
    sampler = WindowSampler.of_counts(counts, frames, sampling=sampling)  # type: ignore[arg-type]
    assert sampler.proposal == proposal
    lengths = np.asarray(counts)
    eligible = np.flatnonzero(lengths >= frames)
    valid = {(int(r), s): 0.0 for r in eligible for s in range(int(lengths[r]) - frames + 1)}
    for record, start in valid:
        spans = int(lengths[record]) - frames + 1
        valid[(record, start)] = (
            1 / len(valid) if sampling == "window" else 1 / (eligible.size * spans)
        )
    draws = int(400 / min(valid.values()))
    records, starts = sampler.draw(np.arange(draws), seed=3, epoch=1)
    seen = Counter(zip(records.tolist(), starts.tolist(), strict=True))
    assert set(seen) == set(valid)
    for cell, probability in valid.items():
        expected = probability * draws
        assert abs(seen[cell] - expected) < 5 * np.sqrt(expected), (cell, seen[cell], expected)


@pytest.mark.parametrize("sampling", ["record", "window"])
def test_the_proposals_asked_per_round_change_the_cost_not_the_windows(sampling: str) -> None:
    counts = np.random.default_rng(5).integers(1, 30, size=300)
    sampler = WindowSampler.of_counts(counts, 12, sampling=sampling)  # type: ignore[arg-type]
    assert sampler.acceptance < 1 and sampler.candidates > 1
    index = CountsIndex(counts)
    draws = [
        answer(sampler.draws(np.arange(500), seed=2, epoch=3, candidates=k), index)
        for k in (1, 3, sampler.candidates)
    ]
    for records, starts in draws[1:]:
        assert np.array_equal(records, draws[0][0]) and np.array_equal(starts, draws[0][1])


def test_a_histogram_that_promises_windows_the_records_lack_fails_by_name() -> None:
    """A hostile index: the histogram counts records of 8 frames, the records have 2."""
    sampler = WindowSampler((np.asarray([8]), np.asarray([4])), 5)
    with pytest.raises(CorruptDataError, match="does not hold the windows"):
        sampler.draw(np.arange(3), seed=0, epoch=0, index=CountsIndex([2, 2, 2, 2]))


# -- drawing from a real record index, read by range ----------------------------------------------
BULK_COUNTS = [np.random.default_rng(31).integers(1, 41, size=n) for n in (1500, 700, 2100)]
BULK_ALL = np.concatenate(BULK_COUNTS)


@pytest.mark.parametrize(("frames", "sampling"), [(20, "record"), (20, "window"), (39, "record")])
def test_draws_from_the_index_read_by_range_equal_draws_from_the_counts(
    tmp_path: Path, frames: int, sampling: str
) -> None:
    """The storage's readers, sync and async, answer a draw's questions by range (an index
    cache of two chunks of 512 records, 4,300 records): the windows equal those drawn
    from the frame counts in memory."""
    url = str(tmp_path / "ds")
    write_bulk(url, BULK_COUNTS)
    storage = TemporalArrayStorage(url, index_cache_bytes=2 * 512 * 24)
    truth = WindowSampler.of_counts(BULK_ALL, frames, sampling=sampling)  # type: ignore[arg-type]
    counters = np.arange(3000, 3400)
    want = truth.draw(counters, seed=9, epoch=4)
    with storage.sync_reader() as reader:
        sampler = WindowSampler(reader.frame_histogram(), frames, sampling=sampling)  # type: ignore[arg-type]
        assert sampler.proposal == truth.proposal
        got = sampler.draw(counters, seed=9, epoch=4, index=reader)

    async def drawn_async() -> tuple[np.ndarray, np.ndarray]:
        async with storage.async_reader() as reader:
            sampler = WindowSampler(await reader.frame_histogram(), frames, sampling=sampling)  # type: ignore[arg-type]
            return await answer_async(sampler.draws(counters, seed=9, epoch=4), reader)

    got_async = asyncio.run(drawn_async())
    for pair in (got, got_async):
        assert np.array_equal(pair[0], want[0]) and np.array_equal(pair[1], want[1])
    assert (BULK_ALL[want[0]] >= frames).all() and (want[1] + frames <= BULK_ALL[want[0]]).all()
