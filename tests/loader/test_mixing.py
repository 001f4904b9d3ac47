"""Mixtures: epoch semantics, elastic resume, curriculum phases and counters.

The expected sample of a position is rebuilt one position at a time from the interleave
(tested on its own in ``test_interleave.py``) and :class:`Permutation`, restating the
documented pass and cycle rule; shares are compared in exact rational arithmetic.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rangestream.errors import LoaderConfigError, OutOfRangeError, StateError
from rangestream.loader import EpochPlan, Permutation
from rangestream.loader.mixing.interleave import Interleave
from rangestream.loader.mixing.mixed_order import (
    CYCLE_KEY,
    MixedOrder,
    Mixture,
    MixtureSource,
    ShuffledOrder,
)

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def mixture(weights: dict[str, float], sizes: dict[str, int], **kwargs: int | None) -> Mixture:
    return Mixture.from_weights(weights, sizes, **kwargs)  # type: ignore[arg-type]


def expected_sample(mix: Mixture, source: int, draw: int, epoch: int) -> int:
    """The documented rule: whole passes (fresh shuffles numbered across epochs), then a
    window of the fixed cycle starting at ``epoch * remainder``."""
    size, quota = mix.sizes[source], mix.quotas[source]
    passes, remainder = divmod(quota, size)
    seed = mix.source_seed(source)
    if draw < passes * size:
        return Permutation(size, seed, epoch * passes + draw // size).at(draw % size)
    index = (epoch * remainder + draw - passes * size) % size
    return Permutation(size, seed, CYCLE_KEY).at(index)


@functools.lru_cache(maxsize=64)
def interleave(weights: tuple[float, ...]) -> Interleave:
    return Interleave(weights)


def expected_order(
    mix: Mixture, epoch: int, positions: range, phases: list[tuple[int, list[float]]] | None = None
) -> list[tuple[int, int]]:
    """(source, sample) of each position, one at a time: the interleave of the phase holding
    the position, draws continuing from the earlier phases' counts."""
    phases = phases or [(0, list(mix.weights))]
    out = []
    for position in positions:
        start, weights = max((p for p in phases if p[0] <= position), key=lambda p: p[0])
        offset = np.zeros(len(mix.sources), dtype=np.int64)
        for (begin, earlier), (end, _) in itertools.pairwise(phases):
            if end <= start:
                offset += interleave(tuple(earlier)).counts(end - begin)
        source, draw = interleave(tuple(weights)).sources(np.array([position - start]))
        s = int(source[0])
        out.append((s, expected_sample(mix, s, int(draw[0] + offset[s]), epoch)))
    return out


def located(order: MixedOrder, epoch: int, positions: np.ndarray) -> list[tuple[int, int]]:
    sources, samples = order.locate(positions, epoch)
    return list(zip(sources.tolist(), samples.tolist(), strict=True))


def exact_excess(counts: np.ndarray, lengths: np.ndarray, weights: list[float]) -> np.ndarray:
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    out = []
    for source, share in enumerate(w / total for w in exact):
        out.append(
            max(
                abs(int(c) - share * int(n))
                for c, n in zip(counts[:, source], lengths, strict=True)
            )
        )
    return np.array([float(x) for x in out])


# -- epochs ------------------------------------------------------------------------------


def test_weights_following_sizes_read_every_sample_of_every_source_once_per_epoch() -> None:
    sizes = {"web": 700, "code": 200, "books": 100}
    mix = mixture({name: size / 1000 for name, size in sizes.items()}, sizes)
    assert mix.samples_per_epoch == 1000
    order = MixedOrder(mix)
    for epoch in (0, 1):
        sources, samples = order.locate(np.arange(1000), epoch)
        for index, size in enumerate(sizes.values()):
            assert np.array_equal(np.sort(samples[sources == index]), np.arange(size))


