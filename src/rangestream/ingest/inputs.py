"""Inputs of a conversion: files (JSONL, Parquet, text) and Hugging Face datasets, in splits.

A *split* is a deterministic unit of input: a byte range of a plain JSONL file, a whole
compressed file, one Parquet row group, one text file, a range of rows of a ``Dataset`` or
one shard of an ``IterableDataset``. Splits depend only on the inputs and the split size,
never on how many workers run, so split ``k`` always becomes shard ``k`` of the output and
the dataset is the same whatever ran it.

Reading yields ``Row``s: the parsed value and where it came from (file and line, or row),
so every error and reject names its origin. A row that cannot be parsed (malformed JSON, a
non-UTF-8 byte) is yielded as a ``Row`` with ``error`` set rather than raised, so that the
caller decides between failing and skipping.
"""

from __future__ import annotations

import abc
import glob as globbing
import gzip
import io
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rangestream.errors import BadInputError
from rangestream.ingest.compressed import ZstdFrames

__all__ = [
    "DEFAULT_SPLIT_BYTES",
    "DEFAULT_SPLIT_ROWS",
    "DatasetSource",
    "FileSource",
    "Row",
    "Source",
    "Split",
    "open_inputs",
]

#: Plain JSONL and text files are cut into splits of about this many bytes (at line ends).
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024
#: Rows of an in-memory or cached Hugging Face ``Dataset`` per split.
DEFAULT_SPLIT_ROWS = 50_000
#: Bytes shown of a raw row in errors and rejects.
RAW_SHOWN = 2000

_JSONL = (".jsonl", ".ndjson", ".json")
_TEXT = (".txt", ".text", ".md")
_PARQUET = (".parquet", ".pq")
_COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_BOM = b"\xef\xbb\xbf"
#: Bytes of one input row beyond which it is a row error, unread by any parser or
#: tokenizer (``convert`` derives a bound from ``max_len`` when it is given).
DEFAULT_MAX_ROW_BYTES = 256 * 1024 * 1024


class _LineInSplit:
    """``file:line`` of a line counted from a split's start; the file is read up to the
    split only if the text is asked for (an error or a reject), never on the hot path."""

    __slots__ = ("line", "source", "start")

    def __init__(self, source: FileSource, start: int, line: int) -> None:
        self.source, self.start, self.line = source, start, line

    def __str__(self) -> str:
        return f"{self.source.url}:{self.source._line_of(self.start) + self.line - 1}"


@dataclass(frozen=True)
class Row:
    """One input row: its value (a dict, or the text of a text file), or why it has none."""

    where: str | _LineInSplit
    value: Any = None
    error: str | None = None
    raw: str = ""


@dataclass(frozen=True)
class Split:
    """One unit of work: ``source`` rows ``[start, stop)`` in the source's own unit."""

    source: int
    start: int
    stop: int
    describe: str


class Source(abc.ABC):
    """Where rows come from. Picklable: sources travel to worker processes."""

    #: Rows longer than this are row errors (``convert`` sets it on every source).
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES

    @abc.abstractmethod
    def splits(self, number: int, split_bytes: int, split_rows: int) -> list[Split]:
        """This source's splits in order; ``number`` is the source's index in the inputs."""

    @abc.abstractmethod
    def rows(self, split: Split, columns: Sequence[str]) -> Iterator[Row]:
        """The rows of ``split``; ``columns`` are the fields the caller reads."""

    @abc.abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What identifies this source's content, for resuming an interrupted write."""


# -- files ----------------------------------------------------------------------------------
def _suffixes(path: str) -> tuple[str, str | None]:
    """The format suffix and compression of ``path`` (``.jsonl``, ``gzip`` for x.jsonl.gz)."""
    name = path.rsplit("/", 1)[-1].lower()
    root, ext = os.path.splitext(name)
    compression = _COMPRESSION.get(ext)
    if compression is not None:
        ext = os.path.splitext(root)[1]
    return ext, compression


def _format_of(path: str, forced: str | None) -> str:
    if forced is not None:
        return forced
    ext, _ = _suffixes(path)
    if ext in _JSONL:
        return "jsonl"
    if ext in _PARQUET:
        return "parquet"
    if ext in _TEXT:
        return "text"
    raise BadInputError(
        f"{path}: cannot tell the input format from its name; known endings are "
        f"{', '.join(_JSONL + _PARQUET + _TEXT)} (optionally .gz or .zst), or pass "
        "input_format='jsonl' | 'parquet' | 'text'"
    )


