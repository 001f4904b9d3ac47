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
from collections.abc import Iterator, Sequence
from typing import Any

import torchdata.stateful_dataloader

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.iterable import BatchIterableDataset, Collate
from rangestream.loader.storage_kinds import LoaderOptions, build_dataset
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


_MISSING = object()


class _CountingIterator(Iterator[Any]):
    """Hands out batches in step order; advances the position by one global batch each.

    Workers build runs of consecutive steps (one range request per run in sequential
    order) and tag every batch with its step, so the DataLoader's worker round robin
    delivers e.g. steps 0, 16, 1, 17, ...; batches that arrive early wait here, at most
    ``(num_workers - 1) * MAX_RUN_STEPS`` of them.

    With a head start (local storage, workers), the first run is read in this process on
    the first ``next()``, and the workers are started on the second, from the step after
    that run; until then, no worker exists.
    """

    def __init__(
        self, loader: StatefulDataLoader, generation: int, epoch: int, consumed: int
    ) -> None:
        self._loader = loader
        self._generation = generation
        self._epoch = epoch
        self._consumed = consumed
        self._inner: Iterator[Any] | None = None
        self._head: Iterator[tuple[int, Any]] | None = None
        self._step_offset = 0
        self._finished = False
        self._next_step = 0
        self._early: dict[int, Any] = {}
        if loader._head_start():
            self._head = loader.dataset.head_run(epoch, consumed)

    def __iter__(self) -> _CountingIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        loader = self._loader
        if loader._generation != self._generation:
            raise StateError(
                "this loader iterator was superseded by a later iter(), set_epoch() or "
                "load_state_dict() on its StatefulDataLoader; continuing it would lose the "
                "position"
            )
        batch = self._early.pop(self._next_step, _MISSING)
        if batch is _MISSING and self._head is not None and self._next_step == 0:
            step, batch = next(self._head, (0, _MISSING))
            assert step == 0, f"the head run started at step {step}"
        while batch is _MISSING:
            workers = self._workers()
            batch = self._early.pop(self._next_step, _MISSING)  # the head run's rest
            if batch is not _MISSING:
                break
            try:
                step, received = next(workers)
            except StopIteration:
                self._finished = True
                if self._early:
                    raise StateError(
                        f"the workers ended the epoch without step {self._next_step} but "
                        f"with steps {sorted(self._early)}; a batch was lost"
                    ) from None
                loader._end_epoch()
                raise
            step += self._step_offset
            if step == self._next_step:
                batch = received
            else:
                self._early[step] = received
        self._next_step += 1
        loader._consumed_samples += loader.dataset.global_batch_size
        return batch

    def _workers(self) -> Iterator[Any]:
        """The DataLoader's own iterator, started (workers and all) on first use."""
        if self._inner is None:
            if self._head is not None:
                # the rest of the head run, then its reader closes: nothing is open at fork
                self._early.update(self._head)
                self._head = None
                self._step_offset = self._next_step + len(self._early)
            start = self._consumed + self._step_offset * self._loader.dataset.global_batch_size
            self._inner = self._loader._start_workers(self._epoch, start)
        return self._inner


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
        runs here for those batches. Ignored with ``pin_memory=True``.
    **kwargs
        Process options of ``torch.utils.data.DataLoader``: ``num_workers``,
        ``pin_memory``, ``pin_memory_device``, ``timeout``, ``worker_init_fn``,
        ``multiprocessing_context``, ``prefetch_factor``, ``generator``. Batch options
        (``batch_size``, ``shuffle``, ``drop_last``, ``collate_fn``, samplers) belong to the
        dataset. ``persistent_workers=True`` is refused: persistent workers would keep the
        position they were started with.

    Notes
    -----
    :meth:`state_dict` returns::

        {"version": 1, "epoch": int, "consumed_samples": int, "seed": int,
         "kind": "indexed" | "temporal", ... dataset identity (shuffle, or frames/sampling/
         samples_per_epoch) ..., "batch_size": int, "world_size": int, "rank": int,
         "drop_last": bool}

    Only ``epoch`` and ``consumed_samples`` define the position; seed and identity must
    match on load; batch size, world size, rank and ``drop_last`` are recorded for
    inspection and may differ on resume. Every rank holds the same position, so any
    rank's state resumes any rank of the new run.
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
        if kwargs.get("persistent_workers"):
            raise LoaderConfigError(
                "persistent_workers=True would keep each worker's start position across "
                "epochs and resumes; workers must restart to receive the loader's position"
            )
        if kwargs.get("in_order") is False:
            raise LoaderConfigError(
                "in_order=False reorders batches between workers, which breaks the batch "
                "order that the resume position relies on"
            )
        kwargs.setdefault("snapshot_every_n_steps", None)
        if kwargs.get("num_workers", 0) > 0 and _start_method(kwargs) == "fork":
            # Forked workers inherit the parent's imports. Each worker seeds numpy.random
            # at start, importing it if the parent has not: in a forked child of a large
            # process that took ~120 ms before the first batch (43 vs 173 ms measured).
            import numpy.random  # noqa: F401

            dataset.preload()  # and the storage's client code
        with warnings.catch_warnings():
            # torchdata 0.11 calls a torch API that torch 2.13 deprecates; nothing to act on.
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            super().__init__(dataset, batch_size=None, collate_fn=_pass_through, **kwargs)
        dataset.tag_steps()  # batches come back tagged: runs per worker, re-sorted here
        self.head_start = bool(head_start)
        self._epoch = 0
        self._consumed_samples = 0
        self._generation = 0

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
        shuffle: bool = True,
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
        """Build a loader over a storage, choosing the dataset by ``storage.kind``.

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
            DataLoader worker processes per rank; the order does not depend on it.
        shuffle : bool, default True
            Global shuffle, a new order each epoch.
        shuffle_seed : int, default 0
            Seed of the shuffle (equal on all ranks).
        drop_last : bool, default True
            Skip the incomplete last global batch, or pad it by wrapping around to the
            start of the epoch's order; see :mod:`rangestream.loader.plan`.
        prefetch : int, optional
            Samples in flight per worker; by default two runs of sequential windows
            (about 8 MiB), else
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
        **kwargs
            Further DataLoader process options (see the class).

        Returns
        -------
        StatefulDataLoader
        """
        options = LoaderOptions(
            sequence_length=sequence_length,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            drop_last=drop_last,
            prefetch=prefetch,
            stride=stride,
            next_token=next_token,
            fields=fields,
            samples_per_epoch=samples_per_epoch,
            collate_fn=collate_fn,
        )
        dataset = build_dataset(storage, options)
        return cls(dataset, num_workers=num_workers, pin_memory=pin_memory, **kwargs)

    # -- position ------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Epoch that the current or next ``for`` loop plays."""
        return self._epoch

    @property
    def consumed_samples(self) -> int:
        """Samples of :attr:`epoch` handed out so far by all ranks together."""
        return self._consumed_samples

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` from its start next; the current epoch keeps its position.

        This makes ``for epoch in range(start, end): loader.set_epoch(epoch)`` both start
        fresh epochs and continue a resumed one.
        """
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise LoaderConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self._epoch:
            self._move(int(epoch), 0)

    def _move(self, epoch: int, consumed_samples: int) -> None:
        self._epoch = epoch
        self._consumed_samples = consumed_samples
        self._generation += 1
        self._iterator = None

    def _end_epoch(self) -> None:
        self._epoch += 1
        self._consumed_samples = 0

    def __iter__(self) -> _CountingIterator:  # type: ignore[override]
        self._generation += 1
        return _CountingIterator(self, self._generation, self._epoch, self._consumed_samples)

    def _start_workers(self, epoch: int, consumed_samples: int) -> Iterator[Any]:
        """The DataLoader's iterator from ``consumed_samples`` of ``epoch`` on."""
        self.dataset.seek(epoch, consumed_samples)
        return super().__iter__()

    def _head_start(self) -> bool:
        """Whether the first run is read in this process (see :class:`_CountingIterator`).

        Worker start-up (fork, imports, torchdata's handshake) takes 20-40 ms; a local run
        is read here in about a millisecond. Not with pinned memory (the DataLoader pins
        what workers send) or when switched off.
        """
        return self.head_start and self.num_workers > 0 and not self.pin_memory

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the settings it depends on, as plain data."""
        dataset = self.dataset
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "consumed_samples": self._consumed_samples,
            "seed": dataset.seed,
            **dataset.state_identity(),
            "batch_size": dataset.batch_size,
            "world_size": dataset.world_size,
            "rank": dataset.rank,
            "drop_last": dataset.drop_last,
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
        dataset = self.dataset
        expected = {"seed": dataset.seed, **dataset.state_identity()}
        for key, value in expected.items():
            if state_dict.get(key) != value:
                raise StateError(
                    f"cannot resume: the state has {key}={state_dict.get(key)!r} but this "
                    f"loader has {key}={value!r}; the remaining samples would differ"
                )
        position: dict[str, int] = {}
        for key in ("epoch", "consumed_samples"):
            value = state_dict.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateError(f"state {key} must be a non-negative integer, got {value!r}")
            position[key] = value
        self._move(position["epoch"], position["consumed_samples"])