@pytest.mark.parametrize(
    ("weights", "sizes"),
    [
        ({"web": 0.5, "code": 0.3, "books": 0.2}, {"web": 5000, "code": 300, "books": 2000}),
        ({"web": 0.45, "code": 0.35, "books": 0.2}, {"web": 901, "code": 702, "books": 400}),
        ({"a": 0.333, "b": 0.333, "c": 0.334}, {"a": 1000, "b": 999, "c": 5000}),
    ],
)
def test_default_epoch_is_the_longest_whose_shares_fit_without_a_repeated_sample(
    weights: dict[str, float], sizes: dict[str, int]
) -> None:
    mix = mixture(weights, sizes)
    n = mix.samples_per_epoch
    sources, samples = MixedOrder(mix).locate(np.arange(n), 3)
    for index, size in enumerate(sizes.values()):
        mine = samples[sources == index]
        assert mine.size <= size and np.unique(mine).size == mine.size
    # the largest n whose shares fit (w * n <= size) and whose draws fit
    limit = min(
        Fraction(size) / Fraction(repr(w))
        for w, size in zip(weights.values(), sizes.values(), strict=True)
    ) * sum(Fraction(repr(w)) for w in weights.values())
    assert n <= limit
    longer, _ = Interleave(list(weights.values())).sources(np.arange(n + 1))
    exceeds = (np.bincount(longer, minlength=3) > np.array(list(sizes.values()))).any()
    assert n + 1 > limit or exceeds


def test_a_source_smaller_than_its_share_repeats_in_whole_fresh_passes() -> None:
    mix = mixture({"small": 0.5, "big": 0.5}, {"small": 30, "big": 10_000}, num_samples=170)
    assert mix.quotas[0] == 85  # 2 whole passes of 30 and 25 more
    order = MixedOrder(mix)
    passes_seen = []
    for epoch in (0, 1):
        sources, samples = order.locate(np.arange(170), epoch)
        mine = samples[sources == 0]
        first, second, rest = mine[:30], mine[30:60], mine[60:]
        assert np.array_equal(np.sort(first), np.arange(30))
        assert np.array_equal(np.sort(second), np.arange(30))
        assert not np.array_equal(first, second)  # each repeat freshly shuffled
        assert np.unique(rest).size == rest.size == 25
        passes_seen += [first.tolist(), second.tolist()]
    assert len({tuple(p) for p in passes_seen}) == 4  # new passes in the next epoch too


def test_a_source_larger_than_its_share_reads_a_new_window_each_epoch_and_all_over_epochs() -> None:
    mix = mixture({"large": 0.25, "other": 0.75}, {"large": 1000, "other": 10**6}, num_samples=1200)
    quota = mix.quotas[0]
    assert quota == 300
    order = MixedOrder(mix)
    seen: list[np.ndarray] = []
    for epoch in range(math.ceil(1000 / quota)):
        sources, samples = order.locate(np.arange(1200), epoch)
        mine = samples[sources == 0]
        assert np.unique(mine).size == mine.size == quota
        seen.append(mine)
    assert len({tuple(np.sort(s)) for s in seen}) == len(seen)
    assert np.array_equal(np.unique(np.concatenate(seen)), np.arange(1000))


def test_storage_order_reads_a_down_sampled_source_in_contiguous_windows() -> None:
    mix = mixture({"a": 0.5, "b": 0.5}, {"a": 1000, "b": 1000}, num_samples=400)
    order = MixedOrder(mix, shuffle=False)
    for epoch in range(4):
        sources, samples = order.locate(np.arange(400), epoch)
        window = (epoch * 200 + np.arange(200)) % 1000
        assert np.array_equal(samples[sources == 0], window)


weights_and_sizes = st.integers(1, 6).flatmap(
    lambda count: st.tuples(
        st.lists(st.floats(0.001, 1.0), min_size=count, max_size=count),
        st.lists(st.integers(1, 400), min_size=count, max_size=count),
    )
)


@PROPERTY
@given(
    case=weights_and_sizes,
    num_samples=st.one_of(st.none(), st.integers(1, 900)),
    epoch=st.integers(0, 50),
    data=st.data(),
)
def test_each_position_reads_the_documented_sample(
    case: tuple[list[float], list[int]], num_samples: int | None, epoch: int, data: st.DataObject
) -> None:
    weights, sizes = case
    names = [f"s{i}" for i in range(len(weights))]
    mix = mixture(
        dict(zip(names, weights, strict=True)),
        dict(zip(names, sizes, strict=True)),
        num_samples=num_samples,
    )
    n = mix.samples_per_epoch
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, min(n, start + 300)))
    got = located(MixedOrder(mix), epoch, np.arange(start, stop))
    assert got == expected_order(mix, epoch, range(start, stop))


def test_each_source_is_drawn_its_quota_per_epoch() -> None:
    mix = mixture({"a": 0.6, "b": 0.3, "c": 0.1}, {"a": 50, "b": 5000, "c": 7}, num_samples=1234)
    sources, _ = MixedOrder(mix).draws(np.arange(1234), 0)
    assert tuple(np.bincount(sources, minlength=3).tolist()) == mix.quotas


# -- resume --------------------------------------------------------------------------------


