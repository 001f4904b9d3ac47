"""Questions of frames rather than records, answered from a temporal dataset's record index.

A sampler asks how many frames many records hold, which record holds a global frame, and
how many records have each frame count. The record index (``storage.temporal.index``)
answers for one record at a time from its cached entries; these questions span the
dataset, so they are answered here in bounded pieces, from the two small arrays the commit
derives for them (``index/frame_starts``, ``index/frame_histogram``), or rebuilt from the
entries for datasets written before those arrays existed. What is read once (the
cumulative index, the histogram, the whole counts while the index fits the cache) is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from rangestream.errors import CorruptDataError, MetadataError, OutOfRangeError
from rangestream.layout.executors import Program
from rangestream.layout.pieces import RowRead, StoredArray

__all__ = ["BULK_RECORDS", "FrameIndex", "RecordEntries"]

_INT64 = np.dtype("<i8")
#: Records read per request when a caller asks for many at once (``frame_counts[:]``).
BULK_RECORDS = 1 << 20


class RecordEntries(Protocol):
    """What frame questions read of a record index (``storage.temporal.index.RecordIndex``,
    which builds its ``FrameIndex`` over itself): its size, its cache, its reads."""

    #: Records in the dataset.
    count: int
    #: Records per inner chunk of ``index/record_rows`` (one range request reads a chunk).
    chunk_rows: int
    #: Chunks the cache holds at most (the bound on one batch of reads).
    max_chunks: int
    #: Whether the whole index fits in the cache (then it is read whole, once).
    whole_fits: bool
    #: Cached entries by chunk: ``(first_row, frames, part)`` per record.
    chunks: dict[int, np.ndarray]
    #: The dataset's URL, for error messages.
    where: str

    def load(self, chunks: Sequence[int]) -> Program[dict[int, np.ndarray]]:
        """The entries of inner chunks ``chunks``, read if not cached."""
        ...

    def read_spans(self, spans: Sequence[tuple[int, int]]) -> Program[list[np.ndarray]]:
        """Entries of records ``[low, high)`` for each span, read in one step (uncached)."""
        ...


class FrameIndex:
    """Frame counts, the cumulative index and the histogram of one record index.

    Parameters
    ----------
    index
        The record index whose entries (and cache) answer per-record questions.
    frame_starts
        The stored cumulative index (``None`` for datasets written before it existed:
        it is then rebuilt from the record index).
    histogram
        A program giving the stored histogram array (its length is in its own metadata),
        or ``None`` for datasets written before it (rebuilt from the record index).
    """

    def __init__(
        self,
        index: RecordEntries,
        frame_starts: StoredArray | None,
        histogram: Callable[[], Program[StoredArray]] | None,
    ) -> None:
        self.index = index
        self.frame_starts_array = frame_starts
        self._histogram_array = histogram
        self._frame_starts: np.ndarray | None = None
        self._whole_counts: tuple[np.ndarray, np.ndarray] | None = None
        self._histogram: tuple[np.ndarray, np.ndarray] | None = None

    def counts(self, low: int, high: int) -> Program[np.ndarray]:
        """Frames of records ``[low, high)``, read in bounded pieces; cached only while the
        whole index fits in the cache (then it is read whole, once)."""
        index = self.index
        if index.whole_fits and high > low:
            per_chunk = index.chunk_rows
            found = yield from index.load(range(low // per_chunk, (high - 1) // per_chunk + 1))
            entries = np.concatenate([found[c] for c in sorted(found)])
            base = (low // per_chunk) * per_chunk
            return entries[low - base : high - base, 1].copy()
        out = np.empty(max(0, high - low), dtype=np.int64)
        position = low
        while position < high:
            end = min(high, position + BULK_RECORDS)
            first = position // index.chunk_rows
            last = (end - 1) // index.chunk_rows
            cached = [index.chunks.get(chunk) for chunk in range(first, last + 1)]
            if all(entry is not None for entry in cached):
                entries = np.concatenate(cached)  # type: ignore[arg-type]
                base = first * index.chunk_rows
                out[position - low : end - low] = entries[position - base : end - base, 1]
            else:
                (entries,) = yield from index.read_spans([(position, end)])
                out[position - low : end - low] = entries[:, 1]
            position = end
        return out

    def counts_of(self, records: np.ndarray) -> Program[np.ndarray]:
        """Frames of the records in ``records`` (any order, checked in range)."""
        index = self.index
        count = index.count
        if records.size and (int(records.min()) < 0 or int(records.max()) >= count):
            bad = records[(records < 0) | (records >= count)][0]
            raise OutOfRangeError(
                f"record {int(bad)} is outside the dataset's {count} records [0, {count})"
            )
        whole = yield from self._whole()
        if whole is not None:
            return whole[0][records]
        per_chunk = index.chunk_rows
        chunk_of = records // per_chunk
        chunks, inverse = np.unique(chunk_of, return_inverse=True)
        inverse = inverse.reshape(records.shape)
        within = records - chunk_of * per_chunk
        out = np.empty(records.shape, dtype=np.int64)
        listed = chunks.tolist()
        for start in range(0, len(listed), index.max_chunks):
            batch = listed[start : start + index.max_chunks]
            found = yield from index.load(batch)
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
        index = self.index
        if not index.whole_fits or not index.count:
            return None
        whole = self._whole_counts
        if whole is None:
            starts = yield from self.frame_starts()
            found = yield from index.load(range(-(-index.count // index.chunk_rows)))
            counts = np.concatenate([found[chunk][:, 1] for chunk in sorted(found)])
            ends = np.cumsum(counts)
            per_chunk = index.chunk_rows
            want = np.concatenate([[0], ends[per_chunk - 1 :: per_chunk], ends[-1:]])
            if len(want) > len(starts):  # the last chunk is full: its end is listed twice
                want = want[:-1]
            if not np.array_equal(want, starts):
                chunk = int(np.flatnonzero(want != starts)[0]) - 1
                low, high = chunk * per_chunk, min(index.count, (chunk + 1) * per_chunk)
                raise CorruptDataError(
                    f"{index.where}: index/frame_starts says records [{low}, {high}) hold "
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
        index = self.index
        starts = self._frame_starts
        if starts is not None:
            return starts
        entries = -(-index.count // index.chunk_rows) + 1
        array = self.frame_starts_array
        if array is None:  # written before the cumulative index: rebuilt from record_rows
            starts = np.zeros(entries, dtype=np.int64)
            for low in range(0, index.count, BULK_RECORDS):
                high = min(index.count, low + BULK_RECORDS)
                counts = yield from self.counts(low, high)
                sums = np.add.reduceat(counts, np.arange(0, len(counts), index.chunk_rows))
                first = low // index.chunk_rows
                starts[first + 1 : first + 1 + len(sums)] = sums
            starts = np.cumsum(starts)
        else:
            if array.length != entries:
                raise MetadataError(
                    f"{index.where}: index/frame_starts has {array.length} entries, "
                    f"{entries} expected for {index.count} records"
                )
            read = RowRead.whole(array, 0, entries)
            yield [read]
            starts = read.target.reshape(-1).view(_INT64).copy()
            if starts[0] != 0 or bool((np.diff(starts) < 0).any()):
                raise CorruptDataError(f"{index.where}: index/frame_starts is not cumulative")
        starts.flags.writeable = False
        self._frame_starts = starts
        return starts

    def locate_frames(self, positions: np.ndarray) -> Program[tuple[np.ndarray, np.ndarray]]:
        """``(records, starts)``: the record holding each global frame number, and the
        frame's number within it. Global frames number every record's frames in turn."""
        index = self.index
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
        per_chunk = index.chunk_rows
        for start in range(0, len(chunks), index.max_chunks):
            batch = chunks[start : start + index.max_chunks]
            found = yield from index.load(batch)
            for chunk in batch:
                counts = found[chunk][:, 1]
                ends = int(starts[chunk]) + np.cumsum(counts)
                if int(ends[-1]) != int(starts[chunk + 1]):
                    raise CorruptDataError(
                        f"{index.where}: index/frame_starts says records "
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
        index = self.index
        found = self._histogram
        if found is not None:
            return found
        if self._histogram_array is None:  # written before the histogram: rebuilt
            values: dict[int, int] = {}
            for low in range(0, index.count, BULK_RECORDS):
                counts = yield from self.counts(low, min(index.count, low + BULK_RECORDS))
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
                or int(records.sum()) != index.count
            ):
                raise CorruptDataError(
                    f"{index.where}: index/frame_histogram is not ascending distinct frame "
                    f"counts with positive record counts summing to {index.count} records"
                )
        frames.flags.writeable = False
        records.flags.writeable = False
        self._histogram = (frames, records)
        return self._histogram
