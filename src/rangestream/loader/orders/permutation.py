"""A seeded bijection over ``[0, n)`` that needs no array of size ``n``.

A global shuffle of billions of windows cannot afford ``np.random.permutation(n)`` per epoch
(8 bytes per window, rebuilt by every worker of every rank). A keyed Feistel network over the
smallest even-bit power of two ``>= n`` is a bijection by construction; cycle-walking (apply
it again until the value falls inside ``[0, n)``) restricts it to a bijection of ``[0, n)``.
Any position maps in O(1) memory and a block of positions maps in a few vectorised numpy
passes, so every worker evaluates exactly the positions it needs.

The same keyed 64-bit mixing (SplitMix64's finaliser) drives :func:`keyed_hash`, the
counter-based random numbers of temporal window sampling: sample ``i`` of an epoch is a pure
function of ``(seed, epoch, i)``, so resuming needs nothing but the counter.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError, OutOfRangeError

__all__ = ["DEFAULT_ROUNDS", "Permutation", "keyed_hash"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

DEFAULT_ROUNDS = 6
"""Feistel rounds. Four already give a pseudo-random permutation for random round functions
(Luby-Rackoff); six leave a margin for the weak mixing of very small half-widths."""


def _mix_int(value: int) -> int:
    z = value & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


_SHIFT30, _SHIFT27, _SHIFT31 = np.uint64(30), np.uint64(27), np.uint64(31)
_MIX1_U64, _MIX2_U64, _GOLDEN_U64 = np.uint64(_MIX1), np.uint64(_MIX2), np.uint64(_GOLDEN)


def _mix_in_place(z: np.ndarray) -> np.ndarray:
    # uint64 array arithmetic wraps modulo 2**64 without warnings, unlike numpy scalars.
    z ^= z >> _SHIFT30
    z *= _MIX1_U64
    z ^= z >> _SHIFT27
    z *= _MIX2_U64
    z ^= z >> _SHIFT31
    return z


def _key(*words: int) -> int:
    """Fold integers (any sign, any size below 2**64) into one well-mixed 64-bit key."""
    state = _GOLDEN
    for word in words:
        state = _mix_int(state ^ ((word & _MASK64) + _GOLDEN))
    return state


def keyed_hash(counters: npt.ArrayLike, *key: int) -> np.ndarray:
    """Hash each counter under a key into a uniformly distributed ``uint64``.

    Parameters
    ----------
    counters : array_like of int
        Non-negative counters (for example the sample number within an epoch).
    *key : int
        Words that select an independent stream, e.g. ``(seed, epoch, purpose)``.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array shaped like ``counters``; equal inputs give equal outputs on every
        platform, which is what makes counter-based sampling resumable.
    """
    values = np.asarray(counters)
    if values.size and values.min(initial=0) < 0:
        raise OutOfRangeError(f"keyed_hash counters must be non-negative, found {values.min()}")
    mixed = _mix_in_place(values.astype(np.uint64) ^ np.uint64(_key(*key)))
    mixed += _GOLDEN_U64
    return _mix_in_place(mixed)


class Permutation:
    """Seeded bijection of ``[0, n)``, different for every ``(seed, epoch)``.

    Parameters
    ----------
    n : int
        Size of the domain (``>= 1``).
    seed : int
        Shuffle seed shared by every rank and worker.
    epoch : int, default 0
        Epoch number; each epoch gets an unrelated order.
    rounds : int, default :data:`DEFAULT_ROUNDS`
        Feistel rounds.

    Notes
    -----
    The network works on ``2 * h`` bits with ``h = ceil(bits(n - 1) / 2)``, so the walk
    domain is below ``4 n`` and a position needs fewer than four network passes on average.
    Cycle-walking terminates because the walk follows the cycle of a permutation that
    contains the (in-range) starting point.
    """

    def __init__(self, n: int, seed: int, epoch: int = 0, *, rounds: int = DEFAULT_ROUNDS) -> None:
        if int(n) != n or n < 1:
            raise LoaderConfigError(f"Permutation size must be a positive integer, got n={n!r}")
        if rounds < 1:
            raise LoaderConfigError(f"Permutation needs at least one round, got rounds={rounds}")
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = int(epoch)
        bits = max(1, (self.n - 1).bit_length())
        self._half_bits = (bits + 1) // 2
        self._half_mask = np.uint64((1 << self._half_bits) - 1)
        self._round_keys = [
            np.uint64(_key(self.seed, self.epoch, round_index)) for round_index in range(rounds)
        ]

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    def _network(self, values: np.ndarray) -> np.ndarray:
        shift = np.uint64(self._half_bits)
        left = values >> shift
        right = values & self._half_mask
        for key in self._round_keys:
            mixed = _mix_in_place(right ^ key)
            mixed &= self._half_mask
            mixed ^= left
            left, right = right, mixed
        return (left << shift) | right

    def __call__(self, positions: npt.ArrayLike) -> np.ndarray:
        """Map positions to their images.

        Parameters
        ----------
        positions : array_like of int
            Positions in ``[0, n)``; any shape.

        Returns
        -------
        numpy.ndarray
            ``int64`` images, same shape as ``positions``.
        """
        values = np.asarray(positions)
        if values.dtype.kind not in "iu":
            raise LoaderConfigError(f"positions must be integers, got dtype {values.dtype}")
        if values.size and (values.min() < 0 or values.max() >= self.n):
            raise OutOfRangeError(
                f"positions must lie in [0, {self.n}), found range "
                f"[{values.min()}, {values.max()}] for {self!r}"
            )
        if self.n == 1:
            return np.zeros(values.shape, dtype=np.int64)
        flat = self._network(values.astype(np.uint64).ravel())
        limit = np.uint64(self.n)
        walking = np.flatnonzero(flat >= limit)
        while walking.size:
            stepped = self._network(flat[walking])
            flat[walking] = stepped
            walking = walking[stepped >= limit]
        return flat.astype(np.int64).reshape(values.shape)

    def at(self, position: int) -> int:
        """Image of one position (convenience for scalar use)."""
        return int(self(np.array([position], dtype=np.int64))[0])
