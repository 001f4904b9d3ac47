"""``StatefulDataLoader``: torchdata's loader with exact, elastic resume.

torchdata's own ``state_dict`` stores one snapshot per DataLoader worker and can only hand
each back to the same worker, so a checkpoint cannot be resumed with another
``num_workers``, world size or batch size. Because the datasets of this package make the
batch order independent of the worker count (:mod:`rangestream.loader.plan`), the main
process knows the position exactly from what it already sees: every batch it hands to the
training loop advances the epoch by one global batch. The state is that counter (as
Megatron-LM's ``consumed_samples``), and resuming sends it to freshly started workers.

Epochs follow PyTorch: one ``for batch in loader`` loop is one epoch; when it ends, the next
``iter(loader)`` plays the next epoch. Leaving a loop early (``break``) keeps the position, so
the next loop continues the same epoch.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torchdata.stateful_dataloader

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.iterable import BatchIterableDataset
from rangestream.loader.mixed import mixed_source
from rangestream.loader.options import BatchOptions, Collate
from rangestream.loader.position import LoaderPosition
from rangestream.loader.sources import SampleSource
from rangestream.loader.stepping import StepIterator
from rangestream.loader.storage_kinds import SourceOptions, build_source
from rangestream.loader.transport import for_transport

__all__ = ["STATE_VERSION", "StatefulDataLoader"]

STATE_VERSION = 1
"""Version of the :meth:`StatefulDataLoader.state_dict` schema."""

_DATASET_OPTIONS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "collate_fn")


def _start_method(kwargs: dict[str, Any]) -> str:
    """How the DataLoader will start its workers (``fork``, ``spawn``, ``forkserver``)."""
    context = kwargs.get("multiprocessing_context")
    if isinstance(context, str):
        return context
    if context is not None:
        return str(context.get_start_method())
    return str(multiprocessing.get_context().get_start_method())


def _pass_through(batch: Any) -> Any:
    """Batches are collated inside the dataset, in the worker; the loader only readies them
    for the trip to the main process (small tensors by value: ``loader.transport``)."""
    return for_transport(batch)


class StatefulDataLoader(torchdata.stateful_dataloader.StatefulDataLoader):
    """A ``torchdata`` ``StatefulDataLoader`` whose state resumes exactly and elastically.

    Parameters
    ----------
    dataset : BatchIterableDataset
        A dataset of this package (it yields whole batches and defines the sample order).
    head_start : bool, default True
        On local storage with workers, read the first batch, then (on the second
        ``next()``) up to 16 more, in this process, so the first batch does not wait for
        the workers to start (they start after those reads). The collate function then
        runs here for those batches. Ignored with ``pin_memory=True``, persistent workers
        and the block shuffle.
    **kwargs
        Process options of ``torch.utils.data.DataLoader``: ``num_workers``,
        ``persistent_workers``, ``pin_memory``, ``pin_memory_device``, ``timeout``,
        ``worker_init_fn``, ``multiprocessing_context``, ``prefetch_factor``,
        ``generator``. Batch options (``batch_size``, ``shuffle``, ``drop_last``,
        ``collate_fn``, samplers) belong to the dataset. With ``persistent_workers=True``
        the workers live across epochs and keep their readers open, so a new epoch opens
        nothing; the position reaches them through shared memory.

    Notes
    -----
    :meth:`state_dict` returns::

        {"version": 1, "epoch": int, "consumed_samples": int,
         ["phases": [[world_size, batch_size, num_workers, drop_last, steps], ...],]
         "kind": ..., "seed": int, ... the source's identity (shuffle, block shuffle
         parameters, frames, mixture sources and weights ...) ...,
         "batch_size": int, "world_size": int, "rank": int, "drop_last": bool}

    ``epoch`` and ``consumed_samples`` (and, for the block shuffle, ``phases``) define the
    position; the identity must match on load (the block shuffle's run length and buffer
    size are taken from the state); batch size, world size, rank and ``drop_last`` are
    recorded for inspection and may differ on resume. Every rank holds the same position,
    so any rank's state resumes any rank of the new run.
    """

    def __init__(
        self, dataset: BatchIterableDataset, *, head_start: bool = True, **kwargs: Any
    ) -> None:
        if not isinstance(dataset, BatchIterableDataset):
            raise LoaderConfigError(
                "StatefulDataLoader needs a rangestream BatchIterableDataset (e.g. from "
                f"StatefulDataLoader.from_storage), got {type(dataset).__name__}"
            )
        misplaced = sorted(set(kwargs) & set(_DATASET_OPTIONS))
        if misplaced:
            raise LoaderConfigError(
                f"{', '.join(misplaced)} belong(s) to the dataset (batches are built in the "
                "workers); pass them to the dataset or to from_storage"
            )
        if kwargs.get("in_order") is False:
            raise LoaderConfigError(
                "in_order=False reorders batches between workers, which breaks the batch "
                "order that the resume position relies on"
            )
        kwargs.setdefault("snapshot_every_n_steps", None)
        num_workers = kwargs.get("num_workers", 0)
        if num_workers > 0 and _start_method(kwargs) == "fork":
            # Forked workers inherit the parent's imports. Each worker seeds numpy.random
            # at start, importing it if the parent has not: in a forked child of a large
            # process that took ~120 ms before the first batch (43 vs 173 ms measured).
            import numpy.random  # noqa: F401

            dataset.preload()  # and the storage's client code
        if kwargs.get("persistent_workers") and num_workers > 0:
            dataset.share_position()
        with warnings.catch_warnings():
            # torchdata 0.11 calls a torch API that torch 2.13 deprecates; nothing to act on.
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            super().__init__(dataset, batch_size=None, collate_fn=_pass_through, **kwargs)
        dataset.tag_steps()  # batches come back tagged: stretches per worker, re-sorted here
        dataset.workers_per_rank = max(1, self.num_workers)
        self.head_start = bool(head_start)
        self._generation = 0
        self._order_version = 0
        self._io_by_source: list[list[int]] = []

    dataset: BatchIterableDataset

    @classmethod
    def from_storage(
        cls,
        storage: Any,
        collate_fn: Collate | None = None,
        *,
        sequence_length: int | None = None,
        batch_size: int = 8,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 2,
        shuffle: str | bool = True,
        shuffle_seed: int = 0,
        drop_last: bool = True,
        prefetch: int | None = None,
        pin_memory: bool = False,
        stride: int | None = None,
        next_token: bool = False,
        fields: Sequence[str] | None = None,
        samples_per_epoch: int | None = None,
        run_windows: int | None = None,
        buffer_runs: int | None = None,
        **kwargs: Any,
    ) -> StatefulDataLoader:
        """Build a loader over a storage, choosing the sample source by ``storage.kind``.

        Parameters
        ----------
        storage : object
            A storage whose ``kind`` is registered (see
            :mod:`rangestream.loader.storage_kinds`): ``"stream"``,
            ``"stream_with_meta"``, ``"document"`` or ``"temporal"``.
        collate_fn : callable, optional
            Builds a batch from a list of samples, inside the workers; defaults to
            :func:`rangestream.loader.stack_collate`. Use :class:`PadCollate` for
            variable-length fields.
        sequence_length : int, optional
            Elements per window; required for stream storages, frames per window for
            temporal storage, refused for documents.
        batch_size : int, default 8
            Samples per batch on each rank.
        rank, world_size : int, optional
            ``None`` takes them from ``torch.distributed`` if initialised, else 0 and 1.
        num_workers : int, default 2
            DataLoader worker processes per rank.
        shuffle : {True, "block", "window", False}, default True
            ``True`` takes the storage's default: the block shuffle over object storage
            (runs of about 4 MiB read whole, mixed within buffers of ``K`` runs: about one
            range request per run instead of one per window), the per-window shuffle on
            local disk (a random window there is a page-cache copy); see
            :func:`rangestream.loader.storage_kinds.default_shuffle`. ``"window"``: a global
            per-window shuffle, a new order each epoch. ``"block"``: the block shuffle
            (stream windows, documents). ``False``: storage order.
        shuffle_seed : int, default 0
            Seed of the shuffle (equal on all ranks).
        drop_last : bool, default True
            Skip the incomplete last global batch, or pad it by wrapping around to the
            start of the epoch's order; see :mod:`rangestream.loader.plan`.
        prefetch : int, optional
            Samples in flight per worker; by default two stretches of sequential windows
            (about 8 MiB) or two runs of the block shuffle, else
            :data:`rangestream.loader.DEFAULT_PREFETCH`.
        pin_memory : bool, default False
            Passed to the DataLoader.
        stride : int, optional
            Elements between window starts (streams); defaults to ``sequence_length``.
        next_token : bool, default False
            Windows carry one extra element for next-token targets (streams).
        fields : sequence of str, optional
            Fields to read (temporal only).
        samples_per_epoch : int, optional
            Windows drawn per epoch (temporal only).
        run_windows, buffer_runs : int, optional
            The block shuffle's windows per run and runs per buffer (``K``); chosen from
            the data when omitted (runs of about 4 MiB, ``K`` up to 8) and then kept in the
            state. A worker holds about ``K`` runs plus its prefetch.
        **kwargs
            Further DataLoader process options (see the class).

        Returns
        -------
        StatefulDataLoader
        """
        source = build_source(
            storage,
            SourceOptions(
                sequence_length=sequence_length,
                shuffle=None if shuffle is True else shuffle,
                seed=shuffle_seed,
                stride=stride,
                next_token=next_token,
                fields=fields,
                samples_per_epoch=samples_per_epoch,
                run_windows=run_windows,
                buffer_runs=buffer_runs,
            ),
        )
        options = BatchOptions(
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=prefetch,
            collate_fn=collate_fn,
        )
        return cls.from_source(
            source, options, num_workers=num_workers, pin_memory=pin_memory, **kwargs
        )

    @classmethod
    def from_storages(
        cls,
        weights: Mapping[Any, float],
        collate_fn: Collate | None = None,
        *,
        sequence_length: int | None = None,
        names: Mapping[Any, str] | None = None,
        per_source: Mapping[Any, Mapping[str, Any]] | None = None,
        num_samples: int | None = None,
        batch_size: int = 8,
        rank: int | None = None,
        world_size: int | None = None,
        num_workers: int = 2,
        shuffle: bool | str = True,
        shuffle_seed: int = 0,
        drop_last: bool = True,
        prefetch: int | None = None,
        pin_memory: bool = False,
        stride: int | None = None,
        next_token: bool = False,
        fields: Sequence[str] | None = None,
        samples_per_epoch: int | None = None,
        **kwargs: Any,
    ) -> StatefulDataLoader:
        """Build a loader over a weighted mixture of storages: ``{storage: weight, ...}``.

        The epoch is one global order over the sources (``docs/design.md``, "Mixing: exact
        proportions by random access"): in every prefix of it, over all ranks, each source's
        count is within the mixture's bound (1 for up to four sources) of ``weight * n``;
        each source is shuffled on its own, a source smaller than its share is repeated
        (each pass freshly shuffled), a larger one is down-sampled (a different subset each
        epoch). State, resume (exact, elastic over workers, world size and batch size) and
        batches are as for one storage; :meth:`set_weights` changes the weights from the
        current position on and :meth:`source_stats` reports what each source contributed.

        Parameters
        ----------
        weights : mapping of storage to float
            The sources and their relative weights. Their samples must batch together:
            windows of one length (stream storages), documents, or temporal windows.
        collate_fn : callable, optional
            As for :meth:`from_storage`.
        sequence_length, stride, next_token, fields, samples_per_epoch
            Every source's options, as for :meth:`from_storage`; ``per_source`` overrides
            them for one source (e.g. ``{code: {"stride": 1024}}``).
        names : mapping of storage to str, optional
            Each source's name: reported in :meth:`source_stats`, checked on resume, and
            the seed of its shuffle (so adding a source leaves the others' orders as they
            were). Defaults to the storage's URL; give names when URLs change between runs.
        per_source : mapping of storage to mapping, optional
            Options of one source that differ from the shared ones.
        num_samples : int, optional
            Positions per epoch; by default the most for which no source repeats.
        shuffle : {True, "block", "window", False}, default True
            ``True`` takes the storages' default: for windows over object storage each
            source's own block shuffle (runs of about 4 MiB read whole,
            :mod:`rangestream.loader.mixed_blocks`), else a per-sample shuffle of each
            source (``"window"``; a fresh one per pass). ``False`` reads each source in
            storage order.
        batch_size, rank, world_size, num_workers, shuffle_seed, drop_last, prefetch
            As for :meth:`from_storage`; so are ``pin_memory`` and ``**kwargs``.
        """
        source = mixed_source(
            weights,
            SourceOptions(
                sequence_length=sequence_length,
                stride=stride,
                next_token=next_token,
                fields=fields,
                samples_per_epoch=samples_per_epoch,
            ),
            names=names,
            per_source=per_source,
            num_samples=num_samples,
            seed=shuffle_seed,
            shuffle=shuffle,
        )
        options = BatchOptions(
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=prefetch,
            collate_fn=collate_fn,
        )
        return cls.from_source(
            source, options, num_workers=num_workers, pin_memory=pin_memory, **kwargs
        )

    @classmethod
    def from_source(
        cls, source: SampleSource, options: BatchOptions | None = None, **kwargs: Any
    ) -> StatefulDataLoader:
        """A loader over any :class:`~rangestream.loader.sources.SampleSource`."""
        return cls(BatchIterableDataset(source, options), **kwargs)

    # -- position ------------------------------------------------------------------------

    @property
    def position(self) -> LoaderPosition:
        """The loader's position (owned by its dataset, advanced here batch by batch)."""
        return self.dataset.position

    @property
    def epoch(self) -> int:
        """Epoch that the current or next ``for`` loop plays."""
        return self.dataset.position.epoch

    @property
    def consumed_samples(self) -> int:
        """Samples of :attr:`epoch` handed out so far by all ranks together."""
        return self.dataset.position.consumed_samples

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` from its start next; the current epoch keeps its position.

        This makes ``for epoch in range(start, end): loader.set_epoch(epoch)`` both start
        fresh epochs and continue a resumed one.
        """
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise LoaderConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self.epoch:
            self._move(LoaderPosition(int(epoch)))

    def _move(self, position: LoaderPosition) -> None:
        self.dataset.seek(position)
        self._generation += 1
        if not self._persistent_workers_alive():
            self._iterator = None

    def _persistent_workers_alive(self) -> bool:
        return bool(self.persistent_workers and self.num_workers > 0)

    def _end_epoch(self) -> None:
        self.dataset.seek(self.dataset.position.next_epoch())

    def _count_io(self, io: list[tuple[int, int]] | None) -> None:
        if not io:
            return
        totals = self._io_by_source
        if not totals:
            totals.extend([0, 0] for _ in io)
        for total, (requests, nbytes) in zip(totals, io, strict=True):
            total[0] += requests
            total[1] += nbytes

    def source_stats(self) -> dict[str, dict[str, int]]:
        """What each source contributed: samples, requests and bytes.

        ``samples``: of the current epoch's consumed positions, over all ranks together
        (computed from the order: exact, whatever was read ahead). ``requests`` and
        ``bytes``: what this rank's readers (workers, and this process for a head start)
        have read from each source since this loader was made, opens included, read ahead
        included. A single source is reported under the name ``"source"``.
        """
        source = self.dataset.source
        position = self.dataset.position
        counts = getattr(source, "source_counts", None)
        if counts is None:
            samples = {"source": position.consumed_samples}
        else:
            samples = counts(position.epoch, 0, position.consumed_samples)
        io = self._io_by_source or [[0, 0] for _ in samples]
        return {
            name: {"samples": count, "requests": requests, "bytes": nbytes}
            for (name, count), (requests, nbytes) in zip(samples.items(), io, strict=True)
        }

    def set_weights(self, weights: dict[str, float]) -> None:
        """New mixture weights from the loader's current position on (a curriculum).

        Positions already handed out keep their order; from :attr:`consumed_samples` of the
        current epoch on, the sources interleave by ``weights``, exactly (every prefix from
        here within the mixture's bound of each share), each source continuing its own
        draws; later epochs keep these weights. A ``for`` loop in progress continues at its
        next batch under the new weights (its workers restart from the position; batches
        they had read ahead are dropped). The weights and where they changed are part of
        :meth:`state_dict`, so a resumed run replays the same curriculum.
        """
        source = self.dataset.source
        set_weights = getattr(source, "set_weights", None)
        if set_weights is None:
            raise LoaderConfigError(f"{source!r} is not a mixture; it has no weights to set")
        position = self.dataset.position
        set_weights(weights, epoch=position.epoch, position=position.consumed_samples)
        self._order_version += 1
        self._iterator = None  # workers (persistent ones too) hold the old order

    def _advance(self) -> None:
        dataset = self.dataset
        dataset.position = dataset.position.advanced(dataset.options.global_batch_size)

    def __iter__(self) -> StepIterator:  # type: ignore[override]
        self._generation += 1
        dataset = self.dataset
        if dataset.block_shuffled:
            # the phase played from here (a new one if the setting changed since the state)
            position = dataset.position
            phases = dataset.phases_for(position, max(1, self.num_workers))
            if phases != position.phases:
                dataset.seek(LoaderPosition(position.epoch, position.consumed_samples, phases))
        return StepIterator(self, self._generation)

    def _start_workers(self, start: LoaderPosition) -> Iterator[Any]:
        """The DataLoader's iterator from ``start`` on."""
        self.dataset.start_workers_at(start)
        try:
            return super().__iter__()
        finally:
            self.dataset.start_workers_at(None)

    def _head_start(self) -> bool:
        """Whether the first stretch is read in this process (see :mod:`.stepping`).

        Worker start-up (fork, imports, torchdata's handshake) takes 20-40 ms; a local
        stretch is read here in about a millisecond. Not with pinned memory (the DataLoader
        pins what workers send), with persistent workers (they are started once) or when
        switched off.
        """
        return (
            self.head_start
            and self.num_workers > 0
            and not self.pin_memory
            and not self.persistent_workers
        )

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the settings it depends on, as plain data."""
        dataset = self.dataset
        options = dataset.options
        return {
            "version": STATE_VERSION,
            **dataset.position.state_dict(),
            **dataset.state_identity(),
            **dataset.order_state(),
            "batch_size": options.batch_size,
            "world_size": options.world_size,
            "rank": options.rank,
            "drop_last": options.drop_last,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a position saved by :meth:`state_dict`.

        The next ``iter()`` yields exactly what the saved run would have yielded next: the
        remaining samples of the saved epoch, re-cut into this loader's batches and ranks.
        """
        if state_dict.get("version") != STATE_VERSION:
            raise StateError(
                f"StatefulDataLoader state version {state_dict.get('version')!r} is not the "
                f"supported version {STATE_VERSION}"
            )
        self.dataset.adopt_identity(state_dict)
        position = LoaderPosition.from_state_dict(state_dict)
        self.dataset.load_order_state(state_dict, position)
        if self.dataset.block_shuffled and position.phases is None and position.consumed_samples:
            raise StateError(
                "the state has no phases but this loader is block-shuffled: it was saved "
                "under another order"
            )
        self._move(position)
