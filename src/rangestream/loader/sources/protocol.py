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
- what identifies its order, so a saved position is only resumed under the same order.

Windows and documents (:class:`IndexedSource`), random temporal windows
(:class:`rangestream.loader.sources.temporal.TemporalWindowSource`) and mixtures of sources
(:class:`rangestream.loader.mixing.mixed_source.MixedSource`) are implementations; a dataset of
whole records with ``read_many(indexes)`` readers is one more :class:`IndexedSource`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["SampleSource"]


@runtime_checkable
class SampleSource(Protocol):
    """What the loader reads: samples per epoch, the order, and sync and async reads.

    A source is a picklable description: it is sent to DataLoader workers, and it opens
    nothing until the loader enters :meth:`open_sync` or :meth:`open_async` in the process
    that iterates (after any fork). ``reader`` below is what that context yields.
    """

    #: Seed of the order (equal on every rank); saved with every state.
    seed: int

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
