"""``StatefulDataLoader``: torchdata's loader with exact, elastic resume.

torchdata's own ``state_dict`` stores one snapshot per DataLoader worker and can only hand
each back to the same worker, so a checkpoint cannot be resumed with another
``num_workers``, world size or batch size. Because the datasets of this package make the
batch order independent of the worker count (:mod:`rangestream.loader.orders.sequence_plan`), the
main process knows the position exactly from what it already sees: every batch it hands to the
training loop advances the epoch by one global batch. The state is that counter (as
Megatron-LM's ``consumed_samples``), and resuming sends it to freshly started workers.

Epochs follow PyTorch: one ``for batch in loader`` loop is one epoch; when it ends, the next
``iter(loader)`` plays the next epoch. Leaving a loop early (``break``) keeps the position, so
the next loop continues the same epoch.

Handing out batches in step order is the :class:`StepIterator`'s job (one per ``for`` loop):
workers build stretches of consecutive steps (one range request per stretch in sequential
order) and tag every batch with its step, so the DataLoader's worker round robin delivers
e.g. steps 0, 16, 1, 17, ...; batches that arrive early wait there, at most
``(num_workers - 1) * MAX_STRETCH_STEPS`` of them plus a bundle (workers send several tagged
batches per message: :mod:`rangestream.loader.transport`). With a head start (local
storage, workers), the first stretch is read in this process on the first ``next()``, and
the workers are started on the second, from the step after that stretch; until then, no
worker exists. What the step iterator may do to its loader is :class:`LoaderSteps`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torchdata.stateful_dataloader

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.from_storage import StorageConstructors
from rangestream.loader.iterable import BatchIterableDataset
from rangestream.loader.position import LoaderPosition
from rangestream.loader.reading.stalls import StallClock
from rangestream.loader.transport import IO_FIELDS, Bundle, for_transport
from rangestream.loader.worker_guard import WorkerStart
from rangestream.loader.worker_imports import preload_forkserver

__all__ = ["STATE_VERSION", "LoaderSteps", "StatefulDataLoader", "StepIterator"]

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


class StatefulDataLoader(StorageConstructors, torchdata.stateful_dataloader.StatefulDataLoader):
    """A ``torchdata`` ``StatefulDataLoader`` whose state resumes exactly and elastically.

    Parameters
    ----------
    dataset : BatchIterableDataset
        A dataset of this package (it yields whole batches and defines the sample order).
    head_start : bool, default True
        On local storage with workers, read the first batch, then (on the second
        ``next()``) up to 16 more, in this process, so the first batch does not wait for
        the workers to start (they start after those reads). The collate function then
        runs here for those batches. Only while no worker is running (persistent workers
        are started once, so later epochs read in them), and not with ``pin_memory=True``,
        the block shuffle or a ``worker_init_fn`` (which runs before any read).
    **kwargs
        Process options of ``torch.utils.data.DataLoader``: ``num_workers``,
        ``persistent_workers``, ``pin_memory``, ``pin_memory_device``, ``timeout``,
        ``worker_init_fn``, ``multiprocessing_context``, ``prefetch_factor``,
        ``generator``. Batch options (``batch_size``, ``shuffle``, ``drop_last``,
        ``collate_fn``, samplers) belong to the dataset. ``persistent_workers``
        defaults to ``True`` with workers (torch's default is ``False``): the workers live
        across epochs and keep their readers open, so a new epoch starts no process and
        opens nothing, and its first batch is as quick as any (restarting them cost 150-500
        ms per epoch over S3); the position reaches them through shared memory. Pass
        ``persistent_workers=False`` to free the workers between epochs (a
        ``worker_init_fn`` then runs again every epoch).

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
        if num_workers > 0:
            kwargs.setdefault("persistent_workers", True)  # epochs without restarts
        method = _start_method(kwargs) if num_workers > 0 else None
        if method == "fork":
            # Forked workers inherit the parent's imports. Each worker seeds numpy.random
            # at start, importing it if the parent has not: in a forked child of a large
            # process that took ~120 ms before the first batch (43 vs 173 ms measured).
            import numpy.random  # noqa: F401

            dataset.preload()  # and the storage's client code
        elif method == "forkserver":
            preload_forkserver()  # torch and this package, once (loader.worker_imports)
        if kwargs.get("persistent_workers") and num_workers > 0:
            dataset.share_position()
        #: The user's ``worker_init_fn``: with one, no batch is read before it ran (the
        #: head start, which reads in this process, is off).
        self.user_worker_init = kwargs.get("worker_init_fn")
        if num_workers > 0:
            # workers die with this process, whatever kills it (loader.worker_guard)
            kwargs["worker_init_fn"] = WorkerStart(os.getpid(), self.user_worker_init)
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
        self._stalls = StallClock()

    dataset: BatchIterableDataset

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read first by ``accelerate.Accelerator.prepare``, which would rebuild a plain
        DataLoader over :attr:`dataset`: refused there, at once (the rebuilt loader keeps no
        position for ``save_state`` and shards again what this loader shards by rank)."""
        raise LoaderConfigError(
            "accelerate's prepare() rebuilds a DataLoader from loader.dataset: it would keep "
            "no position (save_state/load_state could not resume it) and, with several "
            "processes, shard again what this loader already shards by rank. Use "
            "rangestream.integrations.accelerate.Accelerator (prepare() then keeps this "
            "loader, moves its batches to the device and registers it for checkpointing), "
            "or keep the loader out of prepare(): accelerator.register_for_checkpointing("
            "loader), batches moved with accelerate.utils.send_to_device"
        )

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
        if not self._keeps_workers():
            self._iterator = None

    def _keeps_workers(self) -> bool:
        """Whether workers live across epochs (persistent; the default with workers)."""
        return bool(self.persistent_workers and self.num_workers > 0)

    def _workers_running(self) -> bool:
        """Whether persistent workers have been started (and are kept)."""
        return self._keeps_workers() and self._iterator is not None

    def _end_epoch(self) -> None:
        self.dataset.seek(self.dataset.position.next_epoch())

    def _count_io(self, io: list[tuple[int, ...]] | None) -> None:
        if not io:
            return
        totals = self._io_by_source
        if not totals:
            totals.extend([0] * len(IO_FIELDS) for _ in io)
        for total, counts in zip(totals, io, strict=True):
            for field, count in enumerate(counts):
                total[field] += count

    def source_stats(self) -> dict[str, dict[str, int]]:
        """What each source contributed: samples, requests and bytes, cache hits.

        ``samples``: of the current epoch's consumed positions, over all ranks together
        (computed from the order: exact, whatever was read ahead). ``requests`` and
        ``bytes``: what this rank's readers (workers, and this process for a head start)
        have read from each source since this loader was made, opens included, read ahead
        included. With a node-local byte cache (``cache_dir=``), ``cache_hits`` and
        ``cache_misses`` count those readers' requests it served whole or not, and
        ``cache_bytes`` the bytes it served (not in ``bytes``); all zero without one. A
        single source is reported under the name ``"source"``.
        """
        source = self.dataset.source
        position = self.dataset.position
        samples = source.source_counts(position.epoch, 0, position.consumed_samples)
        io = self._io_by_source or [[0] * len(IO_FIELDS) for _ in samples]
        return {
            name: {"samples": count, **dict(zip(IO_FIELDS, counts, strict=True))}
            for (name, count), counts in zip(samples.items(), io, strict=True)
        }

    def stall_stats(self) -> dict[str, float | int]:
        """How long the training loop waited for its batches (time inside ``next()`` of this
        loader's iterators), cumulative since the loader was made or :meth:`reset_stalls`.

        ``count``: batches handed out; ``wait_seconds``: their total wait; ``wall_seconds``:
        from the first ``next()`` to the last batch; ``wait_fraction``: the share of that
        wall time spent waiting (near 0: data keeps up; near 1: the step waits on data);
        ``p50``, ``p90``, ``p99``, ``max``: single waits in seconds (percentiles of up to
        4096 waits, a uniform sample beyond). The first wait includes the workers' start.
        """
        return self._stalls.stats()

    def reset_stalls(self) -> None:
        """Start :meth:`stall_stats` afresh (e.g. at each epoch, or after warm-up)."""
        self._stalls.reset()

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
        position = self.dataset.position
        source.set_weights(weights, epoch=position.epoch, position=position.consumed_samples)
        self._order_version += 1
        self._iterator = None  # workers (persistent ones too) hold the old order

    def _advance(self) -> None:
        dataset = self.dataset
        dataset.position = dataset.position.advanced(dataset.options.global_batch_size)

    def __iter__(self) -> StepIterator:  # type: ignore[override]
        self._generation += 1
        dataset = self.dataset
        dataset.bind_ranks()  # rank and world size as the process group says now
        if dataset.phased:
            # the phase played from here (a new one if the setting changed since the state)
            position = dataset.position
            phases = dataset.phases_for(position, max(1, self.num_workers))
            if phases != position.phases:
                dataset.seek(LoaderPosition(position.epoch, position.consumed_samples, phases))
        return StepIterator(self._steps(), self._generation)

    def _steps(self) -> LoaderSteps:
        """What this loader's step iterators may see and do (:class:`LoaderSteps`)."""

        def drop_workers() -> None:
            self._iterator = None  # workers hold the old order: start new ones

        return LoaderSteps(
            dataset=self.dataset,
            batches_per_epoch=self.__len__,
            generation=lambda: self._generation,
            order_version=lambda: self._order_version,
            head_start=self._head_start(),
            start_workers=self._start_workers,
            drop_workers=drop_workers,
            advance=self._advance,
            end_epoch=self._end_epoch,
            count_io=self._count_io,
            stalls=self._stalls,
        )

    def _start_workers(self, start: LoaderPosition) -> Iterator[Any]:
        """The DataLoader's iterator from ``start`` on."""
        if self.num_workers > 0 and self.worker_init_fn.main_pid != os.getpid():
            # built in another process (before Lightning's ddp_spawn / ddp_fork made this
            # rank): the workers watch the process that starts them
            self.worker_init_fn = WorkerStart(os.getpid(), self.user_worker_init)
        self.dataset.start_workers_at(start)
        self.dataset.iterated_by_loader(True)
        try:
            return super().__iter__()
        finally:
            self.dataset.start_workers_at(None)
            self.dataset.iterated_by_loader(False)

    def _head_start(self) -> bool:
        """Whether the first stretch is read in this process (see :class:`StepIterator`).

        Worker start-up (fork, imports, torchdata's handshake) takes 20-40 ms; a local
        stretch is read here in about a millisecond. Only when workers are to be started:
        persistent workers already running read the next epoch at once. Not with pinned
        memory (the DataLoader pins what workers send) or when switched off, nor with a
        ``worker_init_fn`` (it runs in a worker before that worker reads anything; batches
        read here would skip it).
        """
        return (
            self.head_start
            and self.user_worker_init is None
            and self.num_workers > 0
            and not self.pin_memory
            and not (self._workers_running())
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
        if self.dataset.phased and position.phases is None and position.consumed_samples:
            raise StateError(
                "the state has no phases but this loader is block-shuffled: it was saved "
                "under another order"
            )
        self._move(position)


_MISSING = object()


@dataclass(frozen=True)
class LoaderSteps:
    """What a :class:`StepIterator` needs of its loader, and all it may change there."""

    dataset: BatchIterableDataset
    #: ``len(loader)``: batches this rank yields in a whole epoch (counted when asked).
    batches_per_epoch: Callable[[], int]
    #: The loader's iteration count now (a later ``iter()``, ``set_epoch()`` or
    #: ``load_state_dict()`` supersedes an iterator).
    generation: Callable[[], int]
    #: The order's version now (raised by ``set_weights``: read-ahead under the old order
    #: is dropped).
    order_version: Callable[[], int]
    #: Whether the first stretch is read in this process (``StatefulDataLoader.head_start``).
    head_start: bool
    #: The DataLoader's iterator (workers and all) from a position on.
    start_workers: Callable[[LoaderPosition], Iterator[Any]]
    #: Forget the DataLoader's iterator, so the next start makes fresh workers.
    drop_workers: Callable[[], None]
    #: One global batch handed out: advance the position.
    advance: Callable[[], None]
    #: The epoch ended: the position moves to the next epoch's start.
    end_epoch: Callable[[], None]
    #: Add a batch's per-source requests and bytes to the loader's totals.
    count_io: Callable[[list[tuple[int, ...]] | None], None]
    #: Where each ``next()``'s wait is recorded (``StatefulDataLoader.stall_stats``).
    stalls: StallClock


class StepIterator(Iterator[Any]):
    """One ``for batch in loader`` loop: batches in step order, the position advanced."""

    def __init__(self, loader: LoaderSteps, generation: int) -> None:
        self._loader = loader
        self._generation = generation
        self._start: LoaderPosition = loader.dataset.position
        self._inner: Iterator[Any] | None = None
        self._head: Iterator[tuple[int, Any, Any]] | None = None
        self._step_offset = 0
        self._finished = False
        self._next_step = 0
        self._early: dict[int, Any] = {}
        self._bundle: deque[tuple[int, Any, Any]] = deque()  # the rest of a worker's message
        self._order_version = loader.order_version()
        if loader.head_start:
            self._head = loader.dataset.head_stretch(self._start)

    def __iter__(self) -> StepIterator:
        return self

    def __len__(self) -> int:
        return self._loader.batches_per_epoch()

    def __next__(self) -> Any:
        asked = time.perf_counter()
        batch = self._next_batch()  # StopIteration passes: the end of an epoch is no batch
        self._loader.stalls.record(asked, time.perf_counter())
        return batch

    def _next_batch(self) -> Any:
        if self._finished:
            raise StopIteration
        loader = self._loader
        if loader.generation() != self._generation:
            raise StateError(
                "this loader iterator was superseded by a later iter(), set_epoch() or "
                "load_state_dict() on its StatefulDataLoader; continuing it would lose the "
                "position"
            )
        if self._order_version != loader.order_version():
            self._restart()
        batch = self._early.pop(self._next_step, _MISSING)
        if batch is _MISSING and self._head is not None and self._next_step == 0:
            step, batch, io = next(self._head, (0, _MISSING, None))
            assert step == 0, f"the head stretch started at step {step}"
            loader.count_io(io)
        while batch is _MISSING:
            workers = self._workers()
            batch = self._early.pop(self._next_step, _MISSING)  # the head stretch's rest
            if batch is not _MISSING:
                break
            try:
                step, received, io = self._next_tagged(workers)
            except StopIteration:
                self._finished = True
                if self._early:
                    raise StateError(
                        f"the workers ended the epoch without step {self._next_step} but "
                        f"with steps {sorted(self._early)}; a batch was lost"
                    ) from None
                loader.end_epoch()
                raise
            loader.count_io(io)
            step += self._step_offset
            if step == self._next_step:
                batch = received
            else:
                self._early[step] = received
        self._next_step += 1
        loader.advance()
        return batch

    def _next_tagged(self, workers: Iterator[Any]) -> tuple[int, Any, Any]:
        """The next tagged batch out of the workers, whose messages are bundles of them
        (:mod:`rangestream.loader.transport`)."""
        if self._bundle:
            return self._bundle.popleft()
        received = next(workers)
        if type(received) is not Bundle:  # read in this process (no workers)
            return received  # type: ignore[no-any-return]
        self._bundle.extend(received)
        return self._bundle.popleft()

    def _restart(self) -> None:
        """The order changed (new mixture weights): drop what was read ahead under the old
        order and continue from the loader's position with fresh workers."""
        self._order_version = self._loader.order_version()
        self._inner = None
        self._head = None
        self._early.clear()
        self._bundle.clear()
        self._start = self._loader.dataset.position
        self._next_step = 0
        self._step_offset = 0
        self._loader.drop_workers()

    def _workers(self) -> Iterator[Any]:
        """The DataLoader's own iterator, started (workers and all) on first use."""
        if self._inner is None:
            start = self._start
            if self._head is not None:
                # the rest of the head stretch, then its reader closes: nothing is open at fork
                for step, batch, io in self._head:
                    self._early[step] = batch
                    self._loader.count_io(io)
                self._head = None
                self._step_offset = self._next_step + len(self._early)
                start = start.advanced(self._loader.dataset.options.global_batch_size,
                                       self._step_offset)  # fmt: skip
            self._inner = self._loader.start_workers(start)
        return self._inner
