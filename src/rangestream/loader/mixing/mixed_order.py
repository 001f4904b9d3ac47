"""Weighted mixtures of sources: one global order per epoch, exact at every prefix.

A :class:`Mixture` names its sources (each with its size in samples, its weight and its own
loader options), the samples per epoch and the seed. :class:`MixedOrder` turns it into the
epoch's global order, position by position and without per-epoch arrays:

1. the *interleave* (:class:`rangestream.loader.mixing.interleave.Interleave`) says which source
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError, OutOfRangeError, StateError
from rangestream.loader.mixing.interleave import Interleave
from rangestream.loader.mixing.mixture import (
    CYCLE_KEY,
    STATE_PHASE_EPOCH,
    STATE_PHASES,
    STATE_SAMPLES,
    STATE_WEIGHTS,
    Mixture,
    MixtureSource,
    SourceDraws,
    check_count,
    check_weight,
    draw_keys,
)
from rangestream.loader.mixing.source_orders import (
    SequentialOrder,
    ShuffledOrder,
    SourceOrder,
    shuffle_groups,
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
            check_weight(f"source {name!r}", value)
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
        epoch = check_count("set_weights", "epoch", epoch, 0)
        position = check_count("set_weights", "position", position, 0)
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
        if new != phases[-1].weights:  # the same weights again change nothing
            if position > phases[-1].start:
                phases = (*phases, MixPhase(position, new))
            elif len(phases) > 1 and phases[-2].weights == new:
                phases = phases[:-1]  # the last phase never took a position: the one before
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
        keys, indices = draw_keys(
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
            samples[members] = shuffle_groups(
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
        position = check_count("draws_before", "position", position, 0)
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
