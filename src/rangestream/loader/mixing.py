"""Weighted mixtures of sources: one global order per epoch, exact at every prefix.

A :class:`Mixture` names its sources (each with its size in samples, its weight and its own
loader options), the samples per epoch and the seed. :class:`MixedOrder` turns it into the
epoch's global order, position by position and without per-epoch arrays:

1. the *interleave* (:class:`rangestream.loader.interleave.Interleave`) says which source
   position ``i`` takes and which of that source's draws it is (``j``): in every prefix
   each source is within :attr:`Mixture.bound` of its share;
2. the source's *draws* (:class:`SourceDraws`) say which pass, or which window of the
   down-sampling cycle, draw ``j`` falls in;
3. the source's *order* (:class:`SourceOrder`: the shuffle, a :class:`Permutation` per pass
   by default) gives the sample.

Each step is a pure function of ``(mixture, weights in force, epoch, i)``, so any rank or
worker evaluates exactly the positions it needs, and resuming needs nothing but
``consumed_samples``: elastic over workers, world size and batch size as for one source.

Epochs (as MosaicML's streams)
------------------------------
An epoch has :attr:`Mixture.samples_per_epoch` positions, by default the most for which no
source repeats (every source exactly once when the weights are proportional to the sizes).
Source ``s`` is drawn :attr:`Mixture.quotas` ``[s]`` times per epoch (``q``; within the
bound of ``weight * samples``). With ``M`` samples:

- ``q >= M``: ``q // M`` whole passes, each a fresh shuffle (pass numbers continue across
  epochs), then the remainder as below;
- the remainder ``q % M`` (all of ``q`` when ``q < M``) is a window of the source's
  *cycle*, one fixed order of all ``M`` samples read as a ring: epoch ``e`` takes the window
  starting at ``e * (q % M)``. So a down-sampled source never repeats a sample within an
  epoch, takes a different subset each epoch, and every sample is seen once per
  ``ceil(M / (q % M))`` epochs.

Curriculum
----------
:meth:`MixedOrder.set_weights` starts a *phase* at a position of an epoch: positions before
it keep the order they had (they are consumed, or will be, exactly as before); from it on,
the new weights interleave the sources afresh, exact relative to the phase start (the
counts over ``[start, start + n)`` are within the new weights' bound of ``w * n``). Each
source's draws continue where the earlier phases left them, so no sample is drawn twice
in an epoch beyond what the epoch semantics above allow, and the passes and cycle windows
stay those of the mixture's own weights and samples per epoch (a phase changes how fast
each source is consumed, not in what order). Later epochs start with the weights in force.
The phases of the current epoch are part of :meth:`MixedOrder.state_dict` (plain ints and
strings: weights are saved as the decimals they print as); :meth:`MixedOrder.resume`
continues a saved run and, if this object was built with other weights, starts a phase
with them at the resume position.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError, OutOfRangeError, StateError
from rangestream.loader.interleave import MAX_POSITION, Interleave
from rangestream.loader.permutation import (
    DEFAULT_ROUNDS,
    Permutation,
    _key,
    _mix_in_place,
    keyed_hash,
)

__all__ = [
    "CYCLE_KEY",
    "MixPhase",
    "MixedOrder",
    "Mixture",
    "MixtureSource",
    "SequentialOrder",
    "ShuffledOrder",
    "SourceDraws",
    "SourceOrder",
]

CYCLE_KEY = -1
"""Key of a source's down-sampling cycle in :class:`SourceOrder` calls (passes use their
non-negative pass numbers)."""

_SOURCE_SEED = 0x6D6978  # purpose word of the per-source seeds ("mix")
_CACHED_ORDERS = 4

# state_dict keys
STATE_SOURCES = "sources"
STATE_SIZES = "sizes"
STATE_WEIGHTS = "weights"
STATE_SAMPLES = "samples_per_epoch"
STATE_SEED = "seed"
STATE_PHASE_EPOCH = "phase_epoch"
STATE_PHASES = "phases"


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


def _shuffle_groups(
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


def _check_count(owner: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise LoaderConfigError(f"{owner} {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_weight(owner: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise LoaderConfigError(f"{owner} weight must be a number, got {value!r}")
    weight = float(value)
    if not np.isfinite(weight) or weight < 0:
        raise LoaderConfigError(f"{owner} weight must be finite and >= 0, got {value!r}")
    return weight


@dataclass(frozen=True)
class MixtureSource:
    """One source of a mixture.

    Parameters
    ----------
    name : str
        Unique name (reported in counters and checked on resume); also seeds the source's
        shuffle, so adding or reordering sources leaves each source's order unchanged.
    size : int
        Samples in the source (its windows, documents or drawn temporal windows).
    weight : float, default 1.0
        Relative weight (normalised over the mixture); 0 keeps the source out.
    options : mapping, optional
        The source's own loader options (stride, fields, ...), carried for the loader.
    """

    name: str
    size: int
    weight: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise LoaderConfigError(f"source name must be a non-empty string, got {self.name!r}")
        object.__setattr__(
            self, "size", _check_count(f"source {self.name!r}", "size", self.size, 1)
        )
        object.__setattr__(self, "weight", _check_weight(f"source {self.name!r}", self.weight))
        # a private copy (a plain dict: mapping proxies do not pickle); treat as read-only
        object.__setattr__(self, "options", dict(self.options))


@dataclass(frozen=True)
class Mixture:
    """Sources, their weights, the samples per epoch and the seed of a mixed loader.

    Parameters
    ----------
    sources : sequence of MixtureSource
        At least one, with unique names and at least one positive weight.
    num_samples : int, optional
        Positions per epoch; by default the most for which no source repeats (MosaicML's
        default epoch: every sample once when the weights follow the sizes).
    seed : int, default 0
        Seed of every source's shuffle (each source derives its own from its name).
    """

    sources: tuple[MixtureSource, ...]
    num_samples: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        if not sources or not all(isinstance(source, MixtureSource) for source in sources):
            raise LoaderConfigError(
                f"a Mixture needs at least one MixtureSource, got {self.sources!r}"
            )
        names = [source.name for source in sources]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise LoaderConfigError(f"mixture source names must be unique, repeated: {duplicates}")
        if not any(source.weight > 0 for source in sources):
            raise LoaderConfigError(f"at least one source weight must be positive, got {names}")
        object.__setattr__(self, "sources", sources)
        if self.num_samples is not None:
            _check_count("Mixture", "num_samples", self.num_samples, 1)
            if self.num_samples > MAX_POSITION:
                raise LoaderConfigError(
                    f"Mixture num_samples must be <= {MAX_POSITION}, got {self.num_samples}"
                )
            object.__setattr__(self, "num_samples", int(self.num_samples))
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise LoaderConfigError(f"Mixture seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))

    @classmethod
    def from_weights(
        cls,
        weights: Mapping[str, float],
        sizes: Mapping[str, int],
        *,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        num_samples: int | None = None,
        seed: int = 0,
    ) -> Mixture:
        """Build a mixture from ``{name: weight}`` and ``{name: size}`` (same names)."""
        if set(weights) != set(sizes):
            raise LoaderConfigError(
                f"weights and sizes must name the same sources: weights {sorted(weights)}, "
                f"sizes {sorted(sizes)}"
            )
        extra = sorted(set(options or {}) - set(weights))
        if extra:
            raise LoaderConfigError(
                f"options name unknown sources {extra}; known {sorted(weights)}"
            )
        sources = tuple(
            MixtureSource(name, sizes[name], weights[name], (options or {}).get(name, {}))
            for name in weights
        )
        return cls(sources, num_samples=num_samples, seed=seed)

    # -- derived ------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.sources)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(source.size for source in self.sources)

    @property
    def weights(self) -> tuple[float, ...]:
        """The sources' weights as given (not normalised)."""
        return tuple(source.weight for source in self.sources)

    @cached_property
    def interleave(self) -> Interleave:
        """The interleave of the mixture's own weights."""
        return Interleave(self.weights)

    @property
    def bound(self) -> float:
        """Every prefix of an epoch holds each source within this of its share."""
        return self.interleave.bound

    @cached_property
    def samples_per_epoch(self) -> int:
        """Positions per epoch: ``num_samples``, or the most for which no source repeats."""
        if self.num_samples is not None:
            return self.num_samples
        shares = self.interleave.exact_weights
        limit = min(
            Fraction(size) / share
            for size, share in zip(self.sizes, shares, strict=True)
            if share > 0
        )
        sizes = np.asarray(self.sizes, dtype=np.int64)
        # The interleave's count at n can exceed w * n by up to its bound, so the largest n
        # with every count within its size is found by bisection (counts grow with n).
        low, high = 1, min(int(limit), MAX_POSITION)
        while low < high:
            middle = (low + high + 1) // 2
            if (self.interleave.counts(middle) > sizes).any():
                high = middle - 1
            else:
                low = middle
        return low

    @cached_property
    def quotas(self) -> tuple[int, ...]:
        """Draws of each source per epoch under the mixture's own weights."""
        counts = self.interleave.counts(self.samples_per_epoch)
        return tuple(int(count) for count in counts)

    def source_seed(self, index: int) -> int:
        """Seed of source ``index``'s shuffle: from the mixture seed and the source name."""
        name = self.sources[index].name.encode("utf-8")
        word = int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little")
        return int(keyed_hash(np.array([word], dtype=np.uint64), self.seed, _SOURCE_SEED)[0])

    def identity(self) -> dict[str, Any]:
        """What a saved state must match: names, sizes and seed (plain data)."""
        return {
            STATE_SOURCES: list(self.names),
            STATE_SIZES: list(self.sizes),
            STATE_SEED: self.seed,
        }