@PROPERTY
@given(
    world_size=st.integers(1, 5),
    batch_size=st.integers(1, 9),
    consumed_steps=st.integers(0, 20),
    old_global_batch=st.integers(1, 24),
    epoch=st.integers(0, 3),
)
def test_resuming_with_any_world_size_and_batch_size_reads_the_rest_of_the_epoch_in_order(
    world_size: int, batch_size: int, consumed_steps: int, old_global_batch: int, epoch: int
) -> None:
    mix = mixture({"a": 0.55, "b": 0.3, "c": 0.1, "d": 0.05}, {"a": 90, "b": 40, "c": 300, "d": 9})
    n = mix.samples_per_epoch
    consumed = min(consumed_steps * old_global_batch, n)
    order = MixedOrder(mix)
    state = json.loads(json.dumps(order.state_dict()))
    resumed = MixedOrder(mix)
    resumed.resume(state, epoch=epoch, position=consumed)
    plans = [
        EpochPlan(n, batch_size, world_size, rank, drop_last=True, consumed_samples=consumed)
        for rank in range(world_size)
    ]
    steps = plans[0].num_steps
    by_rank = [resumed.locate(plan.sequence_indices(range(steps)), epoch) for plan in plans]
    got = []
    for step in range(steps):
        for sources, samples in by_rank:
            got += list(zip(sources[step].tolist(), samples[step].tolist(), strict=True))
    end = consumed + steps * batch_size * world_size
    assert got == expected_order(mix, epoch, range(consumed, end))


def test_every_prefix_of_an_epoch_holds_each_source_within_the_bound() -> None:
    weights = {"a": 0.5, "b": 0.25, "c": 0.15, "d": 0.07, "e": 0.03}
    mix = mixture(weights, {name: 10_000 for name in weights}, num_samples=20_000)
    sources, _ = MixedOrder(mix).draws(np.arange(20_000), 0)
    counts = np.vstack([np.zeros(5, np.int64), np.eye(5, dtype=np.int64)[sources].cumsum(0)])
    excess = exact_excess(counts, np.arange(20_001), list(weights.values()))
    assert (excess <= mix.bound + 1e-9).all()
    assert mix.bound < 1


# -- curriculum ----------------------------------------------------------------------------

BASE = {"web": 0.6, "code": 0.3, "math": 0.1}
SIZES = {"web": 5000, "code": 4000, "math": 3000}


def test_a_new_phase_leaves_the_positions_before_it_as_they_were() -> None:
    mix = mixture(BASE, SIZES, num_samples=3000)
    before = MixedOrder(mix)
    changed = MixedOrder(mix)
    changed.set_weights({"web": 0.2, "code": 0.3, "math": 0.5}, epoch=0, position=1234)
    assert located(changed, 0, np.arange(1234)) == located(before, 0, np.arange(1234))
    assert located(changed, 0, np.arange(1234, 3000)) != located(before, 0, np.arange(1234, 3000))


@PROPERTY
@given(
    start=st.integers(0, 2999),
    new=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).filter(lambda w: sum(w) > 0.01),
)
def test_a_new_phase_is_exact_relative_to_its_start(start: int, new: list[float]) -> None:
    mix = mixture(BASE, SIZES, num_samples=3000)
    order = MixedOrder(mix)
    order.set_weights(new, epoch=2, position=start)
    sources, _ = order.draws(np.arange(start, 3000), 2)
    counts = np.vstack([np.zeros(3, np.int64), np.eye(3, dtype=np.int64)[sources].cumsum(0)])
    excess = exact_excess(counts, np.arange(3000 - start + 1), new)
    assert (excess <= Interleave(new).bound + 1e-9).all()


@PROPERTY
@given(
    starts=st.lists(st.integers(1, 2999), min_size=1, max_size=4, unique=True),
    weights=st.lists(
        st.lists(st.floats(0.01, 1.0), min_size=3, max_size=3), min_size=4, max_size=4
    ),
)
def test_draws_continue_across_phases_so_no_sample_repeats_within_the_epoch(
    starts: list[int], weights: list[list[float]]
) -> None:
    # sources large enough that no phase mix can exhaust one within 3000 positions
    mix = mixture(BASE, {"web": 3000, "code": 3000, "math": 3000}, num_samples=3000)
    order = MixedOrder(mix)
    phases = [(0, list(mix.weights))]
    for start, new in zip(sorted(starts), weights, strict=False):
        order.set_weights(new, epoch=1, position=start)
        if new != phases[-1][1]:  # the same weights again continue the phase in force
            phases.append((start, new))
    sources, draws = order.draws(np.arange(3000), 1)
    for source in range(3):
        assert np.array_equal(draws[sources == source], np.arange((sources == source).sum()))
    _, samples = order.locate(np.arange(3000), 1)
    for source in range(3):
        mine = samples[sources == source]
        assert np.unique(mine).size == mine.size
    assert located(order, 1, np.arange(0, 3000, 23)) == expected_order(
        mix, 1, range(0, 3000, 23), phases
    )


