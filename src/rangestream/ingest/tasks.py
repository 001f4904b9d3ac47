"""Running a write's splits as tasks on any ``concurrent.futures.Executor``.

One task writes one split to the shard of the same number, with a part named after the
split (see ``session``). Tasks share nothing but the write session, so they run equally on
this process (``workers=0``), a process pool (the default), or a Dask cluster's executor
(``client.get_executor()``), and the dataset is the same whichever ran them.

On the default pool, workers report counts as they go (shared counters) and stop at their
next row once another task failed; on other executors, counts arrive as tasks finish.
"""

from __future__ import annotations

import abc
import contextlib
import json
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import asdict
from typing import Any

from rangestream.errors import BadInputError
from rangestream.ingest.inputs import RAW_SHOWN
from rangestream.ingest.preset import Outcome
from rangestream.ingest.session import counts_key, part_id, rejects_key
from rangestream.ingest.summary import Progress, SplitResult
from rangestream.io.process import run_blocking
from rangestream.storage.core.writing import WriteSession

__all__ = ["Job", "run_split", "run_splits"]

_POLL_SECONDS = 0.2
#: Rows between two updates of the shared counters.
_REPORT_EVERY = 256

# Set in each worker of the default pool by _start_worker (inherited, not pickled per task).
_counters: Any = None
_stop: Any = None


class Stopped(Exception):
    """A task gave up because another one failed."""


class Job(abc.ABC):
    """What a write's tasks do: turn split ``k`` into outcomes. Picklable."""

    skip_bad: bool = False

    @abc.abstractmethod
    def outcomes(self, split: int) -> Iterator[Outcome]:
        """Each input row of ``split`` and the records it became (or why it has none)."""

    def for_split(self, split: int) -> Job:
        """The part of this job that split ``split``'s task needs (sent with the task)."""
        return self

    def record_nbytes(self, record: Any) -> int:
        """Bytes ``record`` adds to the dataset's data (shown while writing)."""
        return _nbytes(record)


def _nbytes(value: Any) -> int:
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return 8


def _reject_line(outcome: Outcome) -> bytes:
    row = outcome.row
    raw = row.raw
    if not raw and row.value is not None:  # Parquet and dataset rows: the parsed value
        raw = json.dumps(row.value, ensure_ascii=False, default=str)
    document = {"where": str(row.where), "error": outcome.error, "raw": raw[:RAW_SHOWN]}
    return (json.dumps(document, ensure_ascii=False) + "\n").encode()


def run_split(job: Job, session: WriteSession, split: int, run: str = "") -> SplitResult:
    """Write ``split`` as shard ``split``: the body of one task, in whatever process runs it.

    ``run`` names the run that submitted it and is otherwise unused: a Dask client keys a
    task by its function and arguments (``pure``) and hands a resubmitted task the result
    it still holds, so without it a resumed run on the executor of the failed one got the
    failed split's error back instead of running the split again.
    """
    result = SplitResult(split)
    rejects: list[bytes] = []
    reported = [0, 0, 0, 0]
    with session.sync_writer(part_id=part_id(split)) as writer:
        for outcome in job.outcomes(split):
            if _stop is not None and _stop.is_set():
                raise Stopped
            result.rows += outcome.rows
            if outcome.error is not None:
                if not job.skip_bad:
                    raise BadInputError(
                        f"{outcome.error} (skip_bad=True (--skip-bad) skips bad rows and "
                        "lists them in a rejects file)"
                    )
                rejects.append(_reject_line(outcome))
                result.rejected += 1
                continue
            for record in outcome.records:
                try:
                    writer.append(split, record)
                except Exception as error:
                    error.add_note(f"while writing {outcome.row.where}")
                    raise
                result.nbytes += job.record_nbytes(record)
            result.records += len(outcome.records)
            result.tokens += outcome.tokens
            result.loss_tokens += outcome.loss_tokens
            if _counters is not None and result.rows - reported[0] >= _REPORT_EVERY:
                reported = _report(result, reported)
        if rejects:
            _put(session, rejects_key(session, split), b"".join(rejects))
        # before the part (the writer's close), so a written split always has its counts
        _put(session, counts_key(session, split), json.dumps(asdict(result)).encode())
    if _counters is not None:
        _report(result, reported)
    return result


def _report(result: SplitResult, reported: list[int]) -> list[int]:
    now = [result.rows, result.records, result.tokens, result.nbytes]
    with _counters.get_lock():
        for index, (new, old) in enumerate(zip(now, reported, strict=True)):
            _counters[index] += new - old
    if isinstance(_counters, _LocalCounters):
        _counters.progress.show(*_counters)
    return now