@dataclass(frozen=True)
class SourceDraws:
    """Which pass, or which cycle window, the ``j``-th draw of a source in an epoch reads.

    Parameters
    ----------
    size : int
        Samples in the source (``M``).
    quota : int
        Draws per epoch under the mixture's own weights (``q``).
    """

    size: int
    quota: int

    @property
    def passes(self) -> int:
        """Whole passes per epoch (fresh shuffles)."""
        return self.quota // self.size

    @property
    def remainder(self) -> int:
        """Draws per epoch from the cycle (the down-sampled part)."""
        return self.quota % self.size

    def keys(self, draws: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Order keys and indices within the order for draws of one epoch.

        Parameters
        ----------
        draws : numpy.ndarray
            Draw numbers ``j >= 0`` of this epoch (``int64``).
        epoch : int
            Epoch number.

        Returns
        -------
        keys, indices : numpy.ndarray
            ``int64`` arrays shaped like ``draws``: pass number (or :data:`CYCLE_KEY`) and
            index in ``[0, size)`` to hand to the source's :class:`SourceOrder`.
        """
        return _draw_keys(
            draws,
            np.int64(self.size),
            np.int64(self.passes),
            np.int64(epoch * self.passes),
            np.int64((epoch * self.remainder) % self.size),  # Python ints: no overflow
        )


def _draw_keys(
    draws: np.ndarray,
    size: np.ndarray | np.int64,
    passes: np.ndarray | np.int64,
    first_pass: np.ndarray | np.int64,
    cycle_start: np.ndarray | np.int64,
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`SourceDraws.keys` with per-draw parameters (draws of several sources)."""
    whole_draws = passes * size
    whole = draws < whole_draws
    keys = np.where(whole, first_pass + draws // size, CYCLE_KEY)
    indices = np.where(whole, draws % size, (draws - whole_draws + cycle_start) % size)
    return keys.astype(np.int64), indices.astype(np.int64)


@dataclass(frozen=True)
class MixPhase:
    """Weights in force from position ``start`` of an epoch on."""

    start: int
    weights: tuple[float, ...]


@dataclass(frozen=True)
class _Phase:
    start: int
    interleave: Interleave
    offsets: np.ndarray  # draws of each source before ``start``


class MixedOrder:
    """The global order of a mixture: position ``i`` of epoch ``e`` -> (source, sample).

    Parameters
    ----------
    mixture : Mixture
        Sources, weights, samples per epoch and seed.
    orders : sequence of SourceOrder, optional
        Each source's order within a pass (e.g. the block shuffle). By default a
        :class:`ShuffledOrder` seeded by :meth:`Mixture.source_seed`, or
        :class:`SequentialOrder` with ``shuffle=False``.
    shuffle : bool, default True
        Default orders: shuffled or storage order.

    Notes
    -----
    Mutable like a loader: :meth:`set_weights` starts a curriculum phase,
    :meth:`load_state_dict` / :meth:`resume` restore a saved run. Picklable, to be sent to
    DataLoader workers.
    """

    def __init__(
        self,
        mixture: Mixture,
        orders: Sequence[SourceOrder] | None = None,
        *,
        shuffle: bool = True,
    ) -> None:
        if not isinstance(mixture, Mixture):
            raise LoaderConfigError(f"MixedOrder needs a Mixture, got {type(mixture).__name__}")
        count = len(mixture.sources)
        if orders is None:
            orders = [
                ShuffledOrder(source.size, mixture.source_seed(index))
                if shuffle
                else SequentialOrder()
                for index, source in enumerate(mixture.sources)
            ]
        elif len(orders) != count:
            raise LoaderConfigError(
                f"MixedOrder needs one order per source ({count}), got {len(orders)}"
            )
        self.orders: list[SourceOrder] = list(orders)
        self._adopt(mixture)
        self._phase_epoch = 0
        self._phases: tuple[MixPhase, ...] = (MixPhase(0, mixture.weights),)
        self._interleaves: dict[tuple[float, ...], Interleave] = {
            mixture.weights: mixture.interleave
        }
        self._resolved: tuple[int, tuple[_Phase, ...]] | None = None

    def _adopt(self, mixture: Mixture) -> None:
        self.mixture = mixture
        self._parameters: tuple[int, tuple[np.ndarray, ...]] | None = None
        self.draws_per_source = [
            SourceDraws(size, quota)
            for size, quota in zip(mixture.sizes, mixture.quotas, strict=True)
        ]

    # -- what it is ---------------------------------------------------------------------

    @property
    def num_sources(self) -> int:
        return len(self.mixture.sources)

    @property
    def samples_per_epoch(self) -> int:
        return self.mixture.samples_per_epoch

    @property
    def weights(self) -> tuple[float, ...]:
        """Weights in force now (those of the last phase)."""
        return self._phases[-1].weights

    @property
    def phase_epoch(self) -> int:
        """Epoch whose phases :attr:`phases` lists; every other epoch is one phase with the
        weights in force (:attr:`weights`)."""
        return self._phase_epoch

    @property
    def phases(self) -> tuple[MixPhase, ...]:
        """Phases of :attr:`phase_epoch`, the first starting at 0."""
        return self._phases

    def __repr__(self) -> str:
        return (
            f"MixedOrder(sources={list(self.mixture.names)}, weights={list(self.weights)}, "
            f"samples_per_epoch={self.samples_per_epoch}, phases={len(self._phases)})"
        )

    @property
    def bound(self) -> float:
        """Every prefix of a phase of :attr:`phase_epoch`, counted from the phase's start,
        holds each source within this of its share (the largest phase bound)."""
        return max(phase.interleave.bound for phase in self._epoch_phases(self._phase_epoch))

    # -- curriculum ---------------------------------------------------------------------

    def _weights_tuple(self, weights: Mapping[str, float] | Sequence[float]) -> tuple[float, ...]:
        names = self.mixture.names
        if isinstance(weights, Mapping):
            if set(weights) != set(names):
                raise LoaderConfigError(
                    f"weights must name every source: expected {sorted(names)}, got "
                    f"{sorted(weights)}"
                )
            values = [weights[name] for name in names]
        else:
            values = list(weights)
            if len(values) != len(names):
                raise LoaderConfigError(
                    f"weights must have one value per source ({len(names)}), got {len(values)}"
                )
        out = tuple(
            _check_weight(f"source {name!r}", value)
            for name, value in zip(names, values, strict=True)
        )
        if not any(weight > 0 for weight in out):
            raise LoaderConfigError(f"at least one weight must be positive, got {list(out)}")
        return out

    def set_weights(
        self, weights: Mapping[str, float] | Sequence[float], *, epoch: int, position: int
    ) -> None:
        """Interleave with ``weights`` from ``position`` of ``epoch`` on (a curriculum phase).

        Parameters
        ----------
        weights : mapping of name to weight, or sequence of weights
            New relative weights (0 keeps a source out).
        epoch : int
            Epoch of the change; not before :attr:`phase_epoch`.
        position : int
            Global position (``consumed_samples``) where the phase starts, in
            ``[0, samples_per_epoch]``; not before the current phase's start in that epoch.
        """
        new = self._weights_tuple(weights)
        epoch = _check_count("set_weights", "epoch", epoch, 0)
        position = _check_count("set_weights", "position", position, 0)
        if position > self.samples_per_epoch:
            raise OutOfRangeError(
                f"set_weights position {position} is past the epoch's "
                f"{self.samples_per_epoch} samples"
            )
        if epoch < self._phase_epoch:
            raise StateError(
                f"set_weights epoch {epoch} is before the current phases' epoch "
                f"{self._phase_epoch}; weights cannot change in the past"
            )
        phases = self._phases if epoch == self._phase_epoch else (MixPhase(0, self.weights),)
        if position < phases[-1].start:
            raise StateError(
                f"set_weights position {position} is before the current phase, which starts "
                f"at {phases[-1].start} of epoch {epoch}"
            )
        if new == phases[-1].weights:
            pass
        elif position > phases[-1].start:
            phases = (*phases, MixPhase(position, new))
        elif len(phases) > 1 and phases[-2].weights == new:
            phases = phases[:-1]  # the last phase never took a position: back to the one before
        else:
            phases = (*phases[:-1], MixPhase(position, new))
        self._phase_epoch, self._phases = epoch, phases
        self._resolved = None

    def _interleave(self, weights: tuple[float, ...]) -> Interleave:
        interleave = self._interleaves.get(weights)
        if interleave is None:
            interleave = self._interleaves[weights] = Interleave(weights)
        return interleave

    def _epoch_phases(self, epoch: int) -> tuple[_Phase, ...]:
        if epoch != self._phase_epoch:
            zero = np.zeros(self.num_sources, dtype=np.int64)
            return (_Phase(0, self._interleave(self.weights), zero),)
        if self._resolved is None or self._resolved[0] != epoch:
            resolved: list[_Phase] = []
            offsets = np.zeros(self.num_sources, dtype=np.int64)
            for index, phase in enumerate(self._phases):
                if index:
                    previous = resolved[-1]
                    offsets = previous.offsets + previous.interleave.counts(
                        phase.start - previous.start
                    )
                resolved.append(_Phase(phase.start, self._interleave(phase.weights), offsets))
            self._resolved = (epoch, tuple(resolved))
        return self._resolved[1]

    # -- positions ----------------------------------------------------------------------

    def _positions(self, positions: npt.ArrayLike) -> np.ndarray:
        index = np.asarray(positions)
        if index.dtype.kind not in "iu":
            raise LoaderConfigError(f"positions must be integers, got dtype {index.dtype}")
        if index.size and (index.min() < 0 or index.max() >= self.samples_per_epoch):
            raise OutOfRangeError(
                f"positions must lie in [0, {self.samples_per_epoch}), found "
                f"[{index.min()}, {index.max()}] for {self!r}"
            )
        return index.astype(np.int64)

    def draws(self, positions: npt.ArrayLike, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source of each position of ``epoch`` and which of that source's draws it is.

        Returns
        -------
        sources, draws : numpy.ndarray
            ``int64`` arrays shaped like ``positions``.
        """
        index = self._positions(positions)
        flat = index.reshape(-1)
        phases = self._epoch_phases(epoch)
        if len(phases) == 1:
            phase = phases[0]
            sources, draws = phase.interleave.sources(flat - phase.start)
            draws += phase.offsets[sources]
        else:
            sources = np.empty_like(flat)
            draws = np.empty_like(flat)
            starts = np.array([phase.start for phase in phases], dtype=np.int64)
            which = np.searchsorted(starts, flat, side="right") - 1
            for number in np.unique(which):
                phase = phases[number]
                here = which == number
                source, draw = phase.interleave.sources(flat[here] - phase.start)
                sources[here] = source
                draws[here] = draw + phase.offsets[source]
        return sources.reshape(index.shape), draws.reshape(index.shape)

    def locate(self, positions: npt.ArrayLike, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and sample position (within the source) of each position of ``epoch``.

        Parameters
        ----------
        positions : array_like of int
            Global positions in ``[0, samples_per_epoch)``; any shape.
        epoch : int
            Epoch number.

        Returns
        -------
        sources, samples : numpy.ndarray
            ``int64`` arrays shaped like ``positions``.
        """
        sources, draws = self.draws(positions, epoch)
        flat_sources = sources.reshape(-1)
        parameters = self._draw_parameters(epoch)
        keys, indices = _draw_keys(
            draws.reshape(-1), *(values[flat_sources] for values in parameters)
        )
        # group by (source, key): passes of one source within a block are few and consecutive
        local = np.where(keys == CYCLE_KEY, 0, keys - parameters[2][flat_sources] + 1)
        width = int(local.max()) + 1 if local.size else 1
        code = flat_sources * width + local
        present = np.flatnonzero(np.bincount(code))
        group = np.searchsorted(present, code)
        samples = np.empty_like(indices)
        sizes: list[int] = []
        networks: list[tuple[int, list[int]]] = []
        shuffled_groups = np.zeros(present.size, dtype=bool)
        for number, value in enumerate(present.tolist()):
            source, offset = divmod(value, width)
            key = CYCLE_KEY if offset == 0 else int(parameters[2][source]) + offset - 1
            order = self.orders[source]
            if isinstance(order, ShuffledOrder):
                shuffled_groups[number] = True
                sizes.append(order.size)
                networks.append(order.network(key))
            else:
                chosen = group == number
                samples[chosen] = order(indices[chosen], key)
        if sizes:
            members = shuffled_groups[group]
            renumber = np.cumsum(shuffled_groups) - 1
            samples[members] = _shuffle_groups(
                sizes, networks, renumber[group[members]], indices[members]
            )
        return sources, samples.reshape(draws.shape)

    def _draw_parameters(self, epoch: int) -> tuple[np.ndarray, ...]:
        """Per source: size, whole passes, first pass number and cycle start of ``epoch``."""
        cached = self._parameters
        if cached is None or cached[0] != epoch:
            draws = self.draws_per_source
            cached = self._parameters = (
                epoch,
                (
                    np.array([d.size for d in draws], dtype=np.int64),
                    np.array([d.passes for d in draws], dtype=np.int64),
                    np.array([epoch * d.passes for d in draws], dtype=np.int64),
                    np.array([(epoch * d.remainder) % d.size for d in draws], dtype=np.int64),
                ),
            )
        return cached[1]

    # -- counters -----------------------------------------------------------------------

    def draws_before(self, epoch: int, position: int) -> np.ndarray:
        """Draws of each source among positions ``[0, position)`` of ``epoch``."""
        position = _check_count("draws_before", "position", position, 0)
        if position > self.samples_per_epoch:
            raise OutOfRangeError(
                f"position {position} is past the epoch's {self.samples_per_epoch} samples"
            )
        phases = self._epoch_phases(epoch)
        phase = next(phase for phase in reversed(phases) if phase.start <= position)
        return phase.offsets + phase.interleave.counts(position - phase.start)

    def source_counts(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Samples each source contributes to positions ``[start, stop)`` of ``epoch``.

        The loader reports the realised mix with it: ``source_counts(epoch, 0, consumed)``.
        """
        if stop < start:
            raise OutOfRangeError(f"source_counts needs start <= stop, got [{start}, {stop})")
        return self.draws_before(epoch, stop) - self.draws_before(epoch, start)

    # -- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The mixture's identity, base weights and epoch length, and the current phases."""
        return {
            **self.mixture.identity(),
            STATE_WEIGHTS: [repr(weight) for weight in self.mixture.weights],
            STATE_SAMPLES: self.samples_per_epoch,
            STATE_PHASE_EPOCH: self._phase_epoch,
            STATE_PHASES: [
                [phase.start, [repr(weight) for weight in phase.weights]] for phase in self._phases
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the phases of a saved run (its weights, epoch length and phases).

        The saved run's own weights and samples per epoch replace this object's: they fix
        every source's passes and cycle windows and the epoch's length, which the saved
        position depends on. Raises :class:`StateError` if the sources, sizes or seed
        differ, or if this mixture asked for another explicit ``num_samples``.
        """
        for key, value in self.mixture.identity().items():
            if state.get(key) != value:
                raise StateError(
                    f"cannot resume the mixture: the state has {key}={state.get(key)!r} but "
                    f"this mixture has {key}={value!r}"
                )
        samples = state.get(STATE_SAMPLES)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise StateError(f"state {STATE_SAMPLES} must be a positive integer, got {samples!r}")
        if self.mixture.num_samples is not None and self.mixture.num_samples != samples:
            raise StateError(
                f"cannot resume: the state's epoch has {samples} samples but this mixture asks "
                f"for num_samples={self.mixture.num_samples}"
            )
        base = self._state_weights(state.get(STATE_WEIGHTS), STATE_WEIGHTS)
        epoch = state.get(STATE_PHASE_EPOCH)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise StateError(f"state {STATE_PHASE_EPOCH} must be an integer >= 0, got {epoch!r}")
        raw_phases = state.get(STATE_PHASES)
        if not isinstance(raw_phases, list) or not raw_phases:
            raise StateError(f"state {STATE_PHASES} must be a non-empty list, got {raw_phases!r}")
        phases: list[MixPhase] = []
        for entry in raw_phases:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise StateError(f"state phase must be [start, weights], got {entry!r}")
            start, weights = entry
            last = phases[-1].start if phases else -1
            if (
                isinstance(start, bool)
                or not isinstance(start, int)
                or start <= last
                or start > samples
                or (not phases and start != 0)
            ):
                raise StateError(
                    f"state phase starts must rise from 0 within the epoch's {samples} "
                    f"samples, got {start!r} after {last}"
                )
            phases.append(MixPhase(start, self._state_weights(weights, STATE_PHASES)))
        if base != self.mixture.weights or samples != self.mixture.samples_per_epoch:
            mixture = Mixture(
                tuple(
                    MixtureSource(source.name, source.size, weight, source.options)
                    for source, weight in zip(self.mixture.sources, base, strict=True)
                ),
                num_samples=samples,
                seed=self.mixture.seed,
            )
            self._adopt(mixture)
            self._interleaves.setdefault(mixture.weights, mixture.interleave)
        self._phase_epoch = epoch
        self._phases = tuple(phases)
        self._resolved = None

    def _state_weights(self, value: object, key: str) -> tuple[float, ...]:
        """Weights saved as the decimal strings they print as (exact, and plain text)."""
        if (
            not isinstance(value, (list, tuple))
            or len(value) != self.num_sources
            or not all(isinstance(weight, str) for weight in value)
        ):
            raise StateError(
                f"state {key} weights must be a list of {self.num_sources} decimal strings, "
                f"got {value!r}"
            )
        try:
            return self._weights_tuple([float(weight) for weight in value])
        except (LoaderConfigError, ValueError) as error:
            raise StateError(f"state {key} weights are invalid: {error}") from None

    def resume(self, state: Mapping[str, Any], *, epoch: int, position: int) -> None:
        """Continue a saved run at ``position`` of ``epoch``, with this object's weights.

        Loads ``state`` (:meth:`load_state_dict`); if the weights this object was built or
        last set with differ from the saved run's weights in force, they take over from
        ``position`` (a new phase): the positions before it keep the saved run's order, the
        rest follow the new weights exactly from there.
        """
        requested = self.weights
        self.load_state_dict(state)
        self.set_weights(requested, epoch=epoch, position=position)
