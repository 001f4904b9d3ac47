"""``write_records``: load temporal records in parallel processes and write one dataset.

Loading (decoding files, resampling sensors) usually costs far more than writing, so it runs
in ``num_workers`` processes. Worker ``k`` loads a contiguous slice of the inputs and writes
it to shard ``k`` of one shared write session; since records are numbered shard by shard,
the dataset's record order is the input order. Nothing is visible until every worker has
finished and the commit succeeds; any failure leaves the previous dataset (or none).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from tqdm.auto import tqdm

from rangestream.storage.temporal import TemporalArrayStorage
from rangestream.storage.writing import WriteSession

__all__ = ["write_records"]

T = TypeVar("T")
_PROGRESS_INTERVAL = 0.2

# Set in each worker process by _start_worker (inherited, not pickled per task).
_worker_counter: Any = None
_worker_stop: Any = None


class _Stopped(Exception):
    """A worker gave up because another one failed."""


def write_records(
    load_record: Callable[[T], Mapping[str, Any]],
    inputs: Iterable[T],
    url: str | os.PathLike[str],
    *,
    num_workers: int = 4,
    field_groups: Sequence[Sequence[str]] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    start_method: str | None = None,
    **options: Any,
) -> TemporalArrayStorage:
    """Write ``load_record(x)`` for every ``x`` of ``inputs`` as one temporal dataset.

    Parameters
    ----------
    load_record
        Turns one input into a record: a mapping of field name to numpy array or torch
        tensor shaped ``(frames, ...)``. With ``num_workers > 0`` it runs in worker processes,
        so it must be picklable (a module-level function).
    inputs
        What to load (paths, ids...); materialised as a list.
    url
        Where to write (local path, ``s3://``, any fsspec URL).
    num_workers
        Loading processes, each writing its own shard; ``0`` loads in this process.
    field_groups
        Fields stored interleaved per frame (see ``TemporalArrayStorage``).
    storage_options
        fsspec options for ``url``.
    overwrite
        Replace a dataset already committed at ``url``.
    progress
        Show a tqdm progress bar of records written.
    start_method
        ``multiprocessing`` start method of the workers (the platform default if omitted).
    **options
        Further ``TemporalArrayStorage`` options (``chunk_bytes``, ``block_bytes``...).

    Returns
    -------
    TemporalArrayStorage
        The written dataset, ready to read; record ``i`` is ``load_record(inputs[i])``.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    items = list(inputs)
    storage = TemporalArrayStorage(url, field_groups, storage_options=storage_options, **options)
    workers = min(num_workers, len(items))
    if workers:
        try:
            pickle.dumps(load_record)
        except Exception as error:
            raise TypeError(
                f"load_record {load_record!r} cannot be sent to worker processes ({error}); "
                "pass a module-level function, or num_workers=0 to load in this process"
            ) from error
    session = storage.parallel_write(overwrite=overwrite)
    try:
        with tqdm(
            total=len(items), desc="write_records", unit="record", disable=not progress
        ) as bar:
            if workers:
                _run_workers(session, load_record, items, workers, start_method, bar)
            else:
                _write_slice(session, load_record, items, 0, 0)
                bar.update(len(items))
        session.commit()
    except BaseException:
        session.abort()
        raise
    return TemporalArrayStorage(url, field_groups, storage_options=storage_options, **options)


def _slices(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` slices of ``range(count)``, sizes within one."""
    size, extra = divmod(count, parts)
    out, start = [], 0
    for part in range(parts):
        stop = start + size + (1 if part < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _run_workers(
    session: WriteSession,
    load_record: Callable[[Any], Any],
    items: list[Any],
    workers: int,
    start_method: str | None,
    bar: Any,
) -> None:
    context = multiprocessing.get_context(start_method)
    counter = context.Value("q", 0)
    stop = context.Event()
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_start_worker,
        initargs=(counter, stop),
    ) as pool:
        pending: set[Future[None]] = {
            pool.submit(_write_slice, session, load_record, items[a:b], shard, a)
            for shard, (a, b) in enumerate(_slices(len(items), workers))
        }
        failure: BaseException | None = None
        while pending:
            done, pending = wait(pending, timeout=_PROGRESS_INTERVAL, return_when=FIRST_COMPLETED)
            bar.update(counter.value - bar.n)
            for future in done:
                error = future.exception()
                if error is not None and not isinstance(error, _Stopped) and failure is None:
                    failure = error
                    stop.set()  # the others stop at their next record
        bar.update(counter.value - bar.n)
    if failure is not None:
        raise failure


def _start_worker(counter: Any, stop: Any) -> None:
    global _worker_counter, _worker_stop
    _worker_counter, _worker_stop = counter, stop


def _write_slice(
    session: WriteSession,
    load_record: Callable[[Any], Any],
    items: Sequence[Any],
    shard: int,
    first: int,
) -> None:
    """Load ``items`` (inputs ``first...``) and append them to ``shard``, in order."""
    with session.sync_writer() as writer:
        for offset, item in enumerate(items):
            if _worker_stop is not None and _worker_stop.is_set():
                raise _Stopped
            try:
                writer.append(shard, load_record(item))
            except Exception as error:
                text = repr(item)
                if len(text) > 200:
                    text = text[:200] + "..."
                error.add_note(f"while writing input {first + offset}: {text}")
                raise
            if _worker_counter is not None:
                with _worker_counter.get_lock():
                    _worker_counter.value += 1
