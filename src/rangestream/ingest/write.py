"""``write(fn, inputs, url, kind=...)``: any records, any storage kind, on any executor.

The shape of LitData's ``optimize(fn, inputs)``: ``fn`` turns one input into a record (or
yields several), and the records are written in input order. Inputs are cut into splits of
``items_per_split`` consecutive items; split ``k`` becomes shard ``k``, so the dataset is
the same whatever executor and however many workers ran it, a retried task overwrites its
own split, and ``resume=True`` continues an interrupted write (see ``session``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

from rangestream.errors import InvalidRecordError
from rangestream.formats.described import format_schema
from rangestream.formats.records import RecordFormat
from rangestream.ingest.inputs import Row
from rangestream.ingest.preset import Outcome
from rangestream.ingest.session import (
    Heartbeat,
    Resumable,
    begin,
    counts_key,
    fingerprint_of,
    finish,
    rejects_key,
)
from rangestream.ingest.summary import Progress, SplitResult, Summary
from rangestream.ingest.tasks import Job, default_workers, run_splits
from rangestream.io.process import run_blocking
from rangestream.layout.manifest import Manifest
from rangestream.storage.core.base import Storage
from rangestream.storage.core.kill_points import kill_point
from rangestream.storage.core.writing import WriteSession
from rangestream.storage.document.storage import DocumentStorage
from rangestream.storage.stream.storage import StreamStorage
from rangestream.storage.stream.with_meta import StreamWithMetaStorage
from rangestream.storage.temporal import TemporalArrayStorage

__all__ = ["KINDS", "write", "write_records"]

KINDS = ("stream", "document", "stream_with_meta", "temporal")
#: Splits a write of many items is cut into by default (fewer when there are fewer items).
DEFAULT_SPLITS = 256


def format_description(storage_format: Any) -> dict[str, Any]:
    """What the stored schema says about ``storage_format`` (empty if it cannot say)."""
    described = format_schema(storage_format)
    return {} if described is None else {"format": described}


_KINDS: dict[str, type[Storage]] = {
    "stream": StreamStorage,
    "document": DocumentStorage,
    "stream_with_meta": StreamWithMetaStorage,
}


def make_storages(
    kind: str,
    url: str,
    storage_format: Any,
    description: Mapping[str, Any],
    field_groups: Sequence[Sequence[str]] | None,
    options: Mapping[str, Any],
) -> tuple[Storage, Storage]:
    """``(storage to write with, storage to read with)`` for ``kind`` at ``url``."""
    if kind == "temporal":
        if storage_format is not None:
            raise ValueError("temporal datasets take field_groups, not a storage_format")
        return (
            TemporalArrayStorage(url, field_groups, **options),
            TemporalArrayStorage(url, field_groups, **options),
        )
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if field_groups is not None:
        raise ValueError(f"field_groups applies to temporal datasets, not {kind!r}")
    if storage_format is None:
        raise ValueError(f"a {kind!r} write needs a storage_format")
    # the kind records the format itself; ``description`` (what produced the data) goes
    # beside it as notes
    storage_class: Any = _KINDS[kind]
    reader = storage_class(url, storage_format, **options)
    writer = storage_class(url, storage_format, notes=dict(description), **options)
    return writer, reader


def stored_nbytes(manifest: Manifest) -> int:
    """Bytes of data a commit holds: rows times row size, over every array and shard."""
    return sum(
        int(manifest.lengths[name].sum()) * layout.row_nbytes
        for name, layout in manifest.arrays.items()
    )


# -- the write job ----------------------------------------------------------------------------
class _FunctionJob(Job):
    """``fn`` over consecutive items: split ``k`` is items ``bounds[k]..bounds[k+1]``."""

    def __init__(
        self, fn: Callable[[Any], Any], items: Sequence[Any], bounds: Sequence[int]
    ) -> None:
        self.fn = fn
        self.items = items
        self.bounds = list(bounds)
        self.offset = 0  # index of items[0] in the whole input list

    def for_split(self, split: int) -> _FunctionJob:
        start, stop = self.bounds[split], self.bounds[split + 1]
        job = _FunctionJob(
            self.fn, self.items[start - self.offset : stop - self.offset], self.bounds
        )
        job.offset = start
        return job

    def outcomes(self, split: int) -> Iterator[Outcome]:
        start, stop = self.bounds[split], self.bounds[split + 1]
        for index in range(start, stop):
            item = self.items[index - self.offset]
            where = _describe_input(index, item)
            try:
                produced = self.fn(item)
                records = _records_of(produced)
                first = True
                for record in records:
                    yield Outcome(Row(where), [record], rows=1 if first else 0)
                    first = False
                if first:
                    yield Outcome(Row(where), [])
            except Exception as error:
                if not any(
                    note.startswith("while writing") for note in getattr(error, "__notes__", ())
                ):
                    error.add_note(f"while writing {where}")
                raise


def _describe_input(index: int, item: Any) -> str:
    text = repr(item)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"input {index}: {text}"


def _records_of(produced: Any) -> Iterable[Any]:
    """One record, or each record of a generator/iterator ``fn`` returned."""
    if produced is None:
        return ()
    if inspect.isgenerator(produced) or (
        isinstance(produced, Iterator) and not isinstance(produced, (Mapping, bytes, str))
    ):
        return produced
    return (produced,)


def _split_bounds(count: int, per_split: int | None) -> list[int]:
    if per_split is None:
        per_split = max(1, -(-count // DEFAULT_SPLITS))
    if isinstance(per_split, bool) or not isinstance(per_split, int) or per_split < 1:
        raise ValueError(f"items_per_split must be a positive integer, got {per_split!r}")
    return [*range(0, count, per_split), count] if count else [0]


def _format_identity(storage_format: Any) -> Any:
    """What identifies a format across processes (its repr may hold a memory address)."""
    if storage_format is None:
        return None
    kind = type(storage_format)
    dtype = getattr(storage_format, "stream_dtype", None)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "stream_dtype": None if dtype is None else str(dtype),
        **format_description(storage_format),
    }


def _digest_inputs(items: Sequence[Any]) -> str:
    try:
        data = pickle.dumps(items, protocol=4)
    except Exception:
        data = repr(items).encode()
    return hashlib.sha256(data).hexdigest()


def _check_workers(workers: Any, name: str) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {workers!r}")


def run_job(
    job: Job,
    writer_storage: Storage,
    reader_storage: Storage,
    split_count: int,
    fingerprint: str,
    *,
    workers: int,
    executor: Executor | None,
    overwrite: bool,
    resume: bool,
    progress: bool,
    start_method: str | None,
    description: str,
    mode: str | None = None,
    total_rows: int | None = None,
    rejects: str | None = None,
) -> Summary:
    """Run ``job``'s splits, gather rejects, commit, and say what was written."""
    started = time.perf_counter()
    state = begin(
        writer_storage, fingerprint, split_count, resume=resume, overwrite=overwrite, mode=mode
    )
    session = state.session
    summary = Summary(str(reader_storage.url), splits=split_count, splits_skipped=len(state.done))
    if state.finished is not None:
        # killed after its commit: the dataset is complete, only the session file was left
        finish(writer_storage)
        return _described(summary, reader_storage, state.finished, started, session, state)
    todo = [k for k in range(split_count) if k not in state.done]
    bar = Progress(split_count, enabled=progress, description=description, total_rows=total_rows)
    bar.splits_done = len(state.done)
    with Heartbeat(writer_storage, session.commit_id):
        try:
            run_splits(
                job,
                session,
                todo,
                workers=workers,
                executor=executor,
                start_method=start_method,
                progress=bar,
                on_result=summary.add,
            )
        except BaseException as error:
            bar.close()
            error.add_note(
                f"nothing was committed at {reader_storage.url}; {bar.splits_done} of "
                f"{split_count} splits are written and kept: rerun with resume=True "
                "(--resume) to reuse them"
            )
            raise
        bar.close()
        kill_point("splits-written")
        if job.skip_bad:
            summary.rejects_url = _gather_rejects(session, split_count, rejects)
        manifest = session.commit()
    kill_point("committed")
    finish(writer_storage)
    return _described(summary, reader_storage, manifest, started, session, state)


