"""Epoch orders as reads: exactly once, resumable and elastic, bounded, and cheap in requests.

Ground truths are computed here from first principles: what every window of an epoch is
(``arange(n)``), how many steps a phase has (integer arithmetic), which run a window belongs
to (``window // run_windows``), and how many range requests a read makes (the storage
reader's own counters).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location

from rangestream import StreamDataset, StreamNumpyFormat, StreamStorage
from rangestream.errors import LoaderConfigError, StateError
from rangestream.layout.block import ArrayLayout
from rangestream.loader import EpochPlan, Permutation
from rangestream.loader.orders.block_shuffle import (
    BlockShuffle,
    EpochPosition,
    Phase,
    RunRead,
    WindowGeometry,
    WindowShuffle,
    _inverse,
    buffer_runs_for,
    run_windows_for,
    simulate_epoch,
)

PROPERTIES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

settings_strategy = st.tuples(
    st.integers(1, 4),  # world size
    st.integers(1, 6),  # batch size
    st.integers(0, 3),  # DataLoader workers (0: the main process)
)
shuffles = st.builds(
    BlockShuffle,
    num_windows=st.integers(0, 400),
    seed=st.integers(0, 2**40),
    run_windows=st.integers(1, 40),
    buffer_runs=st.integers(1, 6),
)


def steps_of(n: int, global_batch: int, drop_last: bool) -> int:
    if n <= 0:
        return 0
    return n // global_batch if drop_last else -(-n // global_batch)


def emitted(batches: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    if not batches:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([batches[key] for key in sorted(batches)])


def consumed_before(
    batches: dict[tuple[int, int], np.ndarray], steps: int
) -> dict[tuple[int, int], np.ndarray]:
    return {key: value for key, value in batches.items() if key[1] < steps}


def start(world: int, batch: int, workers: int, drop_last: bool) -> EpochPosition:
    return EpochPosition.start(
        world_size=world, batch_size=batch, num_workers=workers, drop_last=drop_last
    )


# -- the inverse permutation and the order --------------------------------------------------


def test_inverse_undoes_the_permutation_for_every_size_up_to_600() -> None:
    for n in range(1, 601):
        permutation = Permutation(n, seed=n, epoch=n % 5)
        positions = np.arange(n)
        assert np.array_equal(_inverse(permutation, permutation(positions)), positions), n


def test_inverse_undoes_the_permutation_of_a_huge_domain() -> None:
    permutation = Permutation(2**41 + 3, seed=9, epoch=1)
    positions = np.random.default_rng(1).integers(0, 2**41 + 3, 10_000)
    assert np.array_equal(_inverse(permutation, permutation(positions)), positions)


@PROPERTIES
@given(shuffle=shuffles, epoch=st.integers(0, 5))
def test_the_order_holds_every_window_once(shuffle: BlockShuffle, epoch: int) -> None:
    n = shuffle.num_windows
    order = shuffle.window_at(epoch, np.arange(n))
    assert np.array_equal(np.sort(order), np.arange(n))


@PROPERTIES
@given(shuffle=shuffles, epoch=st.integers(0, 5))
def test_the_order_is_cut_into_buffers_of_k_whole_runs(shuffle: BlockShuffle, epoch: int) -> None:
    r, k, n = shuffle.run_windows, shuffle.buffer_runs, shuffle.num_windows
    run_sizes = Counter((np.arange(n) // r).tolist())
    open_runs: Counter[int] = Counter()
    runs_in_buffer: set[int] = set()
    for window in shuffle.window_at(epoch, np.arange(n)).tolist():
        run = window // r
        if run not in runs_in_buffer:
            assert len(runs_in_buffer) < k, "a buffer took more than K runs"
            runs_in_buffer.add(run)
        open_runs[run] += 1
        if len(runs_in_buffer) == k and all(open_runs[x] == run_sizes[x] for x in runs_in_buffer):
            runs_in_buffer.clear()  # a full buffer of complete runs ends here
    # the last buffer may hold fewer runs, but only whole ones
    assert all(open_runs[x] == run_sizes[x] for x in runs_in_buffer)


def test_windows_of_a_buffer_are_mixed_across_its_runs() -> None:
    shuffle = BlockShuffle(num_windows=64 * 200, seed=3, run_windows=64, buffer_runs=8)
    runs = shuffle.window_at(0, np.arange(shuffle.num_windows)) // 64
    same_run_neighbours = float(np.mean(runs[1:] == runs[:-1]))
    # uniform within a buffer of 8 runs of 64: (64 - 1) / (512 - 1) = 0.123
    assert 0.09 < same_run_neighbours < 0.16


def test_each_epoch_orders_runs_and_buffers_differently() -> None:
    shuffle = BlockShuffle(num_windows=5000, seed=1, run_windows=50, buffer_runs=4)
    orders = {tuple(shuffle.window_at(epoch, np.arange(5000))[:200]) for epoch in range(6)}
    assert len(orders) == 6


# -- exactly once over ranks and workers ---------------------------------------------------


@PROPERTIES
@given(shuffle=shuffles, setting=settings_strategy, drop_last=st.booleans())
def test_an_epoch_loads_every_window_once_over_ranks_and_workers(
    shuffle: BlockShuffle, setting: tuple[int, int, int], drop_last: bool
) -> None:
    world, batch, workers = setting
    n = shuffle.num_windows
    batches = simulate_epoch(shuffle, 2, start(world, batch, workers, drop_last))
    steps = steps_of(n, world * batch, drop_last)
    assert sorted(batches) == [(rank, s) for rank in range(world) for s in range(steps)]
    counts = np.bincount(emitted(batches), minlength=n)
    assert counts.sum() == steps * world * batch
    if drop_last:
        assert counts.max(initial=0) <= 1
    else:
        assert counts.min(initial=1) >= 1
        # padding wraps to the start of the epoch: at most one extra sighting per window
        assert counts.max(initial=0) <= 1 + -(-(steps * world * batch - n) // max(n, 1))


@PROPERTIES
@given(shuffle=shuffles, setting=settings_strategy, stop=st.floats(0, 1))
def test_worker_w_builds_the_remaining_steps_congruent_to_w(
    shuffle: BlockShuffle, setting: tuple[int, int, int], stop: float
) -> None:
    """The DataLoader's round robin (worker 0 first) then yields steps in order."""
    world, batch, workers = setting
    whole = steps_of(shuffle.num_windows, world * batch, True)
    taken = int(stop * whole)
    position = start(world, batch, workers, True).advance(taken)
    steps = whole - taken
    for worker in range(max(1, workers)):
        plan = shuffle.worker_plan(0, position, rank=world - 1, worker_id=worker)
        assert plan.steps.tolist() == list(range(worker, steps, max(1, workers)))
        assert [step for step, _ in plan.batches()] == plan.steps.tolist()