class _LocalCounters(list[int]):
    """The shared counters' interface for tasks run in this process: shown at once."""

    def __init__(self, progress: Progress) -> None:
        super().__init__([0, 0, 0, 0])
        self.progress = progress

    def get_lock(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _put(session: WriteSession, key: str, data: bytes) -> None:
    async def put() -> None:
        store = session.storage.new_write_store()
        try:
            await store.put(key, data)
        finally:
            await store.aclose()

    run_blocking(put())


def _start_worker(counters: Any, stop: Any, parent: int) -> None:
    global _counters, _stop
    _counters, _stop = counters, stop
    die_with_parent(parent)


#: ``prctl`` option: the signal the kernel sends this process when its parent exits.
_PR_SET_PDEATHSIG = 1
#: Seconds between two checks of the parent, where the OS has no parent-death signal.
_PARENT_CHECK_SECONDS = 1.0


def die_with_parent(parent: int) -> None:
    """End this worker when the process that started it dies, even by SIGKILL.

    Linux: the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), set
    through ``ctypes``. Elsewhere: a daemon thread that exits the process once its parent
    is gone (the parent id changes when a process is re-parented). Without either, a
    killed conversion's workers would keep reading and writing for minutes.
    """
    import signal
    import threading

    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before the signal was set
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="rangestream-parent-check", daemon=True).start()


def run_splits(
    job: Job,
    session: WriteSession,
    splits: Sequence[int],
    *,
    workers: int,
    executor: Executor | None,
    start_method: str | None,
    progress: Progress,
    on_result: Callable[[SplitResult], None],
) -> None:
    """Run ``splits`` and hand each result to ``on_result``; raise the first task error."""
    if executor is None and workers == 0:
        global _counters
        _counters = _LocalCounters(progress)
        try:
            for split in splits:
                result = run_split(job.for_split(split), session, split)
                progress.splits_done += 1
                on_result(result)
                progress.show(*_counters)
        finally:
            _counters = None
        return
    if executor is not None:
        _run_on(executor, job, session, splits, progress, on_result, None, None)
        return
    context = multiprocessing.get_context(start_method)
    counters = context.Array("q", 4)
    stop = context.Event()
    with ProcessPoolExecutor(
        max_workers=min(workers, max(1, len(splits))),
        mp_context=context,
        initializer=_start_worker,
        initargs=(counters, stop, os.getpid()),
    ) as pool:
        try:
            _run_on(pool, job, session, splits, progress, on_result, counters, stop)
        except BaseException:
            # Ctrl-C or a failure: the workers stop now, not after their split (a split
            # may take minutes); what they had written stays uncommitted, for --resume
            processes = dict(getattr(pool, "_processes", None) or {})
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes.values():
                with contextlib.suppress(Exception):
                    process.kill()
            raise


def _run_on(
    executor: Executor,
    job: Job,
    session: WriteSession,
    splits: Sequence[int],
    progress: Progress,
    on_result: Callable[[SplitResult], None],
    counters: Any,
    stop: Any,
) -> None:
    run = uuid.uuid4().hex
    pending: dict[Future[SplitResult], int] = {
        executor.submit(run_split, job.for_split(split), session, split, run): split
        for split in splits
    }
    finished = [0, 0, 0, 0]
    failure: BaseException | None = None
    try:
        while pending:
            done, _ = wait(list(pending), timeout=_POLL_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                pending.pop(future)
                if future.cancelled():
                    continue
                error = future.exception()
                if error is not None:
                    if failure is None and not isinstance(error, Stopped):
                        failure = error
                        if stop is not None:
                            stop.set()  # the others stop at their next row
                        for other in pending:
                            other.cancel()
                    continue
                result = future.result()
                progress.splits_done += 1
                on_result(result)
                finished = [
                    finished[0] + result.rows,
                    finished[1] + result.records,
                    finished[2] + result.tokens,
                    finished[3] + result.nbytes,
                ]
            if counters is not None:
                with counters.get_lock():
                    live = list(counters)
                progress.show(*live)
            else:
                progress.show(*finished)
            if failure is not None and stop is None:
                break  # a foreign executor's running tasks are left to finish on their own
    except BaseException:
        if stop is not None:
            stop.set()
        for future in pending:
            future.cancel()
        raise
    if failure is not None:
        raise failure


def default_workers() -> int:
    """Worker processes when none is asked for: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)