def _described(
    summary: Summary,
    reader_storage: Storage,
    manifest: Manifest,
    started: float,
    session: WriteSession,
    state: Resumable,
) -> Summary:
    """``summary`` completed with the committed dataset: the splits of earlier runs are
    counted too (``added`` keeps what this run did)."""
    summary.added = summary.copy_counts()
    if state.done:
        _count_resumed(summary, session, state.done)
    summary.storage = reader_storage
    summary.shards = len(manifest.shard_ids)
    summary.nbytes = stored_nbytes(manifest)
    summary.seconds = time.perf_counter() - started
    return summary


def _count_resumed(summary: Summary, session: WriteSession, done: frozenset[int]) -> None:
    """Add the counts of the splits an earlier run wrote (each left them beside its part),
    so that the summary of a resumed write describes the whole dataset."""

    async def count() -> list[SplitResult]:
        store = session.storage.new_write_store()
        try:
            results = []
            for split in sorted(done):
                result = SplitResult(split)
                with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
                    result = SplitResult(**json.loads(await store.get(counts_key(session, split))))
                if not result.rejected:  # counts of older runs: the rejects are stored
                    with contextlib.suppress(FileNotFoundError):
                        rejected = await store.get(rejects_key(session, split))
                        result.rejected = rejected.count(b"\n")
                results.append(result)
            return results
        finally:
            await store.aclose()

    for result in run_blocking(count()):
        summary.add(result)


