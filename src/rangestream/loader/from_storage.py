"""Loaders over storages: the sample source chosen by each storage's kind.

``StatefulDataLoader.from_storage`` (one storage), ``from_storages`` (a weighted mixture)
and ``from_source`` (any :class:`~rangestream.loader.sources.protocol.SampleSource`) turn
the arguments a user passes into the two values the loader is made of: a sample source
(what is read, in which order: :mod:`rangestream.loader.sources.storage_kinds`,
:func:`rangestream.loader.mixing.mixed_source.mixed_source`) and
:class:`~rangestream.loader.options.BatchOptions` (how batches are cut). They live apart
from :mod:`rangestream.loader.dataloader` because they only build; the loader hands out
batches and keeps the position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from rangestream.loader.iterable import BatchIterableDataset
from rangestream.loader.mixing.mixed_source import mixed_source
from rangestream.loader.options import BatchOptions, Collate
from rangestream.loader.sources.protocol import SampleSource
from rangestream.loader.sources.storage_kinds import SourceOptions, build_source

__all__ = ["StorageConstructors"]


class StorageConstructors:
    """The constructors of :class:`rangestream.loader.StatefulDataLoader` (a mixin: ``cls``
    is the loader class, whose ``__init__`` takes the dataset and process options)."""

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
        boundaries: bool = False,
        keys: Sequence[str] | None = None,
        token_dtype: str | None = "int64",
        **kwargs: Any,
    ) -> Self:
        """Build a loader over a storage, choosing the sample source by ``storage.kind``.

        Parameters
        ----------
        storage : object
            A storage whose ``kind`` is registered (see
            :mod:`rangestream.loader.sources.storage_kinds`): ``"stream"``,
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
            ``None`` takes them from ``torch.distributed`` when iteration starts (the
            loader may be built before ``init_process_group``), else 0 and 1.
        num_workers : int, default 2
            DataLoader worker processes per rank.
        shuffle : {True, "block", "window", False}, default True
            ``True`` takes the storage's default: the block shuffle over object storage
            (runs of about 4 MiB read whole, mixed within buffers of ``K`` runs: about one
            range request per run instead of one per window), the per-window shuffle on
            local disk (a random window there is a page-cache copy); see
            :func:`rangestream.loader.sources.storage_kinds.default_shuffle`. ``"window"``: a global
            per-window shuffle, a new order each epoch. ``"block"``: the block shuffle
            (stream windows, documents). ``False``: storage order.
        shuffle_seed : int, default 0
            Seed of the shuffle (equal on all ranks).
        drop_last : bool, default True
            Skip the incomplete last global batch, or pad it by wrapping around to the
            start of the epoch's order; see :mod:`rangestream.loader.orders.sequence_plan`.
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
        boundaries : bool, default False
            Stream windows carry their records' ``cu_seqlens`` and ``position_ids``
            (:class:`rangestream.dataset.StreamDataset`); collate them with
            :class:`rangestream.loader.VarlenCollate` for flash-attention's varlen kernels.
        keys : sequence of str, optional
            Documents: read only these keys of each record.
        token_dtype : str or None, default "int64"
            Stream windows and documents: integer arrays (token ids, stored as ``uint16``
            or ``uint32``) come as this dtype, what ``nn.Embedding`` and ``cross_entropy``
            take; ``None`` keeps the stored dtype. Temporal arrays keep theirs.
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
                boundaries=boundaries,
                keys=keys,
                token_dtype=token_dtype,
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
        boundaries: bool = False,
        keys: Sequence[str] | None = None,
        token_dtype: str | None = "int64",
        **kwargs: Any,
    ) -> Self:
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
        sequence_length, stride, next_token, fields, samples_per_epoch, boundaries, keys,
        token_dtype
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
            :mod:`rangestream.loader.reading.mixed_blocks`), else a per-sample shuffle of each
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
                boundaries=boundaries,
                keys=keys,
                token_dtype=token_dtype,
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
    ) -> Self:
        """A loader over any :class:`~rangestream.loader.sources.protocol.SampleSource`."""
        return cls(BatchIterableDataset(source, options), **kwargs)  # type: ignore[call-arg]
