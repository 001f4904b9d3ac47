"""``convert``: JSONL, Parquet, text or a Hugging Face dataset to a training dataset.

Rows are read split by split, tokenized by batch and turned into the preset's records
(``presets``), and written as shard ``k`` for split ``k`` (``tasks``), on a process pool or
any executor. Bad rows fail the conversion with their file and line, or, with
``skip_bad``, are counted and listed in a rejects file; either way nothing is visible
until the commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from typing import Any

from rangestream.ingest.inputs import (
    DEFAULT_MAX_ROW_BYTES,
    DEFAULT_SPLIT_BYTES,
    DEFAULT_SPLIT_ROWS,
    Row,
    Source,
    Split,
    open_inputs,
)
from rangestream.ingest.preset import Fields, Limits, Outcome, Preset
from rangestream.ingest.presets import get_preset
from rangestream.ingest.session import fingerprint_of
from rangestream.ingest.summary import Summary
from rangestream.ingest.tasks import Job, default_workers
from rangestream.ingest.tokenizers import load_tokenizer
from rangestream.ingest.write import make_storages, run_job

__all__ = ["convert"]

#: Rows tokenized per call of the tokenizer.
DEFAULT_BATCH_ROWS = 512


class _ConvertJob(Job):
    def __init__(
        self,
        sources: Sequence[Source],
        splits: Sequence[Split],
        preset: Preset,
        batch_rows: int,
        skip_bad: bool,
    ) -> None:
        self.sources = list(sources)
        self.splits = list(splits)
        self.preset = preset
        self.batch_rows = batch_rows
        self.skip_bad = skip_bad

    def for_split(self, split: int) -> _ConvertJob:
        # a task carries only its own source (a Dataset held in memory pickles whole)
        part = self.splits[split]
        sources: list[Any] = [None] * len(self.sources)
        sources[part.source] = self.sources[part.source]
        return _ConvertJob(sources, self.splits, self.preset, self.batch_rows, self.skip_bad)

    def outcomes(self, split: int) -> Iterator[Outcome]:
        part = self.splits[split]
        rows = self.sources[part.source].rows(part, self.preset.columns())
        batch: list[Row] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= self.batch_rows:
                yield from self.preset.convert(batch)
                batch = []
        if batch:
            yield from self.preset.convert(batch)

    def record_nbytes(self, record: Any) -> int:
        return sum(
            sum(a.nbytes for a in v) if isinstance(v, list) else v.nbytes for v in record.values()
        )


#: Bytes of input allowed per token of ``max_len`` (UTF-8 text runs 3-5 bytes per token;
#: JSON escapes and several fields per row take more), and the least bound whatever
#: ``max_len`` says.
ROW_BYTES_PER_TOKEN = 64
MIN_ROW_BYTES = 1 << 20


def row_bytes_for(max_len: int | None) -> int:
    """The default bound on one input row's bytes, following ``max_len``."""
    if max_len is None:
        return DEFAULT_MAX_ROW_BYTES
    return max(MIN_ROW_BYTES, ROW_BYTES_PER_TOKEN * max_len)


def _fields(value: Fields | Mapping[str, str] | None) -> Fields:
    if value is None:
        return Fields()
    if isinstance(value, Fields):
        return value
    known = {f.name for f in dataclass_fields(Fields)}
    unknown = set(value) - known
    if unknown:
        raise ValueError(f"unknown field names {sorted(unknown)}; known: {sorted(known)}")
    return Fields(**value)


