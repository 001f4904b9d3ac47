"""Iterable datasets that build whole batches inside DataLoader workers.

Why whole batches: a worker that assembles and collates a full batch hands the DataLoader one
object per step, so the DataLoader's worker round robin *is* the batch order and the position
of a run is simply "steps taken" (see :mod:`rangestream.loader.plan`). Use these datasets
with ``batch_size=None`` in a plain ``torch.utils.data.DataLoader``, or through
:class:`rangestream.loader.StatefulDataLoader`, which also resumes across worker counts.

Inside each process that iterates (a DataLoader worker, or the main process when
``num_workers=0``) the dataset starts its own event loop on a daemon thread and opens its
async reader on that loop, after any fork. Nothing that does I/O is created in the parent, so
the ``fork``, ``spawn`` and ``forkserver`` start methods all work. A worker builds runs of
consecutive steps when the consumer puts tagged batches back in order (:meth:`tag_steps`)
and reads each run with one ``read_many`` call, so its ranges are coalesced: in sequential
order a run of adjacent windows, up to :data:`RUN_READ_BYTES`, is one range request. Reads
are issued in order, at most ``prefetch`` samples per worker ahead of the batch being
assembled, and results are taken in order, so memory is bounded however slow individual
reads are. On local disk there is no loop: the worker calls the sync reader run by run,
which is faster than any read-ahead of page-cache copies.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import os
import sys
import threading
import weakref
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

import numpy as np
import torch.distributed
from torch.utils.data import IterableDataset, get_worker_info

from rangestream.errors import LoaderConfigError, StateError
from rangestream.loader.collate import stack_collate
from rangestream.loader.permutation import Permutation
from rangestream.loader.plan import EpochPlan

__all__ = [
    "DEFAULT_PREFETCH",
    "BatchIterableDataset",
    "IndexedBatchDataset",
    "IndexedDataset",
    "resolve_distributed",
]

DEFAULT_PREFETCH = 64
"""Samples in flight per worker when samples are read one by one (shuffled windows,
documents, temporal windows); it bounds memory: at most ``prefetch`` samples requested and
not yet taken, plus the run being handed over. Sequential windows default to two runs
instead (see :data:`RUN_READ_BYTES`). Shuffled windows are single reads, which the async
reader bounds further (``max_concurrency``)."""

RUN_READ_BYTES = 4 << 20
"""Bytes a worker aims to read per range request in sequential order, by building runs of
consecutive steps (at most :data:`MAX_RUN_STEPS`, at most half the prefetch budget). An
object store charges per request far more than per byte: SeaweedFS spends 3.3 ms of CPU on a
64 KiB range GET and 4.4 ms on a 1 MiB one, S3 bills the GET and not the bytes. Measured
with 8-KiB windows in batches of 8, 2 workers, over S3 behind 20 ms of latency, with two
runs in flight per worker: 1 MiB runs 9.7-10.4k windows/s, 2 MiB 12.0k, 4 MiB
10.4-13.8k (a noisy box; 4 MiB was ahead of 1 MiB in every pairing)."""

MAX_RUN_STEPS = 64
"""Bound on a run: the loader holds up to ``(num_workers - 1) * MAX_RUN_STEPS`` batches to
put runs from several workers back in step order."""

_HEAD_RUN_STEPS = 16
"""Bound on the first run read in the training process (:meth:`head_run`): its batches
only have to last until the workers' first reads arrive, a few milliseconds locally."""

_TARGET_BLOCK_SAMPLES = 4096
"""Sequence indices mapped per vectorised permutation call: large enough to amortise numpy
overhead, small enough that a worker's memory does not grow with the epoch."""

T = TypeVar("T")
Collate = Callable[[list[Any]], Any]


class AsyncReader(Protocol):
    """What the loader needs from ``dataset.async_reader()`` once entered."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class IndexedDataset(Protocol):
    """A picklable dataset of ``len(reader)`` samples: ``StreamDataset``, ``DocumentDataset``.

    ``async_reader()`` must open nothing until entered; it is entered once per iteration in
    the process that iterates. ``sync_reader()`` serves ``len()`` in the calling process (if
    the dataset has no ``__len__`` of its own) and, when the dataset says ``is_local``, the
    reads themselves (``read_many``), again opened in the process that iterates.
    """

    def async_reader(self) -> AbstractAsyncContextManager[AsyncReader]: ...

    def sync_reader(self) -> contextlib.AbstractContextManager[Any]: ...


def resolve_distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in ``rank`` and ``world_size`` from ``torch.distributed`` when left as ``None``.

    Parameters
    ----------
    rank, world_size : int or None
        Explicit values win; ``None`` takes the initialised process group's value, or
        ``0`` / ``1`` without one.

    Returns
    -------
    tuple of int
        ``(rank, world_size)``, validated.
    """
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if isinstance(world_size, bool) or int(world_size) != world_size or world_size < 1:
        raise LoaderConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(rank, bool) or int(rank) != rank or not 0 <= rank < world_size:
        raise LoaderConfigError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
    return int(rank), int(world_size)


