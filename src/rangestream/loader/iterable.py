"""The loader's iterable dataset: whole batches built inside DataLoader workers.

Why whole batches: a worker that assembles and collates a full batch hands the DataLoader one
object per step, so the DataLoader's worker round robin *is* the batch order and the position
is simply "steps taken" (see :mod:`rangestream.loader.orders.sequence_plan`). Use
:class:`BatchIterableDataset` with ``batch_size=None`` in a plain
``torch.utils.data.DataLoader``, or through :class:`rangestream.loader.StatefulDataLoader`,
which also resumes across worker counts.

What is read comes from a :class:`~rangestream.loader.sources.protocol.SampleSource`; how batches
are cut, from :class:`~rangestream.loader.options.BatchOptions`. Nothing that does I/O is made
before the process that iterates enters the source's reader (after any fork), so the
``fork``, ``spawn`` and ``forkserver`` start methods all work. The source's reading
strategy is chosen once (:mod:`rangestream.loader.reading.strategies`); each iteration hands
it an explicit :class:`~rangestream.loader.reading.batches.ReadSpec` (the source, the batch
shape, the prefetch, how to open, how to emit) and runs it with the sync reader on local
disk or on the process's I/O loop otherwise (:mod:`rangestream.loader.reading.batches`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.fetch import _BaseDatasetFetcher

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.options import BatchOptions
from rangestream.loader.orders.phases import EpochPosition
from rangestream.loader.orders.sequence_plan import EpochPlan
from rangestream.loader.position import KeptReader, LoaderPosition, SharedPosition
from rangestream.loader.reading.batches import (
    ReadSpec,
    Start,
    check_same_count,
    read_sync,
)
from rangestream.loader.reading.epoch_ahead import EpochAhead
from rangestream.loader.reading.strategies import strategy_for
from rangestream.loader.reading.tasks import IterationTasks
from rangestream.loader.sources.protocol import SampleSource
from rangestream.loader.transport import SourceIO, bundled

__all__ = ["BatchIterableDataset", "Start"]

_MAX_SHARED_PHASES = 64
"""Phases a shared position carries to persistent workers (each resume with a new setting
adds one; a run that changes its setting more often within one epoch is refused)."""


def _batching_fetcher(frame: Any) -> bool:
    """Whether ``frame`` (the caller of ``__iter__``) is a DataLoader's fetcher that batches
    what the dataset yields (``batch_size`` set): torch's and torchdata's loaders make
    their fetcher call ``iter(dataset)`` in the process that reads, worker or main."""
    fetcher = frame.f_locals.get("self") if frame is not None else None
    return isinstance(fetcher, _BaseDatasetFetcher) and bool(fetcher.auto_collation)


def _worker_identity() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class BatchIterableDataset(IterableDataset[Any]):
    """Batches of a sample source, split across ranks and workers, resumable exactly.

    Parameters
    ----------
    source : SampleSource
        What is read, in which order: :class:`~rangestream.loader.sources.indexed.IndexedSource`
        (windows, documents), :class:`~rangestream.loader.sources.temporal.TemporalWindowSource`,
        :class:`~rangestream.loader.mixing.mixed_source.MixedSource`, ...
    options : BatchOptions, optional
        Batch size, rank and world size, end-of-epoch policy, prefetch, collate function.

    Notes
    -----
    The dataset owns the loader position (:attr:`position`): the epoch and the samples of
    it consumed by all ranks together. ``state_dict()`` follows torchdata's ``Stateful``
    protocol and describes *this* process's progress: inside a DataLoader worker it records
    that worker's batch count, which torchdata's ``StatefulDataLoader`` hands back to the
    same worker (so it resumes with an unchanged ``num_workers``). A state taken outside
    workers folds into ``consumed_samples`` on load and so resumes with any setting.
    :class:`rangestream.loader.StatefulDataLoader` advances :attr:`position` itself as it
    hands out batches and does not use the per-worker state.
    """

    def __init__(self, source: SampleSource, options: BatchOptions | None = None) -> None:
        super().__init__()
        if not isinstance(source, SampleSource):
            raise LoaderConfigError(
                f"BatchIterableDataset needs a SampleSource, got {type(source).__name__}"
            )
        self.source = source
        #: How its epochs are planned and read, chosen once from the source.
        self.strategy = strategy_for(source)
        #: The options as given: rank and world size may be ``None`` until an iteration
        #: starts (:attr:`options` resolves them).
        self.given_options = BatchOptions() if options is None else options
        #: ``given_options`` resolved when this process last started an iteration.
        self._bound: BatchOptions | None = None
        self.position = LoaderPosition()
        self.worker_batches = 0
        self._resume: tuple[int, int, int] | None = None
        self._known_num_samples: int | None = None
        #: What data the positions index (commit, window geometry, sample count): part
        #: of every state, asked once in the process that builds the loader.
        self._described: dict[str, Any] | None = None
        self._tagged = False
        #: Set while a rangestream loader starts its iteration (its workers get copies
        #: with it set): only then are batches tagged and bundled. Any other consumer (a
        #: plain DataLoader over ``loader.dataset``, as accelerate builds to skip batches)
        #: gets plain batches.
        self._loader_iterating = False
        self._shared: SharedPosition | None = None
        #: Readers a worker keeps across epochs (with their contexts: collecting a context
        #: would close its reader): the sync one for local sources, the async one else.
        self._kept_sync: tuple[Any, Any] | None = None
        self._kept_async: tuple[Any, Any] | None = None
        #: A persistent worker's next epoch, started when its current one ends.
        self._epoch_ahead = EpochAhead()
        #: DataLoader workers per rank, as the loader that owns this dataset starts them:
        #: the block shuffle sizes its buffers by the readers of an epoch.
        self.workers_per_rank = 1
        self._iteration_start: LoaderPosition | None = None
        self._io = SourceIO()

    def __repr__(self) -> str:
        return f"BatchIterableDataset({self.source!r}, {self.given_options!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kept_sync"] = state["_kept_async"] = None  # readers are per process
        state["_epoch_ahead"] = EpochAhead()
        state["_io"] = SourceIO()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # A spawned DataLoader worker has no process group: it gets this rank's values
            # (also under a DataLoader other than rangestream's, which binds nothing).
            state["_bound"] = self.given_options.resolve()
        else:
            # Ranks bound without a process group (0 of 1) are this process's: a copy sent
            # to a rank (Lightning's ddp_spawn) resolves its own.
            state["_bound"] = None
        return state

    # -- settings ------------------------------------------------------------------------

    @property
    def options(self) -> BatchOptions:
        """Batch size, rank and world size, end-of-epoch policy, prefetch, collate function,
        with rank and world size resolved: as bound when this process last started an
        iteration (:meth:`bind_ranks`), else from ``torch.distributed`` now.

        Raises
        ------
        LoaderConfigError
            Rank or world size are not given, no process group exists and the launcher's
            environment says this is one of several ranks.
        """
        if self._bound is not None:
            return self._bound
        return self.given_options.resolve()

    def bind_ranks(self) -> BatchOptions:
        """Resolve rank and world size for the iteration starting now (in the process that
        starts it: DataLoader workers get the values with their copy of the dataset)."""
        self._bound = self.given_options.resolve()
        return self._bound

    @property
    def phased(self) -> bool:
        """Whether positions carry the epoch's phases (the block shuffles: planned by
        regions of readers, so a resume with another setting starts a new phase)."""
        return self.strategy.phased

    @property
    def prefetch(self) -> int:
        """Samples in flight per worker: as given, else the strategy's default (two
        stretches of sequential windows, at least ``DEFAULT_PREFETCH``, or one buffer of
        the block shuffle)."""
        if self.options.prefetch is not None:
            return self.options.prefetch
        return self.strategy.default_prefetch(self.source, self.options.batch_size)

    @property
    def tagged(self) -> bool:
        return self._tagged

    def tag_steps(self, enabled: bool = True) -> None:
        """Yield ``(step, batch)`` pairs instead of batches.

        The step is the batch's place in this rank's remaining epoch. A consumer that puts
        tagged batches back in step order lets each worker build stretches of consecutive
        steps and read adjacent samples with one request; :class:`StatefulDataLoader` does.
        """
        self._tagged = bool(enabled)

    def emit(self, step: int, batch: Any) -> Any:
        """What the worker hands the DataLoader: the batch, or, tagged, ``(step, batch,
        io)`` where ``io`` lists the requests and bytes each source's reader made since the
        worker's previous batch (the loader sums them per source)."""
        if not self._tagged:
            return batch
        return step, batch, self._io.delta()

    def note_reader(self, reader: Any) -> None:
        """The reader this process reads with now (its counters feed :meth:`emit`)."""
        self._io.note(reader, self.source.source_readers(reader))

    def state_identity(self) -> dict[str, Any]:
        """Settings that define the epoch's order (the source's identity, seed included).

        A position only means something under the same order: resuming a state saved with
        another shuffle or window length would skip the wrong samples, so loading such a
        state fails instead.
        """
        if get_worker_info() is None:
            readers = self.options.world_size * self.workers_per_rank  # type: ignore[operator]
            self.strategy.choose_parameters(self.source, self.num_samples, readers)
            if self._described is None:
                self._described = self.source.describe_data()
        return {**self.source.identity(), **(self._described or {})}

    def preload(self) -> None:
        """Import the storage's client code now, before DataLoader workers fork."""
        self.source.preload()

    def share_position(self) -> None:
        """Carry the position to persistent workers through shared memory (see
        :class:`StatefulDataLoader`); call before the workers start."""
        if self._shared is None:
            self._shared = SharedPosition()
            self._shared.write(self.position)

    # -- position ------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def consumed_samples(self) -> int:
        return self.position.consumed_samples

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` from its start on the next iteration; the current epoch keeps its
        position (so ``for epoch in range(start, end): set_epoch(epoch)`` continues a
        resumed epoch)."""
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise LoaderConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self.position.epoch:
            self.seek(LoaderPosition(int(epoch)))

    def seek(self, position: LoaderPosition) -> None:
        """Start the next iteration at ``position``."""
        self.position = position
        self._resume = None
        self.worker_batches = 0
        if self._shared is not None:
            self._shared.write(position)

    def start_workers_at(self, start: LoaderPosition | None) -> None:
        """Let the iterations started next (workers) begin at ``start`` rather than at
        :attr:`position` (which stays the loader's: a head start reads ahead of it);
        ``None`` returns to :attr:`position`."""
        self._iteration_start = start
        if self._shared is not None and start is not None:
            self._shared.write(start)

    def num_samples(self) -> int:
        """Samples per epoch, counted once in the calling process and then remembered."""
        if self._known_num_samples is None:
            self._known_num_samples = int(self.source.count())
        return self._known_num_samples

    def check_num_samples(self, found: int) -> int:
        """``found`` (a reader's count), if it agrees with what the caller counted."""
        return check_same_count(self._known_num_samples, found, repr(self.source))

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (not only what remains of it)."""
        options = self.options
        full = EpochPlan(
            num_samples=self.num_samples(),
            batch_size=options.batch_size,
            world_size=options.world_size,  # type: ignore[arg-type]
            rank=options.rank,  # type: ignore[arg-type]
            drop_last=options.drop_last,
        )
        return full.num_steps

    def phases_for(self, position: LoaderPosition, num_workers: int) -> EpochPosition:
        """The block shuffle's phases to continue ``position`` with this setting."""
        options = self.options
        setting = {
            "world_size": options.world_size,
            "batch_size": options.batch_size,
            "num_workers": num_workers,
            "drop_last": options.drop_last,
        }
        if position.phases is None:
            if position.consumed_samples:
                raise StateError(
                    f"a block-shuffled epoch resumed at consumed_samples="
                    f"{position.consumed_samples} needs the phases of its state"
                )
            return EpochPosition.start(**setting)  # type: ignore[arg-type]
        return position.phases.resume(**setting)  # type: ignore[arg-type]

    # -- Stateful protocol (per process; see the class notes) ----------------------------

    def state_dict(self) -> dict[str, Any]:
        """Position of this process in the epoch, as plain data."""
        if self._resume is not None:
            worker_id, num_workers, worker_batches = self._resume
        else:
            worker_id, num_workers = _worker_identity()
            worker_batches = self.worker_batches
        options = self.options
        return {
            **self.state_identity(),
            **self.order_state(),
            **self.position.state_dict(),
            "batch_size": options.batch_size,
            "world_size": options.world_size,
            "rank": options.rank,
            "drop_last": options.drop_last,
            "worker_id": worker_id,
            "num_workers": num_workers,
            "worker_batches": worker_batches,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next iteration continues where it stopped."""
        state = dict(state_dict)
        self.adopt_identity(state)
        try:
            position = LoaderPosition.from_state_dict(state)
            num_workers = int(state["num_workers"])
            worker_id = int(state["worker_id"])
            worker_batches = int(state["worker_batches"])
            saved_global_batch = int(state["batch_size"]) * int(state["world_size"])
        except (KeyError, TypeError, ValueError) as error:
            raise StateError(f"malformed {type(self).__name__} state {state!r}: {error}") from error
        self.load_order_state(state, position)
        if num_workers == 1:
            # One process built every step, so its count is global progress.
            if position.phases is not None:
                position = LoaderPosition(
                    position.epoch,
                    position.consumed_samples,
                    self.phases_for(position, 1),
                ).advanced(saved_global_batch, worker_batches)
                self.seek(position)
                return
            self.seek(
                LoaderPosition(
                    position.epoch, position.consumed_samples + worker_batches * saved_global_batch
                )
            )
            return
        for key in ("batch_size", "world_size", "rank", "drop_last"):
            if state.get(key) != getattr(self.options, key):
                raise StateError(
                    f"a per-worker state (num_workers={num_workers}) resumes only the same "
                    f"split: state has {key}={state.get(key)!r}, dataset has "
                    f"{getattr(self.options, key)!r}; use rangestream.StatefulDataLoader to "
                    "change it"
                )
        self.seek(position)
        self._resume = (worker_id, num_workers, worker_batches)

    def order_state(self) -> dict[str, Any]:
        """The order's own state beside its identity (a mixture's weights and curriculum
        phases), under ``"mixture"``; empty for sources without one."""
        order_state = self.source.order_state()
        return {} if order_state is None else {"mixture": order_state}

    def load_order_state(self, state: dict[str, Any], position: LoaderPosition) -> None:
        """Continue the order state of a saved run at ``position`` (see
        :meth:`order_state`)."""
        self.source.load_order_state(
            state.get("mixture"), epoch=position.epoch, position=position.consumed_samples
        )

    def adopt_identity(self, state: dict[str, Any]) -> None:
        """Check that ``state`` was saved under this order; adopt the block shuffle's
        parameters (they were chosen when the order was first made, and define it)."""
        self.source.adopt_order_parameters(state)
        expected = self.state_identity()
        differences = [
            f"{key}={state.get(key)!r} but this loader has {key}={value!r}"
            for key, value in expected.items()
            if state.get(key) != value
        ]
        if differences:
            raise StateError(
                f"cannot resume: the state has {'; and '.join(differences)}; it was saved "
                "over other data or another order, and the remaining samples would differ"
            )

    # -- iteration -----------------------------------------------------------------------

    def start_for(self, worker_id: int, num_workers: int, done: int = 0) -> Start:
        """Where this worker's next iteration starts."""
        if self._shared is not None:
            position = self._shared.read()
        elif self._iteration_start is not None:
            position = self._iteration_start
        else:
            position = self.position
        phases = self.phases_for(position, num_workers) if self.phased else None
        return Start(
            position.epoch, position.consumed_samples, phases, worker_id, num_workers, done
        )

    def iterated_by_loader(self, iterating: bool) -> None:
        """Mark the iterations started from now on as the rangestream loader's own."""
        self._loader_iterating = bool(iterating)

    def __iter__(self) -> Iterator[Any]:
        if _batching_fetcher(sys._getframe(1)):
            # it would stack batch_size of our batches into one: shapes off by a dimension,
            # silently (torch.utils.data.DataLoader(dataset, batch_size=8), or a Trainer
            # given the dataset instead of the loader); refuse before anything is read
            raise LoaderConfigError(
                f"this rangestream dataset yields whole batches (batch_size="
                f"{self.options.batch_size}, collated in the workers), and the DataLoader "
                "iterating it batches them again (its batch_size is set). Give that "
                "DataLoader batch_size=None, or iterate the rangestream StatefulDataLoader "
                "itself (with transformers: rangestream.integrations.transformers.Trainer("
                "train_loader=loader))"
            )
        if get_worker_info() is None:
            self.bind_ranks()  # a worker has its loader's values (or resolves them live)
        tagged = self._tagged and self._loader_iterating
        batches = self._batches(tagged)
        if tagged and get_worker_info() is not None:
            return bundled(batches)  # several batches per message (loader.transport)
        return batches

    def _batches(self, tagged: bool) -> Iterator[Any]:
        worker_id, num_workers = _worker_identity()
        done = 0
        if self._resume is not None:
            saved_worker, saved_workers, done = self._resume
            if (saved_worker, saved_workers) != (worker_id, num_workers):
                raise StateError(
                    f"state saved by worker {saved_worker} of {saved_workers} cannot resume "
                    f"worker {worker_id} of {num_workers}"
                )
            self._resume = None
        self.worker_batches = done
        # The position is fixed now, not when the first batch is asked for.
        start = self.start_for(worker_id, num_workers, done)
        spec = self._spec(self._built if tagged else self._plain, tagged)
        context = self._sync_context()
        if context is not None:
            return read_sync(spec, self.strategy, context, start)
        # a persistent worker starts its next epoch as this one ends (``epoch_ahead``)
        kept = self._shared is not None and get_worker_info() is not None
        following = self._following if kept else None
        return self._epoch_ahead.iterator(spec, self.strategy, start, following)

    def _following(self, start: Start) -> Start:
        """Where the epoch after one started at ``start`` starts, if nothing moves the
        position in between: its beginning, with the same setting and worker."""
        position = LoaderPosition(start.epoch + 1)
        phases = self.phases_for(position, start.num_workers) if self.phased else None
        return Start(position.epoch, 0, phases, start.worker_id, start.num_workers)

    def _spec(self, emit: Callable[[int, Any], Any], tagged: bool | None = None) -> ReadSpec:
        """What an iteration reads, and how it hands batches out (through ``emit``)."""
        options = self.options
        return ReadSpec(
            source=self.source,
            batch_size=options.batch_size,
            world_size=options.world_size,  # type: ignore[arg-type]
            rank=options.rank,  # type: ignore[arg-type]
            drop_last=options.drop_last,
            collate=options.collate_fn,  # type: ignore[arg-type]
            prefetch=options.prefetch,
            tagged=self._tagged if tagged is None else tagged,
            known_samples=self._known_num_samples,
            open_async=self.async_reader,
            emit=emit,
            note_reader=self.note_reader,
        )

    def _plain(self, step: int, batch: Any) -> Any:
        """A batch for a consumer other than the loader: untagged, counted."""
        self.worker_batches += 1
        return batch

    def _built(self, step: int, batch: Any) -> Any:
        """:meth:`emit` of a batch this worker built (counted for its per-worker state)."""
        self.worker_batches += 1
        return self.emit(step, batch)

    def _sync_context(self) -> Any:
        """The sync reader's context for local sources (kept open in a worker, so a
        persistent worker's next epoch opens nothing); ``None`` for remote sources."""
        if self._kept_sync is not None:
            return KeptReader(self._kept_sync[1])
        context = self.source.open_sync()
        if context is None or get_worker_info() is None:
            return context
        self._kept_sync = (context, context.__enter__())  # closed when the worker exits
        return KeptReader(self._kept_sync[1])

    async def async_reader(self, tasks: IterationTasks) -> Any:
        """The source's async reader, entered on the I/O loop: for this iteration in the
        main process, kept for the next epochs in a worker."""
        if self._kept_async is None:
            context = self.source.open_async()
            if get_worker_info() is None:
                reader = await tasks.enter(context)
                self.note_reader(reader)
                return reader
            self._kept_async = (context, await context.__aenter__())
        self.note_reader(self._kept_async[1])
        return self._kept_async[1]

    def head_stretch(self, position: LoaderPosition) -> Iterator[Any] | None:
        """The first stretch of the remaining epoch read here, as :meth:`emit` tags it.

        For a loader whose workers take tens of milliseconds to start: on local disk the
        calling process reads the first batch itself (the plan's lead-in step), and the
        first whole stretch when asked for the second, while the workers start after it.
        ``None`` for remote sources and the block shuffle (its regions depend on the
        workers). The reader closes when the iterator ends or is closed.
        """
        start = Start(position.epoch, position.consumed_samples, None, 0, 1)
        return self.strategy.head_stretch(self._spec(self.emit), self.source.open_sync, start)
