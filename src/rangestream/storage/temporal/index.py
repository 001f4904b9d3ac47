"""The record index of a temporal dataset, read by range: where each record's frames lie.

The commit writes three arrays under ``index/`` (``storage.temporal.write``):

- ``record_rows``: every record's ``(first_row, end_row)`` in its shard's group arrays, in
  global record order (16 bytes per record);
- ``frame_starts``: the global frame number at which every ``K``-th record starts
  (``K`` = rows of one inner chunk of ``record_rows``), and the total frames last: a
  cumulative index ``K`` times smaller, to find the record holding a global frame;
- ``frame_histogram``: ``(frames, records)`` for every distinct frame count, so samplers
  count the records or windows of any length without reading every record.

Nothing of size N is read at open. Opening reads the root document and, when the whole
record index is small (``stored.OPEN_INDEX_BYTES``, 1 MiB stored) and fits the cache,
the index in one request, so no window of a small dataset ever waits on an index request.
Otherwise a record's entry is read with the inner chunk of ``record_rows`` that holds it
(``K`` records, one range request) the first time a window needs it, checked as untrusted
input and kept in a cache bounded in bytes. While the whole index fits in the cache, the
first read takes all of it in one request instead.

This module reads, checks and caches the entries; the questions asked of frames rather
than records (counts of many records, the cumulative index, the histogram) are
``storage.temporal.frame_index``'s, answered from these entries.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, OutOfRangeError, WindowError
from rangestream.layout.executors import Program
from rangestream.layout.manifest import Manifest
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.storage.temporal.frame_index import FrameIndex
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

__all__ = ["DEFAULT_INDEX_CACHE_BYTES", "RecordIndex"]

_INT64 = np.dtype("<i8")
#: Bytes of record entries a process keeps (24 per record: first row, frames, shard part).
#: 4 MiB holds 174,762 records; past that, entries are read by range on demand.
DEFAULT_INDEX_CACHE_BYTES = 4 * 1024 * 1024
ENTRY_NBYTES = 24


class RecordIndex:
    """Records' entries ``(first_row, frames, part)`` read by range, checked, and cached.

    Parameters
    ----------
    manifest, schema
        What the root document says (per-shard record counts and group lengths).
    rows
        ``index/record_rows`` as stored (``None`` for a dataset without records).
    frame_starts
        The stored cumulative index (``None`` for datasets written before it existed:
        samplers then rebuild it from ``rows``).
    histogram
        A program giving the stored histogram array (its length is in its own metadata),
        or ``None`` for datasets written before it (rebuilt from ``rows`` when asked for).
    where
        The dataset's root, for error messages.
    cache_bytes
        Bound on the entries kept (at least one inner chunk's worth is always kept).
    """

    def __init__(
        self,
        manifest: Manifest,
        schema: TemporalSchema,
        rows: StoredArray | None,
        frame_starts: StoredArray | None,
        histogram: Callable[[], Program[StoredArray]] | None,
        where: str,
        cache_bytes: int = DEFAULT_INDEX_CACHE_BYTES,
    ) -> None:
        self.schema = schema
        self.where = where
        records_per_part = manifest.lengths[RECORD_ROWS]
        self.count = int(records_per_part.sum())
        #: ``part_bounds[p]``: global number of part ``p``'s first record.
        self.part_bounds = np.concatenate([[0], np.cumsum(records_per_part)]).astype(np.int64)
        groups = schema.groups
        self.part_rows = (
            manifest.lengths[groups[0].array].astype(np.int64)
            if groups
            else np.zeros(len(records_per_part), dtype=np.int64)
        )
        for group in groups[1:]:
            if not np.array_equal(manifest.lengths[group.array], self.part_rows):
                raise CorruptDataError(
                    f"{where}: array {group.array!r} has per-shard lengths "
                    f"{manifest.lengths[group.array].tolist()}, array {groups[0].array!r} "
                    f"{self.part_rows.tolist()}; every group array of a shard has one length"
                )
        empty = (records_per_part == 0) & (self.part_rows != 0)
        if empty.any():
            part = int(np.flatnonzero(empty)[0])
            raise CorruptDataError(
                f"{where}: shard {int(manifest.shard_ids[part])} has no records but "
                f"{int(self.part_rows[part])} rows"
            )
        if rows is not None and rows.length != self.count:
            raise CorruptDataError(
                f"{where}: the record index holds {rows.length} records, the manifest {self.count}"
            )
        self.rows = rows
        self.chunk_rows = rows.layout.chunk_rows if rows is not None else 1
        self.cache_bytes = cache_bytes
        #: Inner chunks of entries the cache holds.
        self.max_chunks = max(1, cache_bytes // (self.chunk_rows * ENTRY_NBYTES))
        self.whole_fits = -(-self.count // self.chunk_rows) <= self.max_chunks
        #: Inner chunk number of ``record_rows`` -> its records' entries ``(n, 3)`` int64
        #: ``[first_row, frames, part]``, read only; oldest first (evicted first).
        self.chunks: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        #: The questions of frames: counts, the cumulative index, the histogram.
        self.frames = FrameIndex(self, frame_starts, histogram)

    def __len__(self) -> int:
        return self.count

    @property
    def cached_nbytes(self) -> int:
        """Bytes of record entries held now."""
        return sum(entry.nbytes for entry in list(self.chunks.values()))

    # -- checks without I/O -------------------------------------------------------------
    def check_record(self, record: Any) -> int:
        """``record`` as an index in ``[0, len)``; negative values count from the end."""
        record = integer(record, "record")
        count = self.count
        if record < 0:
            record += count
        if not 0 <= record < count:
            shown = record if record >= 0 else record - count
            raise OutOfRangeError(
                f"record {shown} is outside the dataset's {count} records [0, {count})"
            )
        return record

    def check_arguments(self, record: Any, start: Any, frames: Any) -> tuple[int, int, int]:
        """The window's arguments as ints, the record inside the dataset, ``frames >= 1``."""
        if type(record) is not int or type(start) is not int or type(frames) is not int:
            record = integer(record, "record")
            start = integer(start, "start")
            frames = integer(frames, "frames")
        if not 0 <= record < self.count:
            raise OutOfRangeError(
                f"record {record} is outside the dataset's {self.count} records [0, {self.count})"
            )
        if frames <= 0:
            raise WindowError(f"frames must be >= 1, got {frames} (record {record})")
        if start < 0:
            raise WindowError(
                f"window [{start}, {start + frames}) starts before record {record}'s first "
                "frame; windows are neither padded nor truncated"
            )
        return record, start, frames

    @staticmethod
    def check_window(record: int, start: int, frames: int, count: int) -> None:
        if start + frames > count:
            raise WindowError(
                f"window [{start}, {start + frames}) is outside record {record}'s {count} "
                f"frames [0, {count}); windows are neither padded nor truncated"
            )

    # -- entries ------------------------------------------------------------------------
    def cached(self, record: int) -> tuple[int, int, int] | None:
        """``(first_row, frames, part)`` of ``record`` if its chunk is cached (no I/O)."""
        chunk, row = divmod(record, self.chunk_rows)
        entry = self.chunks.get(chunk)
        if entry is None:
            return None
        return entry.item(row, 0), entry.item(row, 1), entry.item(row, 2)

    def entries(self, records: Sequence[int]) -> Program[list[tuple[int, int, int]]]:
        """``(first_row, frames, part)`` of each record (checked to be in range): cached
        chunks are used as they are, missing ones are read in one step and cached."""
        per_chunk = self.chunk_rows
        wanted = sorted({record // per_chunk for record in records})
        found = yield from self.load(wanted)
        out = []
        for record in records:
            entry = found[record // per_chunk]
            row = record % per_chunk
            out.append((entry.item(row, 0), entry.item(row, 1), entry.item(row, 2)))
        return out

    def load(self, chunks: Sequence[int]) -> Program[dict[int, np.ndarray]]:
        """The entries of inner chunks ``chunks`` of ``record_rows``, read if not cached.

        While the whole index fits in the cache, a miss reads all of it in one request.
        More chunks than the cache holds are read and returned, not all kept.
        """
        found: dict[int, np.ndarray] = {}
        missing = []
        for chunk in chunks:
            entry = self.chunks.get(chunk)
            if entry is None:
                missing.append(chunk)
            else:
                found[chunk] = entry
        if not missing:
            return found
        per_chunk = self.chunk_rows
        if self.whole_fits:
            spans = [(0, self.count)]
        else:
            spans = [(c * per_chunk, min(self.count, (c + 1) * per_chunk)) for c in missing]
        read = yield from self.read_spans(spans)
        loaded: dict[int, np.ndarray] = {}
        for (low, _high), entry in zip(spans, read, strict=True):
            for offset in range(0, len(entry), per_chunk):
                piece = entry[offset : offset + per_chunk]
                piece.flags.writeable = False
                loaded[(low + offset) // per_chunk] = piece
        self._keep(loaded, first=missing)
        found.update({chunk: loaded[chunk] for chunk in missing})
        return found

    def _keep(self, loaded: dict[int, np.ndarray], first: Sequence[int]) -> None:
        """Cache ``loaded`` (the chunks in ``first`` last, so they are evicted last)."""
        wanted = set(first)
        order = [c for c in loaded if c not in wanted] + [c for c in first if c in loaded]
        with self._lock:
            chunks = self.chunks
            for chunk in order[-self.max_chunks :]:
                chunks.pop(chunk, None)
                chunks[chunk] = loaded[chunk]
            while len(chunks) > self.max_chunks:
                del chunks[next(iter(chunks))]

    def read_spans(self, spans: Sequence[tuple[int, int]]) -> Program[list[np.ndarray]]:
        """Entries of records ``[low, high)`` for each span, read in one step and checked."""
        assert self.rows is not None
        reads = [RowRead.whole(self.rows, low, high) for low, high in spans]
        yield reads
        # every span checked in one pass (a draw reads a few scattered chunks per step)
        rows = [read.target.reshape(-1).view(_INT64).reshape(-1, 2) for read in reads]
        if len(rows) == 1:
            return [self._checked(spans[0][0], rows[0])]
        records = np.concatenate([np.arange(low, high, dtype=np.int64) for low, high in spans])
        entries = self._checked(spans[0][0], np.concatenate(rows), records)
        bounds = np.cumsum([0, *(high - low for low, high in spans)])
        return [entries[a:b] for a, b in itertools.pairwise(bounds.tolist())]

    def _checked(self, low: int, rows: np.ndarray, records: np.ndarray | None = None) -> np.ndarray:
        """Entries of records ``low, low + 1, ...`` (or ``records``) from their stored
        ``rows`` (untrusted)."""
        parts = self.check_rows(low, rows, records=records)
        return np.stack([rows[:, 0], rows[:, 1] - rows[:, 0], parts], axis=1).astype(np.int64)

    def check_rows(
        self,
        low: int,
        rows: np.ndarray,
        previous_end: int | None = None,
        *,
        records: np.ndarray | None = None,
    ) -> np.ndarray:
        """Check the stored ``(first_row, end_row)`` of records ``low, low + 1, ...``
        (untrusted) and return their parts. ``previous_end``: where the record before
        ``low`` ends, if it is in the same shard (``0`` at a shard's first record).
        ``records``: the rows' record numbers, ascending, when they are not consecutive
        (rows of consecutive records only are checked against each other)."""
        where = self.where
        consecutive = records is None
        if records is None:
            records = np.arange(low, low + len(rows), dtype=np.int64)
        parts = np.searchsorted(self.part_bounds, records, side="right") - 1
        firsts, ends = rows[:, 0], rows[:, 1]
        if previous_end is not None and len(rows) and int(firsts[0]) < previous_end:
            raise CorruptDataError(
                f"{where}: record {low} starts at row {int(firsts[0])}, before row "
                f"{previous_end} where the record before it (or the shard) ends"
            )
        counts = ends - firsts
        if len(rows) and int(counts.min()) <= 0:
            bad = int(np.flatnonzero(counts <= 0)[0])
            raise CorruptDataError(
                f"{where}: record {int(records[bad])} has {int(counts[bad])} frames in the "
                "record index"
            )
        if len(rows) and int(firsts.min()) < 0:
            bad = int(np.flatnonzero(firsts < 0)[0])
            raise CorruptDataError(
                f"{where}: record {int(records[bad])} starts at row {int(firsts[bad])}"
            )
        limits = self.part_rows[parts]
        if bool((ends > limits).any()):
            bad = int(np.flatnonzero(ends > limits)[0])
            raise CorruptDataError(
                f"{where}: record {int(records[bad])} ends at row {int(ends[bad])}, past the "
                f"{int(limits[bad])} rows of its shard's group arrays"
            )
        # within a shard, a record starts at or after the end of the one before it
        same = parts[1:] == parts[:-1]
        if not consecutive:
            same &= records[1:] == records[:-1] + 1
        overlap = same & (firsts[1:] < ends[:-1])
        if bool(overlap.any()):
            bad = int(np.flatnonzero(overlap)[0]) + 1
            raise CorruptDataError(
                f"{where}: record {int(records[bad])} starts at row {int(firsts[bad])}, before row "
                f"{int(ends[bad - 1])} where the record before it ends"
            )
        return parts
