"""Sample sources: the one contract between the loader and what it reads.

The loader (:class:`rangestream.loader.BatchIterableDataset`) cuts an epoch into batches,
ranks and workers, reads ahead and keeps the position. What it reads comes from a
:class:`SampleSource`, which answers four questions:

- how many samples an epoch has (:meth:`~SampleSource.count` in the calling process,
  :meth:`~SampleSource.num_samples` from a reader in the process that iterates);
- which read request sequence index ``i`` of epoch ``e`` becomes
  (:meth:`~SampleSource.requests`: the order, a shuffle or a draw, lives here);
- how to read a batch of requests, synchronously (local disk: no event loop) or
  asynchronously (object storage, on the process's I/O loop);
- what identifies its order, so a saved position is only resumed under the same order;
- and, as explicit capabilities rather than attributes for callers to probe: how it plans an
  epoch (:attr:`~SampleSource.planning`), the state of its order beside its identity (a
  mixture's weights), its sources (one, or a mixture's several) and whether it shuffles
  its samples itself.

The user's ``shuffle`` argument is parsed once, where a source is made, into a
:class:`Shuffle`; the source answers the loader with its :class:`EpochPlanning`, which the
loader maps once to its reading strategy (:mod:`rangestream.loader.reading.strategies`).
Nothing downstream asks which shuffle a source has.

Windows and documents (:class:`IndexedSource`), random temporal windows
(:class:`rangestream.loader.sources.temporal.TemporalWindowSource`) and mixtures of sources
(:class:`rangestream.loader.mixing.mixed_source.MixedSource`) are implementations; a dataset of
whole records with ``read_many(indexes)`` readers is one more :class:`IndexedSource`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rangestream.errors import LoaderConfigError
from rangestream.loader.orders.block_shuffle import BlockShuffle

__all__ = [
    "BlockShuffledSource",
    "EpochPlanning",
    "SampleSource",
    "Shuffle",
    "storage_commit",
]


def storage_commit(storage: Any) -> str | None:
    """The commit id of the version ``storage`` reads (``None`` for storages without
    committed versions, e.g. test doubles). Opens the storage in this process, once."""
    opening = getattr(storage, "default_opening", None)
    get_sync = getattr(opening, "get_sync", None)
    if not callable(get_sync):
        return None
    commit = getattr(getattr(get_sync(), "manifest", None), "commit_id", None)
    return commit if isinstance(commit, str) else None


class Shuffle(enum.Enum):
    """A source's order, parsed once from the user's ``shuffle`` argument.

    The value is what the source's identity (and so every saved state) records: ``True``
    for the per-window shuffle, ``"block"`` for the block shuffle, ``False`` for storage
    order.
    """

    WINDOW = True
    BLOCK = "block"
    NONE = False

    @property
    def mode(self) -> str | bool:
        """The shuffle as users name it: ``"window"``, ``"block"`` or ``False``."""
        return "window" if self is Shuffle.WINDOW else self.value

    @classmethod
    def parse(cls, shuffle: object) -> Shuffle:
        """``shuffle`` (``True`` or ``"window"``, ``"block"``, ``False``) as a value."""
        if shuffle is True or shuffle == "window":
            return cls.WINDOW
        if shuffle == "block":
            return cls.BLOCK
        if shuffle is False:
            return cls.NONE
        raise LoaderConfigError(f"shuffle must be 'block', 'window' or False, got {shuffle!r}")


class EpochPlanning(enum.Enum):
    """How a source's epoch is planned, and so which reading strategy reads it.

    ``SEQUENCE``: one global sequence of indices (storage order, the per-window shuffle,
    temporal draws, mixtures shuffled per sample), cut into stretches of steps
    (:mod:`rangestream.loader.orders.sequence_plan`). ``BLOCKS``: the block shuffle, by
    regions of readers and runs, its phases in the position
    (:mod:`rangestream.loader.orders.block_shuffle`). ``MIXED_BLOCKS``: a mixture whose
    sources each run their own block shuffle (:mod:`rangestream.loader.mixing.block_plan`).
    """

    SEQUENCE = "sequence"
    BLOCKS = "blocks"
    MIXED_BLOCKS = "mixed blocks"


@runtime_checkable
class SampleSource(Protocol):
    """What the loader reads: samples per epoch, the order, and sync and async reads.

    A source is a picklable description: it is sent to DataLoader workers, and it opens
    nothing until the loader enters :meth:`open_sync` or :meth:`open_async` in the process
    that iterates (after any fork). ``reader`` below is what that context yields.

    The capabilities after :meth:`preload` have defaults for a single source planned as a
    sequence: a source that subclasses this protocol inherits them and overrides what it
    does differently (the block shuffle, a mixture).
    """

    #: Seed of the order (equal on every rank); saved with every state.
    seed: int

    #: How an epoch of this source is planned (which reading strategy reads it).
    planning: EpochPlanning = EpochPlanning.SEQUENCE

    def identity(self) -> dict[str, Any]:
        """Plain data that defines the epoch's order (checked when a state is loaded)."""

    def count(self) -> int:
        """Samples per epoch, counted in the calling process (``len(loader)``)."""

    def num_samples(self, reader: Any) -> int:
        """Samples per epoch, from the reader of the iterating process."""

    def requests(self, reader: Any, indices: np.ndarray, epoch: int) -> Sequence[Any]:
        """Read requests of epoch-sequence ``indices`` (``int64``), in order."""

    def open_sync(self) -> AbstractContextManager[Any] | None:
        """A sync reader's context where reads are local copies; ``None`` reads remotely
        through :meth:`open_async` on the process's I/O loop."""

    def open_async(self) -> AbstractAsyncContextManager[Any]:
        """The async reader's context, entered on the process's I/O loop."""

    def read_many_sync(self, reader: Any, requests: list[Any]) -> list[Any]:
        """Samples of ``requests`` from the reader of :meth:`open_sync`."""

    async def read_many(self, reader: Any, requests: list[Any]) -> list[Any]:
        """Samples of ``requests``, read together (one round of coalesced requests)."""

    def sample_span_bytes(self) -> int | None:
        """Storage bytes between consecutive samples of the epoch's order if they are
        adjacent there (sequential windows; documents, on average), else ``None``."""

    def reads_per_batch(self) -> int:
        """``read_many`` calls the requests of one batch become (a mixture's sources)."""

    def preload(self) -> None:
        """Import the client code reading will need (before DataLoader workers fork)."""

    # -- capabilities (defaults: one source, no order state, read as given) -------------

    def shuffles_itself(self) -> bool:
        """Whether the source reorders its samples (a mixture takes only sources that do
        not: it orders each itself; drawing, as temporal windows do, is not reordering)."""
        return False

    def adopt_order_parameters(self, state: Mapping[str, Any]) -> None:
        """Take order parameters chosen by a saved run (the block shuffle's run length
        and buffer size) from its ``state``, unless given here."""
        return None

    def order_state(self) -> dict[str, Any] | None:
        """The order's own state beside its identity (a mixture's weights and curriculum
        phases), as plain data; ``None`` for an order without one."""
        return None

    def load_order_state(
        self, state: Mapping[str, Any] | None, *, epoch: int, position: int
    ) -> None:
        """Continue a saved run's order state (what :meth:`order_state` saved, ``None``
        if the state has none) at ``position`` of ``epoch``."""
        return None

    def set_weights(self, weights: Mapping[str, float], *, epoch: int, position: int) -> None:
        """New weights from ``position`` of ``epoch`` on; only a mixture has weights."""
        raise LoaderConfigError(f"{self!r} is not a mixture; it has no weights to set")

    def source_counts(self, epoch: int, start: int, stop: int) -> dict[str, int]:
        """Samples of each source among positions ``[start, stop)`` of ``epoch`` (one
        source is named ``"source"``)."""
        return {"source": stop - start}

    def describe_data(self) -> dict[str, Any]:
        """What data the positions index: the storage's commit, the sample count, the
        window geometry (``sequence_length``, ``stride``, ``next_token``); a saved state
        is refused on another (the same position would name other samples). Asked in the
        process that builds the loader; plain data."""
        return {}

    def window_length(self) -> int | None:
        """Elements per sample of a source of fixed-length windows (mixed windows must
        share one), else ``None``."""
        return None

    def source_readers(self, reader: Any) -> list[Any]:
        """The reader of each source within ``reader`` (the loader counts each one's
        requests and bytes): the reader itself for a single source."""
        return [reader]


class BlockShuffledSource(SampleSource, Protocol):
    """A source planned by the block shuffle (:attr:`EpochPlanning.BLOCKS`)."""

    #: Windows per run; chosen on the first :meth:`block_shuffle` unless given.
    run_windows: int | None
    #: Runs per buffer (``K``); chosen on the first :meth:`block_shuffle` unless given.
    buffer_runs: int | None

    def block_shuffle(self, num_samples: int, readers: int) -> BlockShuffle:
        """The block shuffle of an epoch of ``num_samples`` read by ``readers`` workers
        (its parameters chosen on first use, then kept: they define the order)."""
