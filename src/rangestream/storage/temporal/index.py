"""The record index of a temporal dataset, read by range: where each record's frames lie.

The commit writes three arrays under ``index/`` (``storage.temporal.write``):

- ``record_rows``: every record's ``(first_row, end_row)`` in its shard's group arrays, in
  global record order (16 bytes per record);
- ``frame_starts``: the global frame number at which every ``K``-th record starts
  (``K`` = rows of one inner chunk of ``record_rows``), and the total frames last: a
  cumulative index ``K`` times smaller, to find the record holding a global frame;
- ``frame_histogram``: ``(frames, records)`` for every distinct frame count, so samplers
  count the records or windows of any length without reading every record.

Nothing of size N is read at open. Opening reads only the root document; a record's
entry is read with the inner chunk of ``record_rows`` that holds it (``K`` records, one
range request) the first time a window needs it, checked as untrusted input and kept in a
cache bounded in bytes. While the whole index fits in the cache, the first read takes all
of it in one request instead, so small datasets read their index once, as before.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, MetadataError, OutOfRangeError, WindowError
from rangestream.layout.executors import Program
from rangestream.layout.manifest import Manifest
from rangestream.layout.pieces import RowRead, StoredArray
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

__all__ = ["DEFAULT_INDEX_CACHE_BYTES", "FrameCounts", "RecordIndex"]

_INT64 = np.dtype("<i8")
#: Bytes of record entries a process keeps (24 per record: first row, frames, shard part).
#: 4 MiB holds 174,762 records; past that, entries are read by range on demand.
DEFAULT_INDEX_CACHE_BYTES = 4 * 1024 * 1024
ENTRY_NBYTES = 24
#: Records read per request when a caller asks for many at once (``frame_counts[:]``).
_BULK_RECORDS = 1 << 20


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
        self.frame_starts_array = frame_starts
        self._histogram_array = histogram
        self.cache_bytes = cache_bytes
        self._max_chunks = max(1, cache_bytes // (self.chunk_rows * ENTRY_NBYTES))
        self.whole_fits = -(-self.count // self.chunk_rows) <= self._max_chunks
        #: Inner chunk number of ``record_rows`` -> its records' entries ``(n, 3)`` int64
        #: ``[first_row, frames, part]``, read only; oldest first (evicted first).
        self.chunks: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._frame_starts: np.ndarray | None = None
        self._whole_counts: tuple[np.ndarray, np.ndarray] | None = None
        self._histogram: tuple[np.ndarray, np.ndarray] | None = None

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
        read = yield from self._read_spans(spans)
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
            for chunk in order[-self._max_chunks :]:
                chunks.pop(chunk, None)
                chunks[chunk] = loaded[chunk]
            while len(chunks) > self._max_chunks:
                del chunks[next(iter(chunks))]

    def _read_spans(self, spans: Sequence[tuple[int, int]]) -> Program[list[np.ndarray]]:
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

    # -- frame counts without caching ---------------------------------------------------
    def counts(self, low: int, high: int) -> Program[np.ndarray]:
        """Frames of records ``[low, high)``, read in bounded pieces; cached only while the
        whole index fits in the cache (then it is read whole, once)."""
        if self.whole_fits and high > low:
            per_chunk = self.chunk_rows
            found = yield from self.load(range(low // per_chunk, (high - 1) // per_chunk + 1))
            entries = np.concatenate([found[c] for c in sorted(found)])
            base = (low // per_chunk) * per_chunk
            return entries[low - base : high - base, 1].copy()
        out = np.empty(max(0, high - low), dtype=np.int64)
        position = low
        while position < high:
            end = min(high, position + _BULK_RECORDS)
            first = position // self.chunk_rows
            last = (end - 1) // self.chunk_rows
            cached = [self.chunks.get(chunk) for chunk in range(first, last + 1)]
            if all(entry is not None for entry in cached):
                entries = np.concatenate(cached)  # type: ignore[arg-type]
                base = first * self.chunk_rows
                out[position - low : end - low] = entries[position - base : end - base, 1]
            else:
                (entries,) = yield from self._read_spans([(position, end)])
                out[position - low : end - low] = entries[:, 1]
            position = end
        return out

    def counts_of(self, records: np.ndarray) -> Program[np.ndarray]:
        """Frames of the records in ``records`` (any order, checked in range)."""
        if records.size and (int(records.min()) < 0 or int(records.max()) >= self.count):
            bad = records[(records < 0) | (records >= self.count)][0]
            raise OutOfRangeError(
                f"record {int(bad)} is outside the dataset's {self.count} records [0, {self.count})"
            )
        whole = yield from self._whole()
        if whole is not None:
            return whole[0][records]
        per_chunk = self.chunk_rows
        chunk_of = records // per_chunk
        chunks, inverse = np.unique(chunk_of, return_inverse=True)
        inverse = inverse.reshape(records.shape)
        within = records - chunk_of * per_chunk
        out = np.empty(records.shape, dtype=np.int64)
        listed = chunks.tolist()
        for start in range(0, len(listed), self._max_chunks):
            batch = listed[start : start + self._max_chunks]
            found = yield from self.load(batch)
            # one gather over the batch's chunks laid end to end
            columns = [found[chunk][:, 1] for chunk in batch]
            bases = np.zeros(len(batch), dtype=np.int64)
            bases[1:] = np.cumsum([len(column) for column in columns[:-1]])
            column = np.concatenate(columns)
            if len(batch) == len(listed):
                out[...] = column[bases[inverse] + within]
            else:
                mine = (inverse >= start) & (inverse < start + len(batch))
                out[mine] = column[bases[inverse[mine] - start] + within[mine]]
        return out

    def _whole(self) -> Program[tuple[np.ndarray, np.ndarray] | None]:
        """Every record's frame count and cumulative end, while the whole index fits in
        the cache (read once, in one request, and checked against ``frame_starts``); else
        ``None``: a draw then reads the chunks it touches."""
        if not self.whole_fits or not self.count:
            return None
        whole = self._whole_counts
        if whole is None:
            starts = yield from self.frame_starts()
            found = yield from self.load(range(-(-self.count // self.chunk_rows)))
            counts = np.concatenate([found[chunk][:, 1] for chunk in sorted(found)])
            ends = np.cumsum(counts)
            per_chunk = self.chunk_rows
            want = np.concatenate([[0], ends[per_chunk - 1 :: per_chunk], ends[-1:]])
            if len(want) > len(starts):  # the last chunk is full: its end is listed twice
                want = want[:-1]
            if not np.array_equal(want, starts):
                chunk = int(np.flatnonzero(want != starts)[0]) - 1
                low, high = chunk * per_chunk, min(self.count, (chunk + 1) * per_chunk)
                raise CorruptDataError(
                    f"{self.where}: index/frame_starts says records [{low}, {high}) hold "
                    f"{int(starts[chunk + 1] - starts[chunk])} frames, record_rows "
                    f"{int(want[chunk + 1] - want[chunk])}"
                )
            counts.flags.writeable = False
            ends.flags.writeable = False
            whole = self._whole_counts = (counts, ends)
        return whole

    # -- the cumulative index: frames to records ---------------------------------------------
    def frame_starts(self) -> Program[np.ndarray]:
        """``frame_starts[k]``: the global frame at which record ``k * chunk_rows`` starts;
        the last entry is the total. Read once (8 bytes per ``chunk_rows`` records) and kept.
        """
        starts = self._frame_starts
        if starts is not None:
            return starts
        entries = -(-self.count // self.chunk_rows) + 1
        array = self.frame_starts_array
        if array is None:  # written before the cumulative index: rebuilt from record_rows
            starts = np.zeros(entries, dtype=np.int64)
            for low in range(0, self.count, _BULK_RECORDS):
                high = min(self.count, low + _BULK_RECORDS)
                counts = yield from self.counts(low, high)
                sums = np.add.reduceat(counts, np.arange(0, len(counts), self.chunk_rows))
                first = low // self.chunk_rows
                starts[first + 1 : first + 1 + len(sums)] = sums
            starts = np.cumsum(starts)
        else:
            if array.length != entries:
                raise MetadataError(
                    f"{self.where}: index/frame_starts has {array.length} entries, "
                    f"{entries} expected for {self.count} records"
                )
            read = RowRead.whole(array, 0, entries)
            yield [read]
            starts = read.target.reshape(-1).view(_INT64).copy()
            if starts[0] != 0 or bool((np.diff(starts) < 0).any()):
                raise CorruptDataError(f"{self.where}: index/frame_starts is not cumulative")
        starts.flags.writeable = False
        self._frame_starts = starts
        return starts

    def locate_frames(self, positions: np.ndarray) -> Program[tuple[np.ndarray, np.ndarray]]:
        """``(records, starts)``: the record holding each global frame number, and the
        frame's number within it. Global frames number every record's frames in turn."""
        starts = yield from self.frame_starts()
        total = int(starts[-1])
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (int(positions.min()) < 0 or int(positions.max()) >= total):
            bad = positions[(positions < 0) | (positions >= total)][0]
            raise OutOfRangeError(
                f"frame {int(bad)} is outside the dataset's {total} frames [0, {total})"
            )
        flat = positions.reshape(-1)
        whole = yield from self._whole()
        if whole is not None:
            counts, ends = whole
            found = np.searchsorted(ends, flat, side="right")
            within = flat - (ends[found] - counts[found])
            return found.reshape(positions.shape), within.reshape(positions.shape)
        chunk_of = np.searchsorted(starts, flat, side="right") - 1
        records = np.empty(flat.shape, dtype=np.int64)
        within = np.empty(flat.shape, dtype=np.int64)
        chunks = np.unique(chunk_of).tolist()
        per_chunk = self.chunk_rows
        for start in range(0, len(chunks), self._max_chunks):
            batch = chunks[start : start + self._max_chunks]
            found = yield from self.load(batch)
            for chunk in batch:
                counts = found[chunk][:, 1]
                ends = int(starts[chunk]) + np.cumsum(counts)
                if int(ends[-1]) != int(starts[chunk + 1]):
                    raise CorruptDataError(
                        f"{self.where}: index/frame_starts says records "
                        f"[{chunk * per_chunk}, {chunk * per_chunk + len(counts)}) hold "
                        f"{int(starts[chunk + 1] - starts[chunk])} frames, record_rows "
                        f"{int(ends[-1] - starts[chunk])}"
                    )
                mask = chunk_of == chunk
                row = np.searchsorted(ends, flat[mask], side="right")
                records[mask] = chunk * per_chunk + row
                within[mask] = flat[mask] - (ends[row] - counts[row])
        return records.reshape(positions.shape), within.reshape(positions.shape)

    def histogram(self) -> Program[tuple[np.ndarray, np.ndarray]]:
        """``(frames, records)``: every distinct frame count, ascending, and how many
        records have it. Read once and kept."""
        found = self._histogram
        if found is not None:
            return found
        if self._histogram_array is None:  # written before the histogram: rebuilt
            values: dict[int, int] = {}
            for low in range(0, self.count, _BULK_RECORDS):
                counts = yield from self.counts(low, min(self.count, low + _BULK_RECORDS))
                for value, number in zip(*np.unique(counts, return_counts=True), strict=True):
                    values[int(value)] = values.get(int(value), 0) + int(number)
            keys = sorted(values)
            frames = np.asarray(keys, dtype=np.int64)
            records = np.asarray([values[k] for k in keys], dtype=np.int64)
        else:
            array = yield from self._histogram_array()
            read = RowRead.whole(array, 0, array.length)
            if array.length:
                yield [read]
                pairs = read.target.reshape(-1).view(_INT64).reshape(-1, 2)
            else:
                pairs = np.empty((0, 2), dtype=np.int64)
            frames, records = pairs[:, 0].copy(), pairs[:, 1].copy()
            if (
                (len(frames) and int(frames[0]) < 1)
                or bool((np.diff(frames) <= 0).any())
                or bool((records < 1).any())
                or int(records.sum()) != self.count
            ):
                raise CorruptDataError(
                    f"{self.where}: index/frame_histogram is not ascending distinct frame "
                    f"counts with positive record counts summing to {self.count} records"
                )
        frames.flags.writeable = False
        records.flags.writeable = False
        self._histogram = (frames, records)
        return self._histogram


class FrameCounts:
    """Every record's frame count, as a lazy read-only ``int64`` array-like.

    ``counts[i]``, ``counts[a:b]``, ``counts[array]``, ``len``, iteration and
    ``np.asarray(counts)`` read the record index by range as they need it: nothing of the
    dataset's size is read until asked for. Reading all of it (``np.asarray``,
    ``tolist``, iteration to the end) costs 16 bytes per record read.
    """

    dtype = np.dtype(np.int64)
    ndim = 1

    def __init__(self, index: RecordIndex, run: Callable[[Program[Any]], Any]) -> None:
        self._index = index
        self._run = run

    def __repr__(self) -> str:
        return f"FrameCounts({self._index.count} records)"

    def __len__(self) -> int:
        return self._index.count

    @property
    def shape(self) -> tuple[int]:
        return (self._index.count,)

    @property
    def size(self) -> int:
        return self._index.count

    def __getitem__(self, key: Any) -> Any:
        index = self._index
        if isinstance(key, slice):
            low, high, step = key.indices(index.count)
            if step == 1:
                return self._frozen(self._run(index.counts(low, max(low, high))))
            return self[np.arange(low, high, step, dtype=np.int64)]
        if isinstance(key, (list, tuple, np.ndarray)):
            records = np.asarray(key)
            if records.dtype == np.bool_:
                if records.shape != (index.count,):
                    raise IndexError(
                        f"boolean index of shape {records.shape} does not match "
                        f"{index.count} records"
                    )
                records = np.flatnonzero(records)
            elif records.dtype.kind not in "iu":
                raise TypeError(f"records must be integers, got dtype {records.dtype}")
            records = records.astype(np.int64)
            records = np.where(records < 0, records + index.count, records)
            return self._frozen(self._run(index.counts_of(records)))
        record = index.check_record(key)
        ((_first, frames, _part),) = self._run(index.entries([record]))
        return frames

    @staticmethod
    def _frozen(array: np.ndarray) -> np.ndarray:
        array.flags.writeable = False
        return array

    def __iter__(self) -> Iterator[int]:
        for low in range(0, self._index.count, _BULK_RECORDS):
            high = min(self._index.count, low + _BULK_RECORDS)
            yield from self._run(self._index.counts(low, high)).tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        counts = self[:]
        return counts if dtype is None else counts.astype(dtype, copy=False)

    def tolist(self) -> list[int]:
        return self[:].tolist()  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> Any:
        return np.asarray(self) == other

    __hash__ = None  # type: ignore[assignment]