def _worker_identity() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class _EventLoopThread:
    """An event loop on a daemon thread, private to the process that created it.

    A thread (rather than ``run_until_complete`` on the worker's own thread) lets reads
    progress while the worker collates and hands batches to the DataLoader.
    """

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self._thread = threading.Thread(
            target=self._serve, name="rangestream-loader-io", daemon=True
        )
        self._thread.start()
        _live_loops.add(self)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        loop = self._loop
        loop.run_forever()
        # A callback queued before the stop may have started reads after the shutdown's
        # last look; cancel and finish them here, so no read is left half made.
        while pending := asyncio.all_tasks(loop):
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def __enter__(self) -> _EventLoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if os.getpid() != self._pid:
            coroutine.close()
            raise StateError(
                f"loader event loop was created in process {self._pid} and cannot be used in "
                f"process {os.getpid()}; iterate the dataset in the process that reads"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.submit(coroutine).result()

    async def enter_async(self, open_context: Callable[[], AbstractAsyncContextManager[T]]) -> T:
        """Enter an async context (on the loop); it is exited when this object closes."""
        return await self._stack.enter_async_context(open_context())

    def close(self) -> None:
        """Cancel the loop's tasks, exit what was entered, stop the thread (idempotent).

        Never blocks for good: after interpreter finalisation has begun the daemon thread
        cannot run any more (live loops are closed earlier, at exit), a forked copy has no
        thread at all, and a stuck shutdown is abandoned after ``_SHUTDOWN_SECONDS``.
        """
        if self._closed or os.getpid() != self._pid or sys.is_finalizing():
            return
        self._closed = True
        _live_loops.discard(self)
        if threading.current_thread() is self._thread:
            # dropped by the loop's own thread: it cannot wait for itself
            self._loop.call_soon(self._loop.stop)
            return

        async def shutdown() -> None:
            current = asyncio.current_task()
            while tasks := [task for task in asyncio.all_tasks() if task is not current]:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await self._stack.aclose()
            # Finalise async generators as asyncio.run does: the S3 clients shared on this
            # loop close through one of them (rangestream.io.store), before the loop closes.
            await self._loop.shutdown_asyncgens()

        try:
            self.submit(shutdown()).result(timeout=_SHUTDOWN_SECONDS)
        except concurrent.futures.TimeoutError:
            pass  # stop the loop anyway; its tasks die with it
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=_SHUTDOWN_SECONDS)
            if not self._thread.is_alive():
                self._loop.close()


#: Loop threads not closed yet: closed at interpreter exit, while their threads can still
#: run (after finalisation starts, a daemon thread never runs again and waiting would hang).
_live_loops: weakref.WeakSet[_EventLoopThread] = weakref.WeakSet()
#: How long closing waits for the loop to cancel its reads and exit its readers.
_SHUTDOWN_SECONDS = 30.0


@atexit.register
def _close_live_loops() -> None:
    for loop_thread in list(_live_loops):
        with contextlib.suppress(Exception):
            loop_thread.close()