def _gather_rejects(session: WriteSession, split_count: int, rejects: str | None) -> str:
    """Concatenate the splits' rejects, in split order, into one JSONL file; its URL."""
    storage = session.storage
    target = rejects or f"{storage.url.rstrip('/')}/rejects.jsonl"

    async def gather() -> bytes:
        store = storage.new_write_store()
        try:
            parts = []
            for split in range(split_count):
                with contextlib.suppress(FileNotFoundError):
                    parts.append(await store.get(rejects_key(session, split)))
            return b"".join(parts)
        finally:
            await store.aclose()

    data = run_blocking(gather())
    import fsspec

    options = (
        storage.storage_options
        if "://" in target and target.split("://")[0] == storage.url.split("://")[0]
        else {}
    )
    with fsspec.open(target, "wb", **options) as handle:
        handle.write(data)
    return target


def write(
    fn: Callable[[Any], Any],
    inputs: Iterable[Any],
    url: str | os.PathLike[str],
    *,
    kind: str = "document",
    storage_format: Any = None,
    field_groups: Sequence[Sequence[str]] | None = None,
    workers: int | None = None,
    executor: Executor | None = None,
    items_per_split: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    start_method: str | None = None,
    mode: str | None = None,
    **options: Any,
) -> Summary:
    """Write ``fn(x)`` for every ``x`` of ``inputs`` as one dataset of ``kind``.

    Parameters
    ----------
    fn
        Turns one input into a record, or yields several (a generator), or returns None
        for none. With worker processes it must be picklable (a module-level function;
        Dask also takes closures).
    inputs
        What ``fn`` takes (paths, ids...); materialised as a list. Their order is the
        dataset's record order.
    url
        Where to write: a local path, ``s3://``, any fsspec URL.
    kind
        ``"stream"``, ``"document"``, ``"stream_with_meta"`` or ``"temporal"``.
    storage_format
        The format of a stream, document or stream_with_meta dataset. Documents default
        to a ``RecordFormat`` inferred from the first record (``fn(inputs[0])`` runs once
        more in this process to find it).
    field_groups
        Temporal datasets: fields stored interleaved per frame.
    workers
        Worker processes of the default pool (``0``: run in this process; default: the
        usable cores). Ignored when ``executor`` is given.
    executor
        Any ``concurrent.futures.Executor``, e.g. ``distributed.Client(...).get_executor()``.
    items_per_split
        Consecutive inputs per split (one task, one shard); by default the inputs are cut
        into at most 256 splits. The output depends on this, never on the executor.
    storage_options
        fsspec options for ``url``.
    overwrite
        Replace a dataset already committed at ``url``.
    mode
        ``"append"`` adds the records as new shards of the dataset at ``url`` (a new
        version; the old shards are not copied); ``"overwrite"`` is ``overwrite=True``.
    resume
        Continue the interrupted write at ``url``: splits already written are skipped.
    progress
        Show a progress bar (input rows, records, MB written).
    start_method
        ``multiprocessing`` start method of the default pool.
    **options
        Further storage options (``chunk_bytes``, ``block_bytes``...).

    Returns
    -------
    Summary
        Counts, sizes and time; ``summary.storage`` is the written dataset, ready to read.
    """
    if workers is None:
        workers = default_workers()
    _check_workers(workers, "workers")
    items = list(inputs)
    url = os.fspath(url)
    if executor is None and workers and len(items) > 0:
        try:
            pickle.dumps(fn)
        except Exception as error:
            raise TypeError(
                f"fn {fn!r} cannot be sent to worker processes ({error}); "
                "pass a module-level function, or workers=0 to run in this process"
            ) from error
    first: Any = None
    if items and (kind == "temporal" or (kind == "document" and storage_format is None)):
        # The schema of every split's writer must be the same: take it from the first
        # record here, once, rather than letting each task bind its own.
        try:
            first = next(iter(_records_of(fn(items[0]))), None)
        except Exception as error:
            error.add_note(f"while writing {_describe_input(0, items[0])}")
            raise
        if first is None:
            raise InvalidRecordError(
                "fn returned no record for input 0, so the schema cannot be inferred; "
                "pass storage_format"
            )
        if storage_format is None and kind == "document":
            storage_format = RecordFormat.from_record(first)
    all_options = {"storage_options": storage_options, **options}
    writer, reader = make_storages(kind, url, storage_format, {}, field_groups, all_options)
    if kind == "temporal" and first is not None:
        writer = writer.bind_record(first)
    bounds = _split_bounds(len(items), items_per_split)
    split_count = len(bounds) - 1
    fingerprint = fingerprint_of(
        {
            "fn": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}",
            "kind": kind,
            "format": _format_identity(storage_format),
            "field_groups": field_groups,
            "inputs": _digest_inputs(items),
            "bounds": bounds,
            "options": {k: v for k, v in options.items()},
        }
    )
    job = _FunctionJob(fn, items, bounds)
    return run_job(
        job,
        writer,
        reader,
        split_count,
        fingerprint,
        workers=workers,
        executor=executor,
        overwrite=overwrite,
        resume=resume,
        progress=progress,
        start_method=start_method,
        description="write",
        mode=mode,
        total_rows=len(items),
    )


def write_records(
    load_record: Callable[[Any], Mapping[str, Any]],
    inputs: Iterable[Any],
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

    The temporal case of ``write`` (kept for existing callers): record ``i`` is
    ``load_record(inputs[i])``; ``num_workers=0`` loads in this process.
    """
    _check_workers(num_workers, "num_workers")
    if num_workers:
        try:
            pickle.dumps(load_record)
        except Exception as error:
            raise TypeError(
                f"load_record {load_record!r} cannot be sent to worker processes ({error}); "
                "pass a module-level function, or num_workers=0 to load in this process"
            ) from error
    summary = write(
        load_record,
        inputs,
        url,
        kind="temporal",
        field_groups=field_groups,
        workers=num_workers,
        storage_options=storage_options,
        overwrite=overwrite,
        progress=progress,
        start_method=start_method,
        **options,
    )
    storage = summary.storage
    assert isinstance(storage, TemporalArrayStorage)
    return storage