def test_the_order_does_not_depend_on_the_rank_layout_but_the_split_does() -> None:
    shuffle = BlockShuffle(num_windows=3000, seed=4, run_windows=25, buffer_runs=4)
    one = simulate_epoch(shuffle, 0, start(1, 10, 1, True))
    two = simulate_epoch(shuffle, 0, start(2, 5, 1, True))
    # a single reader walks the order itself
    np.testing.assert_array_equal(emitted(one), shuffle.window_at(0, np.arange(3000)))
    assert sorted(emitted(two).tolist()) == list(range(3000))
    # two ranks walk halves of it: rank 1 starts in the middle
    np.testing.assert_array_equal(two[(1, 0)], shuffle.window_at(0, np.arange(1500, 1505)))


# -- resuming --------------------------------------------------------------------------------


@PROPERTIES
@given(
    shuffle=shuffles,
    setting=settings_strategy,
    drop_last=st.booleans(),
    stop=st.floats(0, 1),
)
def test_resuming_with_the_same_setting_continues_the_same_order(
    shuffle: BlockShuffle,
    setting: tuple[int, int, int],
    drop_last: bool,
    stop: float,
) -> None:
    world, batch, workers = setting
    position = start(world, batch, workers, drop_last)
    whole = simulate_epoch(shuffle, 1, position)
    steps = steps_of(shuffle.num_windows, world * batch, drop_last)
    taken = int(stop * steps)
    saved = EpochPosition.from_state_dict(position.advance(taken).state_dict())
    resumed = saved.resume(world_size=world, batch_size=batch, num_workers=workers,
                           drop_last=drop_last)  # fmt: skip
    assert resumed == position.advance(taken)
    rest = simulate_epoch(shuffle, 1, resumed)  # steps numbered from the resume point
    assert sorted(rest) == sorted((rank, s - taken) for rank, s in whole if s >= taken)
    for (rank, step), windows in rest.items():
        np.testing.assert_array_equal(windows, whole[(rank, step + taken)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shuffle=shuffles,
    phases=st.lists(st.tuples(settings_strategy, st.floats(0, 1)), min_size=1, max_size=3),
    last=settings_strategy,
    last_drop=st.booleans(),
)
def test_elastic_resume_loads_what_remains_exactly_once(
    shuffle: BlockShuffle,
    phases: list[tuple[tuple[int, int, int], float]],
    last: tuple[int, int, int],
    last_drop: bool,
) -> None:
    """Phases stop at a random step and resume with another world size, batch size and
    worker count; the final phase plays the epoch out. Whole epochs are simulated."""
    n = shuffle.num_windows
    seen: list[np.ndarray] = []
    position: EpochPosition | None = None
    for (world, batch, workers), stop in phases:
        setting = {"world_size": world, "batch_size": batch, "num_workers": workers}
        position = (
            EpochPosition.start(**setting, drop_last=True)
            if position is None
            else position.resume(**setting, drop_last=True)
        )
        remaining = n - sum(len(part) for part in seen)
        steps = steps_of(remaining, world * batch, True)
        assert shuffle.num_steps(position) == steps
        taken = int(stop * steps)
        seen.append(emitted(consumed_before(simulate_epoch(shuffle, 3, position), taken)))
        position = EpochPosition.from_state_dict(position.advance(taken).state_dict())
    world, batch, workers = last
    assert position is not None
    position = position.resume(world_size=world, batch_size=batch, num_workers=workers,
                               drop_last=last_drop)  # fmt: skip
    remaining = n - sum(len(part) for part in seen)
    final = simulate_epoch(shuffle, 3, position)
    steps = steps_of(remaining, world * batch, last_drop)
    assert sorted(final) == [(rank, s) for rank in range(world) for s in range(steps)]
    before = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
    assert np.bincount(before, minlength=n).max(initial=0) <= 1
    counts = np.bincount(np.concatenate([before, emitted(final)]), minlength=n)
    assert counts.sum() == len(before) + steps * world * batch
    if last_drop:
        assert counts.max(initial=0) <= 1
        assert n - int((counts > 0).sum()) == remaining - steps * world * batch
    else:
        assert counts.min(initial=1) >= 1


@PROPERTIES
@given(shuffle=shuffles, setting=settings_strategy, stop=st.floats(0, 1))
def test_padding_wraps_around_to_the_start_of_the_order(
    shuffle: BlockShuffle, setting: tuple[int, int, int], stop: float
) -> None:
    """Also after a resume: the padding is the order's first windows, not the next ones."""
    world, batch, workers = setting
    n = shuffle.num_windows
    first_phase = start(2, 3, 1, True)
    taken = int(stop * steps_of(n, 6, True))
    before = emitted(consumed_before(simulate_epoch(shuffle, 4, first_phase), taken))
    position = first_phase.advance(taken).resume(
        world_size=world, batch_size=batch, num_workers=workers, drop_last=False
    )
    left = n - len(before)
    pad = steps_of(left, world * batch, False) * world * batch - left
    sightings = Counter(emitted(simulate_epoch(shuffle, 4, position)).tolist())
    extra = sightings + Counter(before.tolist()) - Counter(range(n))
    order = shuffle.window_at(4, np.arange(n), position).tolist()
    expected = Counter(order[: pad % n]) + Counter(order * (pad // n)) if n else Counter()
    assert extra == expected


def test_elastic_resume_without_drop_last_still_sees_every_window() -> None:
    shuffle = BlockShuffle(num_windows=1001, seed=8, run_windows=30, buffer_runs=3)
    first = start(3, 7, 2, False)
    taken = 20
    before = emitted(consumed_before(simulate_epoch(shuffle, 0, first), taken))
    second = first.advance(taken).resume(world_size=2, batch_size=9, num_workers=3,
                                         drop_last=False)  # fmt: skip
    after = emitted(simulate_epoch(shuffle, 0, second))
    counts = np.bincount(np.concatenate([before, after]), minlength=1001)
    assert counts.min() >= 1
    assert len(np.unique(before)) == len(before) == taken * 21
    left = 1001 - taken * 21
    assert len(after) == -(-left // 18) * 18
    assert set(after.tolist()) >= set(range(1001)) - set(before.tolist())


def test_remaining_lists_what_was_not_consumed() -> None:
    shuffle = BlockShuffle(num_windows=500, seed=2, run_windows=10, buffer_runs=2)
    position = start(2, 4, 2, True)
    batches = simulate_epoch(shuffle, 0, position)
    consumed = emitted(consumed_before(batches, 9))
    remaining = shuffle.remaining(position.advance(9))
    left = np.concatenate([shuffle.window_at(0, np.arange(a, b), position) for a, b in remaining])
    assert sorted(np.concatenate([consumed, left]).tolist()) == list(range(500))


def test_a_phase_that_claims_more_steps_than_it_has_is_refused() -> None:
    shuffle = BlockShuffle(num_windows=100, seed=0, run_windows=10, buffer_runs=2)
    with pytest.raises(StateError, match="took more steps"):
        shuffle.num_steps(start(1, 10, 1, True).advance(11))


def test_position_state_is_plain_ints_and_round_trips() -> None:
    position = start(4, 8, 2, True).advance(5).resume(
        world_size=2, batch_size=16, num_workers=3, drop_last=True
    ).advance(2)  # fmt: skip
    state = position.state_dict()
    assert state == {"phases": [[4, 8, 2, 1, 5], [2, 16, 3, 1, 2]]}
    assert EpochPosition.from_state_dict(state) == position
    assert position.consumed_samples == 5 * 32 + 2 * 32


def test_resuming_a_phase_that_took_no_step_replaces_it() -> None:
    position = start(4, 8, 2, True).resume(world_size=2, batch_size=8, num_workers=1,
                                           drop_last=True)  # fmt: skip
    assert position.phases == (Phase(2, 8, 1, True, 0),)


def test_a_malformed_state_is_refused() -> None:
    with pytest.raises(StateError, match="malformed"):
        EpochPosition.from_state_dict({"phases": [[1, 2, 3]]})


# -- memory and requests -------------------------------------------------------------------


@PROPERTIES
@given(shuffle=shuffles, setting=settings_strategy, drop_last=st.booleans())
def test_a_read_group_holds_at_most_one_buffer_and_reads_each_window_once(
    shuffle: BlockShuffle, setting: tuple[int, int, int], drop_last: bool
) -> None:
    world, batch, workers = setting
    position = start(world, batch, workers, drop_last)
    r, k = shuffle.run_windows, shuffle.buffer_runs
    for rank in range(world):
        for worker in range(max(1, workers)):
            plan = shuffle.worker_plan(0, position, rank=rank, worker_id=worker)
            for group in plan.groups():
                runs = {int(w) // r for w in group.windows}
                assert len(runs) <= k
                assert len(np.unique(group.windows)) <= k * r
                read = np.concatenate([read.windows for read in group.reads])
                assert sorted(read.tolist()) == sorted(set(group.windows.tolist()))
                for read_run in group.reads:
                    assert {int(w) // r for w in read_run.windows} == {read_run.start // r}
                    assert read_run.start % r == 0
                    assert read_run.stop == min(read_run.start + r, shuffle.num_windows)
                    first = np.flatnonzero(group.windows // r == read_run.start // r)[0]
                    assert read_run.first_use == first
                uses = [read_run.first_use for read_run in group.reads]
                assert uses == sorted(uses)


TOKEN_ROW = np.dtype("<i4")
FOUR_MIB_LAYOUT = ArrayLayout.for_sizes(TOKEN_ROW, (), chunk_bytes=1024, block_bytes=4 << 20)


def token_geometry(shard_tokens: list[int]) -> WindowGeometry:
    """2,048-token windows (2,049 with the next token) over 4 MiB blocks of 1 KiB chunks."""
    return WindowGeometry(
        stream_bounds=tuple(np.cumsum([0, *shard_tokens]).tolist()),
        block_rows=FOUR_MIB_LAYOUT.block_rows,
        chunk_rows=FOUR_MIB_LAYOUT.chunk_rows,
        stored_chunk_bytes=FOUR_MIB_LAYOUT.stored_chunk_nbytes,
        stride=2048,
        window_length=2049,
    )


@pytest.mark.parametrize("tokens", [12_000_000, 60_000_000])
def test_one_rank_with_two_workers_needs_under_a_hundredth_of_a_request_per_window(
    tokens: int,
) -> None:
    rng = np.random.default_rng(tokens)
    cuts = np.sort(rng.choice(tokens, 7, replace=False))
    geometry = token_geometry(np.diff(np.concatenate([[0], cuts, [tokens]])).tolist())
    shuffle = BlockShuffle(
        geometry.num_windows, seed=0, run_windows=run_windows_for(geometry), buffer_runs=4
    )
    windows = requests = 0
    for worker in range(2):
        plan = shuffle.worker_plan(0, start(1, 8, 2, True), rank=0, worker_id=worker)
        for group in plan.groups():
            windows += len(group.windows)
            requests += sum(geometry.requests(read.windows) for read in group.reads)
    assert windows == geometry.num_windows // 8 * 8
    assert requests / windows <= 0.01


def blocks_touched(bounds: list[int], block_rows: int, start: int, stop: int) -> int:
    """Objects (shard, block) that elements [start, stop) touch, counted shard by shard."""
    count = 0
    for low, high in itertools.pairwise(bounds):
        a, b = max(start, low), min(stop, high)
        if a < b:
            count += (b - 1 - low) // block_rows - (a - low) // block_rows + 1
    return count


def test_a_span_read_costs_one_request_per_block_it_touches() -> None:
    shards = [3_000_000, 5_123_457, 0, 7_000_001]
    geometry = token_geometry(shards)
    bounds = np.cumsum([0, *shards]).tolist()
    shuffle = BlockShuffle(geometry.num_windows, seed=2, run_windows=run_windows_for(geometry),
                           buffer_runs=8)  # fmt: skip
    # twelve readers after a resume with another setting: the second phase's regions cut
    # the buffers (the first phase's cut them at its own regions), so partial runs
    position = (
        start(2, 8, 1, True)
        .advance(40)
        .resume(world_size=4, batch_size=8, num_workers=3, drop_last=True)
    )
    partial = sparse = 0
    for rank in range(4):
        for worker in range(3):
            plan = shuffle.worker_plan(1, position, rank=rank, worker_id=worker)
            for group in plan.groups():
                for read in group.reads:
                    first, last = read.span[0], read.span[-1]
                    expected = blocks_touched(
                        bounds, geometry.block_rows, first * 2048, last * 2048 + 2049
                    )
                    assert geometry.requests(np.asarray(read.span)) == expected
                    assert expected <= 2
                    partial += not read.whole
                    chosen = np.asarray(read.request_windows)
                    if len(read.windows) * 16 >= len(read.span):
                        np.testing.assert_array_equal(chosen, np.arange(first, last + 1))
                    else:  # a sliver of the run: its windows alone
                        np.testing.assert_array_equal(chosen, read.windows)
                        sparse += 1
    assert partial > sparse > 0


def test_a_partial_run_is_read_as_its_span_down_to_a_sixteenth_of_it() -> None:
    assert RunRead(0, 40, np.array([3, 18])).request_windows == range(3, 19)  # 2 of 16
    # 2 of 32: exactly a sixteenth, still the span
    assert RunRead(0, 64, np.array([0, 31])).request_windows == range(0, 32)
    # 2 of 33: under a sixteenth, the windows alone
    np.testing.assert_array_equal(RunRead(0, 64, np.array([0, 32])).request_windows, [0, 32])


def test_buffer_runs_are_capped_at_a_readers_share_of_runs() -> None:
    assert buffer_runs_for(10_000, 100, 4) == 8  # 25 runs each: the default cap
    assert buffer_runs_for(10_000, 100, 4, most=30) == 25
    assert buffer_runs_for(10_000, 100, 40) == 2
    assert buffer_runs_for(10_000, 100, 1000) == 1


def test_run_requests_count_windows_that_straddle_blocks_and_shards() -> None:
    # blocks of 10 rows, chunks of 1; shards [0, 23) and [23, 60)
    geometry = WindowGeometry(
        stream_bounds=(0, 23, 60), block_rows=10, chunk_rows=1, stored_chunk_bytes=4,
        stride=4, window_length=5, coalesce_gap_bytes=0,
    )  # fmt: skip
    # window 1 = [4, 9): block 0 of shard 0
    assert geometry.requests([1]) == 1
    # window 2 = [8, 13) crosses into block 1
    assert geometry.requests([2]) == 2
    # windows 0..2 = [0, 13): blocks 0 and 1, one range each
    assert geometry.requests([0, 1, 2]) == 2
    # window 5 = [20, 25): block 2 of shard 0 ([20, 23)) and block 0 of shard 1
    assert geometry.requests([5]) == 2
    # windows 0 and 2 of one block leave no gap ([0, 5) and [8, 10)): gap 3 rows = 12 bytes
    assert geometry.requests([0, 2]) == 3
    assert replace(geometry, coalesce_gap_bytes=12).requests([0, 2]) == 2


def test_a_geometry_with_bounds_that_go_backwards_is_refused() -> None:
    with pytest.raises(LoaderConfigError, match="stream_bounds"):
        WindowGeometry(stream_bounds=(0, 5, 3), block_rows=4, chunk_rows=1,
                       stored_chunk_bytes=4, stride=1, window_length=1)  # fmt: skip


@pytest.mark.parametrize("next_token", [False, True])
def test_geometry_request_counts_equal_the_storage_readers(
    location: Location, next_token: bool
) -> None:
    dtype = np.dtype([("tokens", "<i4")])
    lengths = [137, 1, 0, 455, 290, 64]
    storage = StreamStorage(location.child("ds"), StreamNumpyFormat(dtype),
                            storage_options=location.storage_options,
                            chunk_bytes=40, block_bytes=400)  # fmt: skip
    with storage.sync_writer() as writer:
        for shard, length in enumerate(lengths):
            if length:
                writer.append(shard, {"tokens": np.arange(length, dtype="<i4")})
    layout = ArrayLayout.for_sizes(dtype, (), chunk_bytes=40, block_bytes=400)
    dataset = StreamDataset(storage, sequence_length=12, stride=7, next_token=next_token)
    geometry = WindowGeometry(
        stream_bounds=tuple(np.cumsum([0, *lengths]).tolist()),
        block_rows=layout.block_rows,
        chunk_rows=layout.chunk_rows,
        stored_chunk_bytes=layout.stored_chunk_nbytes,
        stride=7,
        window_length=12 + next_token,
    )
    rng = np.random.default_rng(next_token)
    with dataset.sync_reader() as reader:
        assert len(reader) == geometry.num_windows
        shuffle = BlockShuffle(len(reader), seed=1, run_windows=9, buffer_runs=3)
        plan = shuffle.worker_plan(0, start(1, 4, 1, True), rank=0, worker_id=0)
        reads = [read.windows for group in plan.groups() for read in group.reads]
        reads += [rng.choice(len(reader), rng.integers(1, 9), replace=False) for _ in range(40)]
        for windows in reads:
            before = reader.stats.requests
            reader.read_many(windows.tolist())
            assert reader.stats.requests - before == geometry.requests(windows), windows


# -- the per-window orders through the same interface ------------------------------------------


@PROPERTIES
@given(
    n=st.integers(0, 300),
    setting=settings_strategy,
    drop_last=st.booleans(),
    consumed_steps=st.integers(0, 20),
    shuffle=st.booleans(),
)
def test_window_shuffle_is_todays_permutation_and_plan(
    n: int,
    setting: tuple[int, int, int],
    drop_last: bool,
    consumed_steps: int,
    shuffle: bool,
) -> None:
    world, batch, workers = setting
    order = WindowShuffle(n, seed=6, shuffle=shuffle)
    full = EpochPlan(n, batch, world, 0, drop_last).num_steps
    taken = min(consumed_steps, full)
    position = start(world, batch, workers, drop_last).advance(taken)
    batches = simulate_epoch(order, 2, position)
    for rank in range(world):
        plan = EpochPlan(n, batch, world, rank, drop_last, consumed_samples=taken * world * batch)
        for step in range(plan.num_steps):
            indices = plan.sequence_indices(range(step, step + 1))[0]
            expected = Permutation(n, 6, 2)(indices) if shuffle else indices
            np.testing.assert_array_equal(batches[(rank, step)], expected)
    assert len(batches) == world * steps_of(n - taken * world * batch, world * batch, drop_last)


def test_window_shuffle_reads_each_shuffled_window_alone_and_storage_order_in_runs() -> None:
    position = start(1, 4, 2, True)
    shuffled = WindowShuffle(100, seed=0).worker_plan(0, position, rank=0, worker_id=0)
    group = next(shuffled.groups())
    assert [len(read.windows) for read in group.reads] == [1, 1, 1, 1]
    # listed in the order the batch needs them
    assert [int(read.windows[0]) for read in group.reads] == group.windows.tolist()
    assert [read.first_use for read in group.reads] == [0, 1, 2, 3]
    ordered = WindowShuffle(100, seed=0, shuffle=False).worker_plan(
        0, position, rank=0, worker_id=1, stretch_steps=3
    )
    groups = list(ordered.groups())
    # lead-in step 1, then runs of three steps: 5..7 (12 adjacent windows, one read)
    assert groups[0].steps.tolist() == [1] * 4
    assert [(r.start, r.stop) for r in groups[1].reads] == [(20, 32)]


def test_a_worker_outside_the_setting_is_refused() -> None:
    shuffle = BlockShuffle(100, seed=0, run_windows=10)
    with pytest.raises(LoaderConfigError, match="worker_id"):
        shuffle.worker_plan(0, start(1, 4, 2, True), rank=0, worker_id=2)
    with pytest.raises(LoaderConfigError, match="rank"):
        shuffle.worker_plan(0, start(2, 4, 2, True), rank=2, worker_id=0)
