"""How a mixture's source is read within one pass: shuffled, or in storage order.

A :class:`SourceOrder` maps ``(indices, key)`` to sample positions, a bijection of the
source per key (pass numbers, and :data:`~rangestream.loader.mixing.mixture.CYCLE_KEY`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np

from rangestream.loader.orders.permutation import DEFAULT_ROUNDS, Permutation, _key, _mix_in_place

__all__ = ["SequentialOrder", "ShuffledOrder", "SourceOrder", "shuffle_groups"]

_CACHED_ORDERS = 4


class SourceOrder(Protocol):
    """How a source is read within one pass: ``(indices, key) -> sample positions``.

    For every ``key`` the map must be a bijection of ``[0, size)`` (a shuffle, the block
    shuffle, or the identity), the same in every process. Keys are pass numbers
    (``>= 0``) and :data:`CYCLE_KEY`; vectorised over ``indices`` (``int64``).
    """

    def __call__(self, indices: np.ndarray, key: int) -> np.ndarray: ...


class ShuffledOrder:
    """A :class:`Permutation` of the source per key (the default shuffle).

    :meth:`MixedOrder.locate` evaluates the shuffles of all sources and passes of a block
    in one vectorised pass (:func:`_shuffle_groups`), the same network as
    :class:`Permutation` with per-element keys and widths, so mixing costs about one
    shuffle call per block whatever the number of sources.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = int(size)
        self.seed = int(seed)
        self._permutations: OrderedDict[int, Permutation] = OrderedDict()
        self._networks: OrderedDict[int, tuple[int, list[int]]] = OrderedDict()

    def permutation(self, key: int) -> Permutation:
        permutation = self._permutations.get(key)
        if permutation is None:
            permutation = Permutation(self.size, self.seed, key)
            self._permutations[key] = permutation
            if len(self._permutations) > _CACHED_ORDERS:
                self._permutations.popitem(last=False)
        else:
            self._permutations.move_to_end(key)
        return permutation

    def __call__(self, indices: np.ndarray, key: int) -> np.ndarray:
        return self.permutation(key)(indices)

    def network(self, key: int) -> tuple[int, list[int]]:
        """Half width in bits and round keys of :class:`Permutation`'s network for ``key``."""
        network = self._networks.get(key)
        if network is None:
            bits = max(1, (self.size - 1).bit_length())
            round_keys = [_key(self.seed, key, rnd) for rnd in range(DEFAULT_ROUNDS)]
            network = self._networks[key] = ((bits + 1) // 2, round_keys)
            if len(self._networks) > _CACHED_ORDERS:
                self._networks.popitem(last=False)
        return network

    def __repr__(self) -> str:
        return f"ShuffledOrder(size={self.size}, seed={self.seed})"


def shuffle_groups(
    sizes: list[int], networks: list[tuple[int, list[int]]], group: np.ndarray, indices: np.ndarray
) -> np.ndarray:
    """``Permutation(sizes[g], seed, key)(indices)`` for every element of group ``g``.

    The Feistel network and cycle-walking of :class:`Permutation`, with each element's
    half width and round keys gathered from its group, so many small shuffles cost one
    vectorised pass instead of one call each.
    """
    limit = np.asarray(sizes, dtype=np.uint64)
    halves = np.asarray([half for half, _ in networks], dtype=np.uint64)
    masks = (np.uint64(1) << halves) - np.uint64(1)
    keys = np.asarray([round_keys for _, round_keys in networks], dtype=np.uint64).T

    def network(values: np.ndarray, members: np.ndarray) -> np.ndarray:
        shift, mask = halves[members], masks[members]
        left = values >> shift
        right = values & mask
        for round_keys in keys:
            mixed = _mix_in_place(right ^ round_keys[members])
            mixed &= mask
            mixed ^= left
            left, right = right, mixed
        return (left << shift) | right

    out = network(indices.astype(np.uint64), group)
    walking = np.flatnonzero(out >= limit[group])
    while walking.size:
        stepped = network(out[walking], group[walking])
        out[walking] = stepped
        walking = walking[stepped >= limit[group[walking]]]
    return out.astype(np.int64)


class SequentialOrder:
    """Storage order for every key (``shuffle=False``)."""

    def __call__(self, indices: np.ndarray, key: int) -> np.ndarray:
        return np.asarray(indices, dtype=np.int64)

    def __repr__(self) -> str:
        return "SequentialOrder()"