class BatchIterableDataset(IterableDataset[Any]):
    """Base of the loader's iterable datasets: plan, prefetch, epochs and state.

    Subclasses say how many samples an epoch has and how a sequence index becomes a read;
    this class splits the epoch across ranks and workers, keeps reads in flight and tracks
    progress. Parameters are documented on the subclasses.

    Notes
    -----
    ``state_dict()`` follows torchdata's ``Stateful`` protocol and describes *this* process's
    progress: inside a DataLoader worker it records that worker's batch count, which
    torchdata's ``StatefulDataLoader`` stores per worker and hands back to the same worker
    (so it resumes exactly with an unchanged ``num_workers``). A state taken outside workers
    (``num_workers=0``) folds into the global ``consumed_samples`` on load and so resumes
    with any configuration. :class:`rangestream.loader.StatefulDataLoader` does not use this
    per-worker state at all; it counts batches in the main process.
    """

    def __init__(
        self,
        *,
        batch_size: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
        prefetch: int | None,
        collate_fn: Collate | None,
    ) -> None:
        super().__init__()
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise LoaderConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if prefetch is not None and (
            isinstance(prefetch, bool) or int(prefetch) != prefetch or prefetch < 1
        ):
            raise LoaderConfigError(
                f"prefetch must be a positive integer or None, got {prefetch!r}"
            )
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.rank, self.world_size = resolve_distributed(rank, world_size)
        self.drop_last = bool(drop_last)
        self._prefetch = None if prefetch is None else int(prefetch)
        self.collate_fn: Collate = stack_collate if collate_fn is None else collate_fn
        self._epoch = 0
        self._consumed_samples = 0
        self._worker_batches = 0
        self._resume: tuple[int, int, int] | None = None
        self._known_num_samples: int | None = None
        self._tag_steps = False

    # -- what subclasses provide ---------------------------------------------------------

    @abstractmethod
    def _open(self) -> AbstractAsyncContextManager[Any]:
        """Context that yields the per-process reader; entered on the loader's event loop."""

    @abstractmethod
    def _num_samples(self, source: Any) -> int:
        """Samples per epoch, computed inside the iterating process from its reader."""

    @abstractmethod
    def _count_samples(self) -> int:
        """Samples per epoch, computed in the calling process (for ``len()`` only)."""

    @abstractmethod
    def _requests(self, source: Any, indices: np.ndarray, epoch: int) -> Sequence[Any]:
        """Read requests for a block of epoch-sequence indices, in order."""

    @abstractmethod
    async def _read(self, source: Any, request: Any) -> Any:
        """Read one sample."""

    async def _read_many(self, source: Any, requests: list[Any]) -> list[Any]:
        """Read consecutive samples of one batch; override to read them in one round."""
        return list(await asyncio.gather(*(self._read(source, request) for request in requests)))

    def _storage(self) -> Any:
        """The storage read from, if this dataset knows it (for :meth:`preload`)."""
        return None

    def _sample_span_bytes(self) -> int | None:
        """Storage bytes between consecutive samples of the epoch order, if they are
        adjacent there and of one size (sequential windows); ``None`` otherwise."""
        return None

    @property
    def prefetch(self) -> int:
        """Samples in flight per worker: as given, or by default two whole runs of
        sequential windows (:data:`RUN_READ_BYTES`), else :data:`DEFAULT_PREFETCH`."""
        if self._prefetch is not None:
            return self._prefetch
        return max(DEFAULT_PREFETCH, 2 * self._span_run_steps() * self.batch_size)

    def _span_run_steps(self) -> int:
        """Steps per run that make a read of about :data:`RUN_READ_BYTES`; 1 if unknown."""
        span = self._sample_span_bytes()
        if not span:
            return 1
        return max(1, min(MAX_RUN_STEPS, RUN_READ_BYTES // (span * self.batch_size)))

    def tag_steps(self, enabled: bool = True) -> None:
        """Yield ``(step, batch)`` pairs instead of batches.

        The step is the batch's place in this rank's remaining epoch. A consumer that puts
        tagged batches back in step order lets each worker build runs of consecutive steps
        and read a run's adjacent samples with one request (:data:`RUN_READ_BYTES`);
        :class:`rangestream.loader.StatefulDataLoader` does. Untagged, a worker of a
        multi-worker DataLoader builds single steps, in the DataLoader's round robin.
        """
        self._tag_steps = bool(enabled)

    def preload(self) -> None:
        """Import the storage's client code now, before DataLoader workers fork.

        Forked workers then inherit it instead of each importing it on the way to their
        first batch (about 200 ms of CPU for the S3 client). Spawned workers gain nothing
        and lose nothing.
        """
        preload = getattr(self._storage(), "preload_readers", None)
        if callable(preload):
            preload()

    def _sync_open(self) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
        """A sync reader's context, for sources on local disk; ``None`` reads through a loop.

        Local reads are memory copies out of the page cache: an event loop, a thread
        handoff per read and read-ahead cost more than they hide, so a worker reading local
        files calls the sync reader directly (``pread``), one batch per call.
        """
        return None

    def _read_many_sync(self, source: Any, requests: list[Any]) -> list[Any]:
        """Samples of one batch from the source of :meth:`_sync_open`."""
        raise TypeError(
            f"{type(self).__name__}._sync_open returned a reader but _read_many_sync is not "
            "overridden to read from it"
        )

    @abstractmethod
    def state_identity(self) -> dict[str, Any]:
        """Settings that define the epoch's sample order, saved with every state.

        A position only means something under the same order: resuming a state saved with
        another shuffle setting or window length would skip the wrong samples, so loading
        such a state fails instead.
        """

    # -- epochs and position -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Epoch that the next iteration plays."""
        return self._epoch

    @property
    def consumed_samples(self) -> int:
        """Samples of :attr:`epoch` consumed by all ranks before the next iteration starts."""
        return self._consumed_samples

    @property
    def global_batch_size(self) -> int:
        """Samples one step consumes across all ranks."""
        return self.batch_size * self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` from its start on the next iteration.

        Setting the epoch already current keeps the position, so the usual
        ``for epoch in range(start, end): loader.set_epoch(epoch)`` loop continues a resumed
        epoch instead of restarting it.
        """
        if isinstance(epoch, bool) or int(epoch) != epoch or epoch < 0:
            raise LoaderConfigError(f"epoch must be a non-negative integer, got {epoch!r}")
        if epoch != self._epoch:
            self.seek(int(epoch), 0)

    def seek(self, epoch: int, consumed_samples: int) -> None:
        """Start the next iteration at ``consumed_samples`` of ``epoch``."""
        if epoch < 0 or consumed_samples < 0:
            raise LoaderConfigError(
                f"epoch and consumed_samples must be >= 0, got {epoch} and {consumed_samples}"
            )
        self._epoch = int(epoch)
        self._consumed_samples = int(consumed_samples)
        self._resume = None
        self._worker_batches = 0

    def num_samples(self) -> int:
        """Samples per epoch, counted once in the calling process and then remembered."""
        if self._known_num_samples is None:
            self._known_num_samples = int(self._count_samples())
        return self._known_num_samples

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (not only what remains of it)."""
        full = EpochPlan(
            num_samples=self.num_samples(),
            batch_size=self.batch_size,
            world_size=self.world_size,
            rank=self.rank,
            drop_last=self.drop_last,
        )
        return full.num_steps

    # -- Stateful protocol ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Position of this process in the epoch, as plain data."""
        if self._resume is not None:
            worker_id, num_workers, worker_batches = self._resume
        else:
            worker_id, num_workers = _worker_identity()
            worker_batches = self._worker_batches
        return {
            **self.state_identity(),
            "seed": self.seed,
            "epoch": self._epoch,
            "consumed_samples": self._consumed_samples,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "worker_id": worker_id,
            "num_workers": num_workers,
            "worker_batches": worker_batches,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next iteration continues where it stopped."""
        state = dict(state_dict)
        expected = {**self.state_identity(), "seed": self.seed}
        for key, value in expected.items():
            if state.get(key) != value:
                raise StateError(
                    f"cannot resume {type(self).__name__}: state has {key}={state.get(key)!r}, "
                    f"this dataset has {key}={value!r}"
                )
        try:
            epoch = int(state["epoch"])
            consumed = int(state["consumed_samples"])
            num_workers = int(state["num_workers"])
            worker_id = int(state["worker_id"])
            worker_batches = int(state["worker_batches"])
            saved_global_batch = int(state["batch_size"]) * int(state["world_size"])
        except (KeyError, TypeError, ValueError) as error:
            raise StateError(f"malformed {type(self).__name__} state {state!r}: {error}") from error
        if num_workers == 1:
            # One process built every step, so its count is global progress.
            self.seek(epoch, consumed + worker_batches * saved_global_batch)
            return
        for key in ("batch_size", "world_size", "rank", "drop_last"):
            if state.get(key) != getattr(self, key):
                raise StateError(
                    f"a per-worker state (num_workers={num_workers}) resumes only the same "
                    f"split: state has {key}={state.get(key)!r}, dataset has "
                    f"{getattr(self, key)!r}; use rangestream.StatefulDataLoader to change it"
                )
        self.seek(epoch, consumed)
        self._resume = (worker_id, num_workers, worker_batches)

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
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
        self._worker_batches = done
        # The position is fixed now, not when the first batch is asked for.
        position = (self._epoch, self._consumed_samples, worker_id, num_workers, done)
        open_sync = self._sync_open()
        if open_sync is not None:
            return self._generate_sync(open_sync, position)
        return _PrefetchingIterator(self, position)

    def _generate_sync(
        self,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any]],
        position: tuple[int, int, int, int, int],
    ) -> Iterator[Any]:
        with open_sync() as source:
            for first_step, batches in self._runs(source, *position):
                for step, collated in self._read_batches_sync(source, first_step, batches):
                    self._worker_batches += 1
                    yield self._emit(step, collated)

    def _read_batches_sync(
        self, source: Any, first_step: int, batches: list[list[Any]]
    ) -> Iterator[tuple[int, Any]]:
        """Consecutive batches read with one ``read_many`` call, collated one by one."""
        samples = self._read_many_sync(source, [request for batch in batches for request in batch])
        for offset, batch in enumerate(batches):
            taken, samples = samples[: len(batch)], samples[len(batch) :]
            yield first_step + offset, self.collate_fn(taken)

    def head_run(self, epoch: int, consumed_samples: int) -> Iterator[tuple[int, Any]] | None:
        """The first run of the remaining epoch, read here: ``(step, batch)`` pairs.

        For a loader whose workers take tens of milliseconds to start: on local disk the
        calling process reads the first batch itself in about a millisecond (the plan's
        lead-in step), and the first whole run when asked for the second, while the
        workers start after it.
        ``None`` when the source is remote (an event loop and a session would be made in
        the parent, and the first remote read costs more than it saves). The reader closes
        when the iterator ends or is closed.
        """
        open_sync = self._sync_open()
        if open_sync is None:
            return None
        return self._head_run(open_sync, (int(epoch), int(consumed_samples), 0, 1, 0))

    def _head_run(
        self,
        open_sync: Callable[[], contextlib.AbstractContextManager[Any]],
        position: tuple[int, int, int, int, int],
    ) -> Iterator[tuple[int, Any]]:
        with open_sync() as source:
            # the lead-in (the first batch alone: the one a training loop waits for), then
            # the first whole run
            for first_step, batches in itertools.islice(self._runs(source, *position), 2):
                head = batches[:_HEAD_RUN_STEPS]
                yield from self._read_batches_sync(source, first_step, head)

    def _emit(self, step: int, batch: Any) -> Any:
        """What the worker hands the DataLoader: the batch, tagged with its step if asked."""
        return (step, batch) if self._tag_steps else batch

    def _run_steps(self, num_workers: int) -> int:
        """Consecutive steps a worker builds and reads together (see :data:`RUN_READ_BYTES`).

        More than one only where it saves requests (samples adjacent in storage, known
        size) and where the order survives it: in a single process, or when the consumer
        re-sorts tagged batches (:meth:`tag_steps`).
        """
        if num_workers > 1 and not self._tag_steps:
            return 1
        by_budget = self.prefetch // (2 * self.batch_size)  # two runs in flight
        return max(1, min(self._span_run_steps(), by_budget))

    def _runs(
        self,
        source: Any,
        epoch: int,
        consumed: int,
        worker_id: int,
        num_workers: int,
        done: int,
    ) -> Iterator[tuple[int, list[list[Any]]]]:
        """This worker's remaining runs: ``(first step, read requests of each batch)``."""
        num_samples = self._num_samples(source)
        if self._known_num_samples is not None and self._known_num_samples != num_samples:
            raise StateError(
                f"{type(self).__name__} counted {self._known_num_samples} samples when "
                f"created but the reader in process {os.getpid()} has {num_samples}; the "
                "dataset changed underneath the loader"
            )
        plan = EpochPlan(
            num_samples=num_samples,
            batch_size=self.batch_size,
            world_size=self.world_size,
            rank=self.rank,
            drop_last=self.drop_last,
            consumed_samples=consumed,
        )
        if consumed == 0 and plan.num_steps == 0:
            # a whole epoch without one batch would end every training loop at once, silently
            raise LoaderConfigError(
                f"{type(self).__name__}: an epoch of {num_samples} samples makes no batch of "
                f"batch_size {self.batch_size} x world_size {self.world_size} = "
                f"{plan.global_batch_size} samples (drop_last={self.drop_last}); "
                + (
                    "the dataset has no sample (is sequence_length longer than the data?)"
                    if num_samples == 0
                    else "lower batch_size or world_size, or pass drop_last=False"
                )
            )
        runs: list[range] = []
        block_steps = max(1, _TARGET_BLOCK_SAMPLES // plan.batch_size)
        for run in plan.worker_runs(worker_id, num_workers, self._run_steps(num_workers)):
            if done >= len(run):  # built before a per-worker resume
                done -= len(run)
                continue
            runs.append(run[done:])
            done = 0
            if sum(len(r) for r in runs) >= block_steps:
                yield from self._block_runs(source, plan, runs, epoch)
                runs = []
        if runs:
            yield from self._block_runs(source, plan, runs, epoch)

    def _block_runs(
        self, source: Any, plan: EpochPlan, runs: list[range], epoch: int
    ) -> Iterator[tuple[int, list[list[Any]]]]:
        # One vectorised mapping (the shuffle) for many runs: numpy overhead amortised.
        steps = np.concatenate([np.arange(run.start, run.stop, dtype=np.int64) for run in runs])
        requests = self._requests(source, plan.sequence_indices(steps).reshape(-1), epoch)
        size = self.batch_size
        first = 0
        for run in runs:
            batches = [
                list(requests[(first + k) * size : (first + k + 1) * size]) for k in range(len(run))
            ]
            first += len(run)
            yield run.start, batches


class _ReadAhead:
    """The reads in flight of one iteration: at most ``prefetch`` samples, oldest first.

    A run of batches is read with one ``_read_many`` call (one round of coalesced range
    requests) once the budget has room for all of it; a one-batch run is read in parts as
    room frees up, parts that never span two batches. So what is in flight stays within
    the budget, and what was read waits to be handed over for at most one run (runs are at
    most half the budget).
    """

    def __init__(self, dataset: BatchIterableDataset, io: _EventLoopThread) -> None:
        self.dataset = dataset
        self.io = io
        self.pending: deque[tuple[int, concurrent.futures.Future[list[Any]]]] = deque()
        self.steps: deque[int] = deque()
        self.in_flight = 0
        self._scheduling: list[Any] = []
        self._whole = 1
        # the first read goes alone: the first batch is what a training loop waits for,
        # and runs of several MiB read beside it would slow it down
        self.first_pending = True
        self._runs: Iterator[tuple[int, list[list[Any]]]] = iter(())
        self._source: Any = None

    async def start(self, position: tuple[int, int, int, int, int]) -> None:
        """Open the source on the loop and submit the first reads."""
        self._source = await self.io.enter_async(self.dataset._open)
        self._runs = self.dataset._runs(self._source, *position)
        self.fill()

    def fill(self) -> None:
        budget = self.dataset.prefetch
        while not (self.first_pending and self.pending):
            if not self._scheduling:
                first_step, batches = next(self._runs, (0, []))
                if not batches:
                    return
                self.steps.extend(range(first_step, first_step + len(batches)))
                self._scheduling = [request for batch in batches for request in batch]
                # a multi-batch run waits until it fits whole: one request, not pieces
                self._whole = len(self._scheduling) if len(batches) > 1 else 1
            room = budget - self.in_flight
            if room < min(self._whole, budget, len(self._scheduling)):
                return
            take = min(len(self._scheduling), room)
            part, self._scheduling = self._scheduling[:take], self._scheduling[take:]
            read = self.io.submit(self.dataset._read_many(self._source, part))
            self.pending.append((take, read))
            self.in_flight += take


class _PrefetchingIterator(Iterator[Any]):
    """Collated batches read ahead on a private event loop, started as soon as it is made.

    Creating it submits the open and the first reads to the loop thread without waiting for
    them: in a DataLoader worker ``iter(dataset)`` runs before the worker answers the
    loader's start-up handshake, so the open and the first requests overlap that round trip
    instead of following it. Results are taken in order. Only the caller holds this object
    (the loop holds the :class:`_ReadAhead`), so dropping it closes the loop from the
    caller's thread.
    """

    def __init__(
        self, dataset: BatchIterableDataset, position: tuple[int, int, int, int, int]
    ) -> None:
        self._dataset = dataset
        self._samples: deque[Any] = deque()
        self._closed = False
        self._io = _EventLoopThread()
        self._reads = _ReadAhead(dataset, self._io)
        self._started: concurrent.futures.Future[None] | None = self._io.submit(
            self._reads.start(position)
        )

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        reads = self._reads
        size = self._dataset.batch_size
        try:
            if self._started is not None:
                self._started.result()
                self._started = None
            while len(self._samples) < size and reads.pending:
                # Waiting on the oldest read keeps the order; the others run meanwhile.
                count, read = reads.pending.popleft()
                self._samples.extend(read.result())
                reads.in_flight -= count
                reads.first_pending = False
                reads.fill()
            if len(self._samples) >= size:
                batch = [self._samples.popleft() for _ in range(size)]
                collated = self._dataset.collate_fn(batch)
                self._dataset._worker_batches += 1
                return self._dataset._emit(reads.steps.popleft(), collated)
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Cancel what is in flight and stop the loop thread (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._started is not None:
                # Let the start finish (or stop at its open) first: once it returns, every
                # read it submitted is a task that the loop's shutdown can cancel.
                self._started.cancel()
                with contextlib.suppress(BaseException):
                    self._started.result()
            self._io.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class IndexedBatchDataset(BatchIterableDataset):
    """Batches of windows or documents from a ``StreamDataset`` or ``DocumentDataset``.

    Parameters
    ----------
    dataset : IndexedDataset
        Picklable dataset whose readers index samples ``0 .. len(reader) - 1``.
    batch_size : int, default 8
        Samples per batch on each rank.
    shuffle : bool, default True
        Visit samples in a seeded global order (a :class:`Permutation` per epoch) instead
        of storage order.
    seed : int, default 0
        Shuffle seed; must be equal on every rank.
    rank, world_size : int or None
        This rank and the number of ranks; ``None`` reads ``torch.distributed``.
    drop_last : bool, default True
        End-of-epoch policy (see :mod:`rangestream.loader.plan`): skip the incomplete last
        global batch, or pad it by wrapping around to the start of the epoch's order.
    prefetch : int, optional
        Samples in flight per worker; by default two runs of sequential windows, else
        :data:`DEFAULT_PREFETCH`.
    collate_fn : callable, optional
        Turns a list of ``batch_size`` samples into a batch, inside the worker. Defaults to
        :func:`rangestream.loader.stack_collate`.
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        *,
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = True,
        prefetch: int | None = None,
        collate_fn: Collate | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=prefetch,
            collate_fn=collate_fn,
        )
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self._permutation: Permutation | None = None

    def state_identity(self) -> dict[str, Any]:
        return {"kind": "indexed", "shuffle": self.shuffle}

    def _open(self) -> AbstractAsyncContextManager[AsyncReader]:
        return self.dataset.async_reader()

    def _num_samples(self, source: AsyncReader) -> int:
        return len(source)

    def _count_samples(self) -> int:
        if hasattr(type(self.dataset), "__len__"):
            return len(self.dataset)  # type: ignore[arg-type]
        with self.dataset.sync_reader() as reader:
            return len(reader)

    def positions(self, indices: np.ndarray, num_samples: int, epoch: int) -> np.ndarray:
        """Sample positions of epoch-sequence ``indices`` (the shuffle, if enabled)."""
        if not self.shuffle:
            return np.asarray(indices, dtype=np.int64)
        permutation = self._permutation
        if permutation is None or (permutation.n, permutation.epoch) != (num_samples, epoch):
            permutation = self._permutation = Permutation(num_samples, self.seed, epoch)
        return permutation(indices)

    def _requests(self, source: AsyncReader, indices: np.ndarray, epoch: int) -> Sequence[int]:
        positions: list[int] = self.positions(indices, len(source), epoch).tolist()
        return positions

    async def _read(self, source: AsyncReader, request: int) -> Any:
        return await source[request]

    async def _read_many(self, source: AsyncReader, requests: list[int]) -> list[Any]:
        # One read_many: the batch's ranges are coalesced (adjacent windows: one request).
        read_many = getattr(source, "read_many", None)
        if read_many is None:
            return await super()._read_many(source, requests)
        return list(await read_many(requests))

    def _storage(self) -> Any:
        return getattr(self.dataset, "storage", None)

    def _sample_span_bytes(self) -> int | None:
        if self.shuffle:
            return None
        span = getattr(self.dataset, "sample_span_bytes", None)
        return int(span) if isinstance(span, int) and span > 0 else None

    def _sync_open(self) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
        if getattr(self.dataset, "is_local", False):
            return self.dataset.sync_reader
        return None

    def _read_many_sync(self, source: Any, requests: list[int]) -> list[Any]:
        return list(source.read_many(requests))
