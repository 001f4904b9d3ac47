"""A mixture: named sources with sizes, weights and options, its epoch length and quotas.

:class:`Mixture` is the plain description a mixed loader is built from (see
:mod:`rangestream.loader.mixing.mixed_order` for the epoch's order); :class:`SourceDraws` says which
pass of a source, or which window of its down-sampling cycle, the ``j``-th draw of an epoch reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from rangestream.errors import LoaderConfigError
from rangestream.loader.mixing.interleave import MAX_POSITION, Interleave
from rangestream.loader.orders.permutation import keyed_hash

__all__ = [
    "CYCLE_KEY",
    "STATE_PHASES",
    "STATE_PHASE_EPOCH",
    "STATE_SAMPLES",
    "STATE_SEED",
    "STATE_SIZES",
    "STATE_SOURCES",
    "STATE_WEIGHTS",
    "Mixture",
    "MixtureSource",
    "SourceDraws",
    "check_count",
    "check_weight",
    "draw_keys",
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


def check_count(owner: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise LoaderConfigError(f"{owner} {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_weight(owner: str, value: object) -> float:
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
        object.__setattr__(self, "size", check_count(f"source {self.name!r}", "size", self.size, 1))
        object.__setattr__(self, "weight", check_weight(f"source {self.name!r}", self.weight))
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
            check_count("Mixture", "num_samples", self.num_samples, 1)
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
        return draw_keys(
            draws,
            np.int64(self.size),
            np.int64(self.passes),
            np.int64(epoch * self.passes),
            np.int64((epoch * self.remainder) % self.size),  # Python ints: no overflow
        )


def draw_keys(
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