def test_the_next_epoch_starts_with_the_weights_in_force() -> None:
    mix = mixture(BASE, SIZES, num_samples=3000)
    order = MixedOrder(mix)
    new = {"web": 0.1, "code": 0.1, "math": 0.8}
    order.set_weights(new, epoch=0, position=1000)
    sources, _ = order.draws(np.arange(3000), 1)
    assert np.bincount(sources, minlength=3).tolist() == [300, 300, 2400]


def test_weights_cannot_change_in_the_past() -> None:
    order = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    order.set_weights([1.0, 1.0, 1.0], epoch=2, position=500)
    with pytest.raises(StateError):
        order.set_weights([1.0, 2.0, 1.0], epoch=2, position=499)
    with pytest.raises(StateError):
        order.set_weights([1.0, 2.0, 1.0], epoch=1, position=2000)
    with pytest.raises(OutOfRangeError):
        order.set_weights([1.0, 2.0, 1.0], epoch=2, position=3001)


def test_resuming_with_new_weights_starts_a_phase_at_the_resume_position() -> None:
    mix = mixture(BASE, SIZES)
    saved = MixedOrder(mix)
    saved.set_weights({"web": 0.5, "code": 0.5, "math": 0.0}, epoch=4, position=800)
    state = json.loads(json.dumps(saved.state_dict()))
    # the new run is built with other weights (so another default epoch length)
    new = {"web": 0.2, "code": 0.2, "math": 0.6}
    resumed = MixedOrder(mixture(new, SIZES))
    resumed.resume(state, epoch=4, position=2100)
    saved.set_weights(new, epoch=4, position=2100)
    assert resumed.samples_per_epoch == saved.samples_per_epoch == mix.samples_per_epoch
    positions = np.arange(0, mix.samples_per_epoch)
    assert located(resumed, 4, positions) == located(saved, 4, positions)


def test_resuming_with_the_same_weights_continues_the_saved_order() -> None:
    mix = mixture(BASE, SIZES)
    saved = MixedOrder(mix)
    saved.set_weights({"web": 0.5, "code": 0.5, "math": 0.0}, epoch=0, position=300)
    resumed = MixedOrder(mix)
    resumed.set_weights({"web": 0.5, "code": 0.5, "math": 0.0}, epoch=0, position=0)
    resumed.resume(saved.state_dict(), epoch=0, position=900)
    positions = np.arange(900, mix.samples_per_epoch)
    assert located(resumed, 0, positions) == located(saved, 0, positions)
    assert resumed.phases == saved.phases


def plain(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain(v) for v in value)
    return type(value) in (int, str)


def test_state_is_plain_ints_and_strings_and_restores_the_same_order() -> None:
    order = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    order.set_weights([0.1, 0.1, 0.8], epoch=7, position=1500)
    state = order.state_dict()
    assert plain(state), state
    text = json.dumps(state)
    restored = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    restored.load_state_dict(json.loads(text))
    positions = np.arange(3000)
    assert located(restored, 7, positions) == located(order, 7, positions)


def test_a_state_of_another_mixture_is_refused() -> None:
    state = MixedOrder(mixture(BASE, SIZES, num_samples=3000)).state_dict()
    for other in (
        mixture(BASE, {**SIZES, "math": 3001}, num_samples=3000),
        mixture(
            {"web": 0.6, "code": 0.3, "maths": 0.1}, {"web": 5000, "code": 4000, "maths": 3000}
        ),
        Mixture(MixedOrder(mixture(BASE, SIZES)).mixture.sources, num_samples=3000, seed=1),
        mixture(BASE, SIZES, num_samples=2999),
    ):
        with pytest.raises(StateError):
            MixedOrder(other).load_state_dict(state)
    with pytest.raises(StateError):
        MixedOrder(mixture(BASE, SIZES, num_samples=3000)).load_state_dict(
            {**state, "phases": [[0, ["1.0", "1.0", "1.0"]], [0, ["1.0", "0.0", "0.0"]]]}
        )


