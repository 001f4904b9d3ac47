from __future__ import annotations

import itertools

import pytest

from rangestream.errors import LoaderConfigError
from rangestream.loader import EpochPlan


def rank_batches(plan: EpochPlan) -> list[list[int]]:
    return plan.sequence_indices(range(plan.num_steps)).tolist()


def global_sequence(
    num_samples: int, batch_size: int, world_size: int, drop_last: bool, consumed: int = 0
) -> list[int]:
    """Every rank's batches of each step, concatenated step by step, rank by rank."""
    plans = [
        EpochPlan(num_samples, batch_size, world_size, rank, drop_last, consumed)
        for rank in range(world_size)
    ]
    steps = {plan.num_steps for plan in plans}
    assert len(steps) == 1, "ranks disagree on the number of steps"
    by_rank = [rank_batches(plan) for plan in plans]
    return [i for step in range(steps.pop()) for batches in by_rank for i in batches[step]]


def test_ranks_cover_a_divisible_epoch_exactly_once() -> None:
    sequence = global_sequence(48, batch_size=4, world_size=3, drop_last=True)
    assert sequence == list(range(48))


def test_rank_takes_a_contiguous_slice_of_every_global_batch() -> None:
    plan = EpochPlan(40, batch_size=4, world_size=2, rank=1)
    assert rank_batches(plan) == [[8 * s + 4, 8 * s + 5, 8 * s + 6, 8 * s + 7] for s in range(5)]


def test_drop_last_skips_only_the_final_incomplete_global_batch() -> None:
    sequence = global_sequence(45, batch_size=4, world_size=2, drop_last=True)
    assert sequence == list(range(40))


def test_without_drop_last_the_last_batch_wraps_to_the_start_of_the_order() -> None:
    sequence = global_sequence(45, batch_size=4, world_size=2, drop_last=False)
    assert sequence == [*range(45), 0, 1, 2]


def test_padding_wraps_repeatedly_when_the_epoch_is_smaller_than_a_global_batch() -> None:
    sequence = global_sequence(3, batch_size=4, world_size=2, drop_last=False)
    assert sequence == [0, 1, 2, 0, 1, 2, 0, 1]


def test_an_epoch_smaller_than_a_global_batch_has_no_steps_with_drop_last() -> None:
    assert EpochPlan(7, batch_size=4, world_size=2, drop_last=True).num_steps == 0


def test_an_empty_epoch_has_no_steps() -> None:
    assert EpochPlan(0, batch_size=4, drop_last=False).num_steps == 0


@pytest.mark.parametrize("num_steps", [0, 1, 5, 6, 7, 12])
@pytest.mark.parametrize("num_workers", [1, 2, 3, 4])
def test_worker_round_robin_reassembles_the_rank_order(num_steps: int, num_workers: int) -> None:
    plan = EpochPlan(num_steps * 2, batch_size=2)
    per_worker = [
        [step for run in plan.worker_stretches(w, num_workers, 1) for step in run]
        for w in range(num_workers)
    ]
    # The DataLoader asks workers 0, 1, ..., W-1, 0, ... and skips exhausted ones.
    collected = [
        step
        for round_steps in itertools.zip_longest(*per_worker)
        for step in round_steps
        if step is not None
    ]
    assert collected == list(range(num_steps))


@pytest.mark.parametrize("num_steps", [0, 1, 5, 6, 7, 12, 13])
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("stretch_steps", [2, 3])
def test_runs_of_consecutive_steps_are_dealt_round_robin_and_cover_every_step_once(
    num_steps: int, num_workers: int, stretch_steps: int
) -> None:
    plan = EpochPlan(num_steps * 2, batch_size=2)
    runs = [list(plan.worker_stretches(w, num_workers, stretch_steps)) for w in range(num_workers)]
    for w, worker_stretches in enumerate(runs):
        if w < num_steps:  # a lead-in of one step per worker
            assert worker_stretches[0] == range(w, w + 1)
            worker_stretches = worker_stretches[1:]
        for k, run in enumerate(worker_stretches):
            assert run.start == num_workers + (k * num_workers + w) * stretch_steps
            assert len(run) == stretch_steps or run.stop == num_steps
    assert sorted(
        step for worker_stretches in runs for run in worker_stretches for step in run
    ) == list(range(num_steps))


def test_run_length_and_worker_are_checked() -> None:
    plan = EpochPlan(10, batch_size=2)
    with pytest.raises(LoaderConfigError, match="stretch_steps"):
        next(plan.worker_stretches(0, 2, 0))
    with pytest.raises(LoaderConfigError, match="worker_id"):
        next(plan.worker_stretches(2, 2, 1))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 3), (2, 4), (3, 2), (4, 5)])
def test_resume_continues_the_same_sequence_with_another_split(
    drop_last: bool, world_size: int, batch_size: int
) -> None:
    num_samples = 53
    consumed = 3 * 8  # three steps of a run with 2 ranks x 4 samples
    sequence = global_sequence(num_samples, batch_size, world_size, drop_last, consumed)
    remaining = num_samples - consumed
    global_batch = world_size * batch_size
    if drop_last:
        expected = list(range(consumed, consumed + remaining // global_batch * global_batch))
    else:
        steps = -(-remaining // global_batch)
        expected = [i % num_samples for i in range(consumed, consumed + steps * global_batch)]
    assert sequence == expected


def test_consumed_past_the_epoch_end_leaves_no_steps() -> None:
    assert EpochPlan(10, batch_size=4, drop_last=False, consumed_samples=12).num_steps == 0


@pytest.mark.parametrize(
    "arguments",
    [
        {"num_samples": -1, "batch_size": 1},
        {"num_samples": 5, "batch_size": 0},
        {"num_samples": 5, "batch_size": 1, "world_size": 0},
        {"num_samples": 5, "batch_size": 1, "world_size": 2, "rank": 2},
        {"num_samples": 5, "batch_size": 1, "consumed_samples": -4},
    ],
)
def test_invalid_plans_are_refused(arguments: dict[str, int]) -> None:
    with pytest.raises(LoaderConfigError):
        EpochPlan(**arguments)  # type: ignore[arg-type]
