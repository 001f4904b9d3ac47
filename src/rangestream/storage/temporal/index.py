"""The record index of a temporal dataset: each record's shard, first row and frame count.

The commit gathers every shard's ``record_rows`` (first and end row of each record in its
shard's group arrays) into one array, ``index/record_rows``; opening reads it and checks it
here against the manifest, as untrusted input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.arguments import integer
from rangestream.errors import CorruptDataError, OutOfRangeError, WindowError
from rangestream.layout.manifest import Manifest
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

__all__ = ["RecordIndex"]


class RecordIndex:
    """Every record's frames, shard position and first row, checked against the manifest.

    Parameters
    ----------
    manifest, schema
        What the root document says.
    rows
        Every record's ``(first_row, end_row)``, shard by shard (untrusted).
    where
        The index's URL, for error messages.
    """

    def __init__(
        self, manifest: Manifest, schema: TemporalSchema, rows: np.ndarray, where: str
    ) -> None:
        self.schema = schema
        records_per_part = manifest.lengths[RECORD_ROWS]
        total = int(records_per_part.sum())
        if rows.shape != (total, 2):
            raise CorruptDataError(
                f"{where}: the record index holds {len(rows)} records, the manifest {total}"
            )
        firsts, ends = rows[:, 0], rows[:, 1]
        counts = ends - firsts
        if total and int(counts.min()) <= 0:
            bad = int(np.flatnonzero(counts <= 0)[0])
            raise CorruptDataError(f"{where}: record {bad} has {int(counts[bad])} frames")
        # within a shard, records start at or after the previous one's end, the first at or
        # after row 0; the last ends at the length every group array of the shard has
        part_starts = np.cumsum(records_per_part) - records_per_part
        previous = np.empty(total, dtype=np.int64)
        if total:
            previous[1:] = ends[:-1]
            previous[part_starts[records_per_part > 0]] = 0
        if total and bool((firsts < previous).any()):
            bad = int(np.flatnonzero(firsts < previous)[0])
            raise CorruptDataError(
                f"{where}: record {bad} starts at row {int(firsts[bad])}, before row "
                f"{int(previous[bad])} where the record before it (or the shard) ends"
            )
        part_rows = np.zeros(len(records_per_part), dtype=np.int64)
        nonempty = records_per_part > 0
        part_rows[nonempty] = ends[part_starts[nonempty] + records_per_part[nonempty] - 1]
        for group in schema.groups:
            if not np.array_equal(manifest.lengths[group.array], part_rows):
                raise CorruptDataError(
                    f"{where}: array {group.array!r} has per-shard lengths "
                    f"{manifest.lengths[group.array].tolist()}, the record index says "
                    f"{part_rows.tolist()}"
                )
        counts.flags.writeable = False
        self.frame_counts = counts
        self.record_start = np.ascontiguousarray(firsts)
        self.record_part = np.repeat(np.arange(len(records_per_part)), records_per_part)

    def __len__(self) -> int:
        return len(self.frame_counts)

    def check_record(self, record: Any) -> int:
        """``record`` as an index in ``[0, len)``; negative values count from the end."""
        record = integer(record, "record")
        count = len(self.frame_counts)
        if record < 0:
            record += count
        if not 0 <= record < count:
            shown = record if record >= 0 else record - count
            raise OutOfRangeError(
                f"record {shown} is outside the dataset's {count} records [0, {count})"
            )
        return record

    def check_window(self, record: Any, start: Any, frames: Any) -> tuple[int, int, int]:
        if type(record) is not int or type(start) is not int or type(frames) is not int:
            record = integer(record, "record")
            start = integer(start, "start")
            frames = integer(frames, "frames")
        if not 0 <= record < len(self.frame_counts):
            raise OutOfRangeError(
                f"record {record} is outside the dataset's {len(self.frame_counts)} records "
                f"[0, {len(self.frame_counts)})"
            )
        count = self.frame_counts.item(record)
        if frames <= 0:
            raise WindowError(f"frames must be >= 1, got {frames} (record {record})")
        if start < 0 or start + frames > count:
            raise WindowError(
                f"window [{start}, {start + frames}) is outside record {record}'s {count} "
                f"frames [0, {count}); windows are neither padded nor truncated"
            )
        return record, start, frames