def convert(
    inputs: Any,
    url: str | os.PathLike[str],
    *,
    preset: str,
    tokenizer: Any,
    workers: int | None = None,
    executor: Executor | None = None,
    fields: Fields | Mapping[str, str] | None = None,
    max_len: int | None = None,
    too_long: str = "error",
    max_row_bytes: int | None = None,
    skip_bad: bool = False,
    rejects: str | None = None,
    eos_token: str | None = None,
    chat_template: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    input_storage_options: Mapping[str, Any] | None = None,
    input_format: str | None = None,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    split_rows: int = DEFAULT_SPLIT_ROWS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    start_method: str | None = None,
    mode: str | None = None,
    **options: Any,
) -> Summary:
    """Tokenize ``inputs`` with a training preset and write them as one dataset at ``url``.

    Parameters
    ----------
    inputs
        Paths, globs, directories or fsspec URLs (``s3://...``) of JSONL (plain, ``.gz``,
        ``.zst``), Parquet or text files, or ``datasets.Dataset`` / ``IterableDataset``
        objects; one or a list. Their order is the dataset's order.
    url
        Where to write (local path, ``s3://``, any fsspec URL).
    preset
        ``"seq"``, ``"sft"``, ``"dpo"`` or ``"grpo"`` (see ``rangestream.ingest.presets``).
    tokenizer
        ``"bytes"``, a ``tokenizer.json``, a local ``transformers`` tokenizer directory, or
        a tokenizer object.
    workers
        Processes of the default pool (``0``: this process; default: the usable cores).
    executor
        Any ``concurrent.futures.Executor`` instead, e.g. a Dask client's
        ``get_executor()``; the output is the same whatever runs it.
    fields
        Input field names, e.g. ``{"text": "content"}`` (see ``Fields``).
    max_len, too_long
        Records over ``max_len`` tokens are an ``"error"``, ``"truncate"``d or ``"split"``.
    max_row_bytes
        A JSONL row longer than this is a bad row, refused before it is parsed or
        tokenized, so one huge line cannot exhaust a worker's memory. Default:
        ``row_bytes_for(max_len)`` (64 bytes per token, at least 1 MiB), 256 MiB
        without ``max_len``.
    skip_bad
        Count bad rows and list them in ``rejects`` instead of failing.
    rejects
        Where the rejects file goes (default ``<url>/rejects.jsonl``).
    eos_token, chat_template
        Override the tokenizer's end-of-text token and chat template (text or a file).
    storage_options, input_storage_options
        fsspec options for ``url`` and for the inputs (default: the same as ``url``'s).
    input_format
        ``"jsonl"``, ``"parquet"`` or ``"text"`` for files whose names do not tell.
    split_bytes, split_rows
        Split sizes of plain JSONL files and of ``Dataset`` objects.
    batch_rows
        Rows tokenized per tokenizer call.
    overwrite, resume, progress, start_method
        As for ``write``.
    mode
        ``"append"``: add the converted inputs as new shards of the dataset at ``url`` (of
        the same preset and tokenizer), a new version; the old shards are not copied.
    **options
        Storage options (``chunk_bytes``, ``block_bytes``...).

    Returns
    -------
    Summary
        Records, tokens, loss-masked fraction, rejects, shards, bytes and time;
        ``summary.storage`` opens the result.
    """
    if workers is None:
        workers = default_workers()
    url = os.fspath(url)
    loaded = load_tokenizer(tokenizer, eos_token=eos_token, chat_template=chat_template)
    chosen = get_preset(preset, loaded, _fields(fields), Limits(max_len, too_long))
    in_options = (
        dict(storage_options or {})
        if input_storage_options is None
        else dict(input_storage_options)
    )
    sources = open_inputs(inputs, in_options, input_format)
    bound = row_bytes_for(max_len) if max_row_bytes is None else max_row_bytes
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(f"max_row_bytes must be a positive integer, got {bound!r}")
    for source in sources:
        source.max_row_bytes = bound
    splits = [
        split
        for number, source in enumerate(sources)
        for split in source.splits(number, split_bytes, split_rows)
    ]
    storage_format = chosen.storage_format()
    description = {
        "ingest": {**chosen.describe(), "tokenizer": loaded.name, "fields": asdict(chosen.fields)}
    }
    all_options = {"storage_options": storage_options, **options}
    writer, reader = make_storages(chosen.kind, url, storage_format, description, None, all_options)
    fingerprint = fingerprint_of(
        {
            "preset": chosen.describe(),
            "fields": asdict(chosen.fields),
            "tokenizer": loaded.fingerprint(),
            "sources": [source.fingerprint() for source in sources],
            "splits": [(s.source, s.start, s.stop) for s in splits],
            "options": options,
        }
    )
    job = _ConvertJob(sources, splits, chosen, batch_rows, skip_bad)
    return run_job(
        job,
        writer,
        reader,
        len(splits),
        fingerprint,
        workers=workers,
        executor=executor,
        overwrite=overwrite,
        resume=resume,
        progress=progress,
        start_method=start_method,
        description=f"convert {preset}",
        mode=mode,
        rejects=rejects,
    )