# -- counters ------------------------------------------------------------------------------


@PROPERTY
@given(data=st.data())
def test_source_counts_match_the_realised_positions(data: st.DataObject) -> None:
    order = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    order.set_weights([0.2, 0.2, 0.6], epoch=0, position=data.draw(st.integers(0, 3000)))
    start = data.draw(st.integers(0, 3000))
    stop = data.draw(st.integers(start, 3000))
    sources, _ = order.draws(np.arange(start, stop), 0)
    assert np.array_equal(order.source_counts(0, start, stop), np.bincount(sources, minlength=3))


# -- orders --------------------------------------------------------------------------------


def test_adding_a_source_keeps_each_source_shuffle() -> None:
    two = mixture({"a": 0.5, "b": 0.5}, {"a": 100, "b": 100}, num_samples=100)
    three = mixture({"z": 0.2, "a": 0.4, "b": 0.4}, {"z": 50, "a": 100, "b": 100}, num_samples=100)
    assert two.source_seed(0) == three.source_seed(1)
    first = ShuffledOrder(100, two.source_seed(0))(np.arange(100), 0)
    again = MixedOrder(three).orders[1](np.arange(100), 0)
    assert np.array_equal(first, again)


def test_sources_shuffled_together_match_their_own_permutations() -> None:
    rng = np.random.default_rng(5)
    sizes = [1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257, 10_000, 2**20 + 1, 2**33 - 7]
    sources = tuple(MixtureSource(f"s{i}", size) for i, size in enumerate(sizes))
    mix = Mixture(sources, num_samples=100_000)  # small sources repeat: many passes
    order = MixedOrder(mix)
    for epoch in (0, 1, 9):
        positions = rng.choice(mix.samples_per_epoch, size=4000, replace=False)
        sources, samples = order.locate(positions, epoch)
        _, draws = order.draws(positions, epoch)
        expected = [
            expected_sample(mix, s, d, epoch)
            for s, d in zip(sources.tolist(), draws.tolist(), strict=True)
        ]
        assert samples.tolist() == expected


def test_a_plugged_in_source_order_decides_the_samples() -> None:
    calls: list[int] = []

    def backwards(indices: np.ndarray, key: int) -> np.ndarray:
        calls.append(key)
        return 99 - indices

    mix = mixture({"a": 0.5, "b": 0.5}, {"a": 100, "b": 100})
    order = MixedOrder(mix, [backwards, backwards])
    sources, samples = order.locate(np.arange(200), 2)
    assert np.array_equal(samples[sources == 0], 99 - np.arange(100))
    assert set(calls) == {2}  # one whole pass per epoch: pass number 2 in epoch 2


def test_a_mixed_order_pickles_for_workers() -> None:
    order = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    order.set_weights([0.3, 0.3, 0.4], epoch=0, position=100)
    copy = pickle.loads(pickle.dumps(order))
    positions = np.arange(0, 3000, 3)
    assert located(copy, 0, positions) == located(order, 0, positions)


# -- refusals ------------------------------------------------------------------------------


def test_invalid_mixtures_are_refused() -> None:
    with pytest.raises(LoaderConfigError):
        Mixture(())
    with pytest.raises(LoaderConfigError):
        Mixture((MixtureSource("a", 10), MixtureSource("a", 20)))
    with pytest.raises(LoaderConfigError):
        Mixture((MixtureSource("a", 10, 0.0),))
    with pytest.raises(LoaderConfigError):
        MixtureSource("a", 0)
    with pytest.raises(LoaderConfigError):
        MixtureSource("a", 10, -1.0)
    with pytest.raises(LoaderConfigError):
        MixtureSource("", 10)
    with pytest.raises(LoaderConfigError):
        Mixture((MixtureSource("a", 10),), num_samples=0)
    with pytest.raises(LoaderConfigError):
        Mixture.from_weights({"a": 1.0}, {"b": 10})
    with pytest.raises(LoaderConfigError):
        MixedOrder(mixture(BASE, SIZES)).set_weights({"web": 1.0}, epoch=0, position=0)


def test_positions_outside_the_epoch_are_refused() -> None:
    order = MixedOrder(mixture(BASE, SIZES, num_samples=3000))
    with pytest.raises(OutOfRangeError):
        order.locate(np.array([3000]), 0)
    with pytest.raises(OutOfRangeError):
        order.locate(np.array([-1]), 0)
    with pytest.raises(OutOfRangeError):
        order.draws_before(0, 3001)
