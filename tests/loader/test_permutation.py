from __future__ import annotations

import numpy as np
import pytest

from rangestream.errors import LoaderConfigError, OutOfRangeError
from rangestream.loader import Permutation, keyed_hash


def test_permutation_is_a_bijection_for_every_size_from_1_to_2000() -> None:
    for n in range(1, 2001):
        images = Permutation(n, seed=n * 31, epoch=n % 3)(np.arange(n))
        assert np.array_equal(np.sort(images), np.arange(n)), n


@pytest.mark.parametrize("n", [2**20, 2**20 + 1, 1_000_003])
def test_permutation_is_a_bijection_for_large_sizes(n: int) -> None:
    images = Permutation(n, seed=7, epoch=2)(np.arange(n))
    assert images.dtype == np.int64
    assert np.array_equal(np.bincount(images, minlength=n), np.ones(n, dtype=np.int64))


def test_permutation_of_a_huge_domain_stays_in_range_without_collisions() -> None:
    n = 2**45 + 11
    positions = np.random.default_rng(0).choice(2**45, size=50_000, replace=False)
    images = Permutation(n, seed=3, epoch=0)(positions)
    assert images.min() >= 0 and images.max() < n
    assert len(np.unique(images)) == len(positions)


def test_same_seed_and_epoch_give_the_same_order() -> None:
    first = Permutation(1000, seed=11, epoch=4)(np.arange(1000))
    second = Permutation(1000, seed=11, epoch=4)(np.arange(1000))
    assert np.array_equal(first, second)


def test_each_epoch_gives_a_different_order() -> None:
    orders = {tuple(Permutation(1000, seed=11, epoch=e)(np.arange(1000))) for e in range(10)}
    assert len(orders) == 10


def test_different_seeds_give_different_orders() -> None:
    orders = {tuple(Permutation(1000, seed=s, epoch=0)(np.arange(1000))) for s in range(10)}
    assert len(orders) == 10


def test_image_of_the_first_position_is_roughly_uniform_across_seeds() -> None:
    n, seeds = 50, 5000
    images = np.array([Permutation(n, seed=s, epoch=0).at(0) for s in range(seeds)])
    counts = np.bincount(images, minlength=n)
    expected = seeds / n
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    # 49 degrees of freedom: mean 49, standard deviation about 10.
    assert chi_square < 110, counts
    assert counts.min() > 0


def test_shuffled_order_is_not_close_to_the_identity() -> None:
    images = Permutation(10_000, seed=5, epoch=1)(np.arange(10_000))
    fixed_points = int((images == np.arange(10_000)).sum())
    correlation = np.corrcoef(images, np.arange(10_000))[0, 1]
    assert fixed_points < 10
    assert abs(correlation) < 0.05


def test_any_array_shape_maps_elementwise() -> None:
    permutation = Permutation(97, seed=1, epoch=0)
    block = np.arange(96).reshape(8, 12)
    images = permutation(block)
    assert images.shape == (8, 12)
    assert [permutation.at(int(p)) for p in block.ravel()] == images.ravel().tolist()


def test_positions_outside_the_domain_raise_out_of_range() -> None:
    permutation = Permutation(10, seed=0)
    with pytest.raises(OutOfRangeError, match=r"\[0, 10\)"):
        permutation(np.array([3, 10]))
    with pytest.raises(OutOfRangeError):
        permutation(np.array([-1]))


def test_empty_domain_is_refused() -> None:
    with pytest.raises(LoaderConfigError, match="n=0"):
        Permutation(0, seed=0)


def test_keyed_hash_depends_on_every_key_word_and_counter() -> None:
    counters = np.arange(1000)
    base = keyed_hash(counters, 1, 2, 3)
    assert np.array_equal(base, keyed_hash(counters, 1, 2, 3))
    for other in [(0, 2, 3), (1, 0, 3), (1, 2, 0)]:
        assert (base == keyed_hash(counters, *other)).sum() == 0
    assert len(np.unique(base)) == 1000


def test_keyed_hash_low_bits_are_balanced() -> None:
    values = keyed_hash(np.arange(100_000), 9, 0)
    ones_per_bit = [int(((values >> np.uint64(bit)) & np.uint64(1)).sum()) for bit in range(8)]
    assert all(abs(ones - 50_000) < 1_000 for ones in ones_per_bit), ones_per_bit