@dataclass
class FileSource(Source):
    """One file: JSONL (plain, .gz, .zst), Parquet, or a text file (one document, under
    the first field the caller reads, e.g. the seq preset's text field)."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    input_format: str | None = None
    size: int = -1
    modified: str = ""

    def __post_init__(self) -> None:
        self.format = _format_of(self.url, self.input_format)
        self.compression = _suffixes(self.url)[1]
        self._lines: dict[int, int] = {}

    def _open(self) -> IO[bytes]:
        import fsspec
        from fsspec.spec import AbstractBufferedFile

        handle: IO[bytes] = fsspec.open(self.url, "rb", **self.storage_options).open()
        if isinstance(handle, AbstractBufferedFile):
            # its readline takes no size, and a row's bytes are bounded by reading it so
            return io.BufferedReader(handle, 1 << 20)  # type: ignore[arg-type]
        return handle

    def _decompressed(self) -> IO[bytes]:
        raw = self._open()
        if self.compression is not None and not raw.read(1):
            raw.close()
            raise BadInputError(
                f"{self.url} is empty: a {self.compression} file holds at least a header"
            )
        if self.compression is not None:
            raw.seek(0)
        if self.compression == "gzip":
            return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
        if self.compression == "zstd":
            return io.BufferedReader(ZstdFrames(raw, self.url))
        return raw

    def _read_failed(self, error: BaseException, lines: int) -> BadInputError:
        """A decompression that failed (a cut or damaged file): the file, the rows read."""
        what = (
            "ends before its end-of-stream marker (the file is cut)"
            if isinstance(error, EOFError)
            else f"cannot be decompressed ({type(error).__name__}: {error})"
        )
        return BadInputError(
            f"{self.url} {what}; {lines} lines were read before it, and the conversion "
            "stops rather than write part of the file"
        )

    def fingerprint(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "format": self.format,
            "size": self.size,
            "modified": self.modified,
        }

    def splits(self, number: int, split_bytes: int, split_rows: int) -> list[Split]:
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                with self._open() as handle:
                    metadata = pq.ParquetFile(handle).metadata
            except (pa.ArrowException, OSError) as error:
                if isinstance(error, BadInputError):
                    raise
                raise BadInputError(
                    f"{self.url}: not a readable Parquet file ({type(error).__name__}: {error})"
                ) from error
            groups = metadata.num_row_groups
            return [
                Split(number, group, group + 1, f"{self.url} row group {group}")
                for group in range(groups)
            ]
        if self.format == "text" or self.compression is not None or self.size <= split_bytes:
            return [Split(number, 0, max(self.size, 0), self.url)]
        count = -(-self.size // split_bytes)
        bounds = [self.size * k // count for k in range(count + 1)]
        return [
            Split(number, a, b, f"{self.url} bytes {a}..{b}") for a, b in itertools.pairwise(bounds)
        ]

    def rows(self, split: Split, columns: Sequence[str]) -> Iterator[Row]:
        if self.format == "parquet":
            yield from self._parquet_rows(split, columns)
        elif self.format == "text":
            yield from self._text_rows(columns[0] if columns else "text")
        else:
            yield from self._jsonl_rows(split)

    # JSONL: a line belongs to the split in which it starts.
    def _jsonl_rows(self, split: Split) -> Iterator[Row]:
        bound = self.max_row_bytes
        with self._decompressed() as handle:
            position = split.start
            if self.compression is None and split.start > 0:
                handle.seek(split.start - 1)
                position = split.start - 1 + len(handle.readline())
            first = position
            number = 0
            limit = split.stop if self.compression is None else None
            while limit is None or position < limit:
                try:
                    line = handle.readline(bound + 1)
                    length = len(line)
                    if length > bound and not line.endswith(b"\n"):
                        length += _skip_line(handle)  # never held whole
                except Exception as error:  # a decompressor's own errors, of many classes
                    if self.compression is None or isinstance(error, BadInputError):
                        raise
                    raise self._read_failed(error, number) from error
                if not line:
                    break
                if position == 0 and line.startswith(_BOM):
                    line = line[len(_BOM) :]  # a UTF-8 byte order mark starts the file
                position += length
                number += 1
                if not line.strip():
                    continue
                where = f"{self.url}:{number}" if first == 0 else _LineInSplit(self, first, number)
                if length > bound:
                    shown = line[:RAW_SHOWN].decode("utf-8", "replace")
                    yield Row(where, error=f"the row is {length:,} bytes, over the bound of "
                              f"{bound:,} (max_row_bytes, --max-row-bytes)", raw=shown)  # fmt: skip
                    continue
                yield _parse_json_line(line, where)

    def _line_of(self, offset: int) -> int:
        """The 1-based line number of the line starting at byte ``offset`` (errors only)."""
        if offset in self._lines:
            return self._lines[offset]
        count = 1
        with self._open() as handle:
            remaining = offset
            while remaining > 0:
                block = handle.read(min(remaining, 1 << 20))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
        self._lines[offset] = count
        return count

    def _text_rows(self, field: str) -> Iterator[Row]:
        with self._decompressed() as handle:
            try:
                data = handle.read()
            except Exception as error:  # a decompressor's own errors, of many classes
                if self.compression is None or isinstance(error, BadInputError):
                    raise
                raise self._read_failed(error, 0) from error
        data = data.removeprefix(_BOM)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            yield Row(
                f"{self.url}:{line}",
                error=f"byte {error.start} is not valid UTF-8 ({error.reason})",
                raw=data[max(0, error.start - 40) : error.start + 40].decode("utf-8", "replace"),
            )
            return
        yield Row(f"{self.url}:1", {field: text}, raw=text[:RAW_SHOWN])

    def _parquet_rows(self, split: Split, columns: Sequence[str]) -> Iterator[Row]:
        import pyarrow as pa

        try:
            yield from self._parquet_batches(split, columns)
        except (pa.ArrowException, OSError) as error:
            if isinstance(error, BadInputError):
                raise
            raise BadInputError(
                f"{self.url}: not a readable Parquet file ({type(error).__name__}: {error})"
            ) from error

    def _parquet_batches(self, split: Split, columns: Sequence[str]) -> Iterator[Row]:
        import pyarrow.parquet as pq

        with self._open() as handle:
            parquet = pq.ParquetFile(handle)
            metadata = parquet.metadata
            row = sum(metadata.row_group(g).num_rows for g in range(split.start))
            present = set(parquet.schema_arrow.names)
            wanted = [c for c in columns if c in present]
            for batch in parquet.iter_batches(
                batch_size=4096, row_groups=[split.start], columns=wanted, use_threads=False
            ):
                for value in batch.to_pylist():
                    yield Row(f"{self.url} row {row}", value)
                    row += 1


def _parse_json_line(line: bytes, where: str | _LineInSplit) -> Row:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        shown = line[:RAW_SHOWN].decode("utf-8", "replace")
        return Row(where, error=f"byte {error.start} of the line is not valid UTF-8", raw=shown)
    try:
        value = json.loads(text)
    except ValueError as error:
        return Row(where, error=f"malformed JSON: {error}", raw=text[:RAW_SHOWN])
    except RecursionError:
        return Row(where, error="JSON nested too deeply to parse", raw=text[:RAW_SHOWN])
    if "\\u" in text and _has_lone_surrogate(value):
        return Row(
            where,
            error="a string holds a lone surrogate escape (such as \\ud800), which is not text",
            raw=text[:RAW_SHOWN],
        )
    if not isinstance(value, dict):
        return Row(
            where,
            error=f"a JSON object was expected, got {type(value).__name__}",
            raw=text[:RAW_SHOWN],
        )
    return Row(where, value, raw=text[:RAW_SHOWN])


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a string that is not valid Unicode text (JSON
    lets ``\\ud800`` through; a tokenizer fails on it far from the row)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _skip_line(handle: IO[bytes]) -> int:
    """Read past the rest of a line too long to keep; the bytes skipped."""
    skipped = 0
    while True:
        chunk = handle.readline(1 << 20)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


# -- Hugging Face datasets ------------------------------------------------------------------
@dataclass
class DatasetSource(Source):
    """A ``datasets.Dataset`` (split by row ranges) or ``IterableDataset`` (by its shards)."""

    dataset: Any
    name: str = "dataset"

    def _iterable(self) -> bool:
        import datasets

        return isinstance(self.dataset, datasets.IterableDataset)

    def fingerprint(self) -> dict[str, Any]:
        if self._iterable():
            return {"iterable": repr(self.dataset), "shards": int(self.dataset.num_shards)}
        return {
            "fingerprint": getattr(self.dataset, "_fingerprint", None),
            "rows": len(self.dataset),
        }

    def splits(self, number: int, split_bytes: int, split_rows: int) -> list[Split]:
        if self._iterable():
            shards = int(self.dataset.num_shards)
            return [Split(number, k, k + 1, f"{self.name} shard {k}") for k in range(shards)]
        rows = len(self.dataset)
        return [
            Split(number, a, min(rows, a + split_rows), f"{self.name} rows {a}..")
            for a in range(0, rows, split_rows)
        ]

    def rows(self, split: Split, columns: Sequence[str]) -> Iterator[Row]:
        if self._iterable():
            shard = self.dataset.shard(num_shards=int(self.dataset.num_shards), index=split.start)
            for number, value in enumerate(shard):
                yield Row(f"{self.name} shard {split.start} row {number}", value)
            return
        present = [c for c in columns if c in self.dataset.column_names]
        table = self.dataset.select_columns(present) if present else self.dataset
        for start in range(split.start, split.stop, 1024):
            stop = min(split.stop, start + 1024)
            batch = table[start:stop]
            names = list(batch)
            for offset in range(stop - start):
                yield Row(
                    f"{self.name} row {start + offset}",
                    {name: batch[name][offset] for name in names},
                )


# -- resolving what the user passed ---------------------------------------------------------
def _has_magic(path: str) -> bool:
    return any(char in path for char in "*?[")


def open_inputs(
    inputs: Any,
    storage_options: dict[str, Any] | None = None,
    input_format: str | None = None,
) -> list[Source]:
    """Sources for ``inputs``: paths, globs, directories, fsspec URLs or dataset objects.

    Globs and directories expand to their files in sorted order; the inputs keep the order
    given, and that order is the output's record order.
    """
    options = dict(storage_options or {})
    items = (
        [inputs] if isinstance(inputs, (str, os.PathLike)) or _is_dataset(inputs) else list(inputs)
    )
    if not items:
        raise BadInputError("no inputs given")
    sources: list[Source] = []
    for item in items:
        if _is_dataset(item):
            sources.append(DatasetSource(item, f"dataset {len(sources)}"))
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                "inputs are paths, URLs, globs or datasets.Dataset objects, got "
                f"{type(item).__name__}"
            )
        found = _expand(os.fspath(item), options)
        if not found:
            raise BadInputError(f"{os.fspath(item)}: no such file, directory or matching files")
        sources.extend(
            FileSource(url, options, input_format, size, modified) for url, size, modified in found
        )
    return sources


def _is_dataset(item: Any) -> bool:
    module = type(item).__module__ or ""
    return module.split(".")[0] == "datasets" and hasattr(item, "column_names")


def _expand(item: str, options: dict[str, Any]) -> list[tuple[str, int, str]]:
    """``(url, size, modified)`` of each file ``item`` names."""
    if "://" not in item:
        paths = sorted(globbing.glob(item)) if _has_magic(item) else [item]
        out = []
        for path in paths:
            if os.path.isdir(path):
                for root, _dirs, files in sorted(os.walk(path)):
                    for name in sorted(files):
                        full = os.path.join(root, name)
                        if _known(full):
                            out.append(full)
            elif os.path.exists(path):
                out.append(path)
        return [(p, os.path.getsize(p), str(os.path.getmtime(p))) for p in out]
    import fsspec

    fs, _, _ = fsspec.get_fs_token_paths(item, storage_options=options)
    protocol = item.split("://", 1)[0]
    stripped = fs._strip_protocol(item)
    if _has_magic(item):
        paths = sorted(fs.glob(stripped))
    elif fs.isdir(stripped):
        paths = sorted(p for p in fs.find(stripped) if _known(p))
    elif fs.exists(stripped):
        paths = [stripped]
    else:
        return []
    out = []
    for path in paths:
        info = fs.info(path)
        if info.get("type") == "directory":
            continue
        modified = info.get("ETag") or info.get("LastModified") or info.get("mtime") or ""
        out.append((f"{protocol}://{path}", int(info.get("size") or 0), str(modified)))
    return out


def _known(path: str) -> bool:
    ext, _ = _suffixes(path)
    return ext in _JSONL + _PARQUET + _TEXT
