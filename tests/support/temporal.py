"""Temporal datasets of millions of records, written in seconds for scale tests.

The real writer appends one record per call (tens of microseconds each); a scale test needs
10^7 records. ``BulkTemporalStorage`` appends many one-field records per call: its shard
encoder returns the rows of a whole batch at once (the group array's bytes and every
record's ``(first_row, end_row)``), and everything else (blocks, parts, the commit with its
streaming index writer) is the library's own path.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from rangestream import TemporalArrayStorage
from rangestream.storage.core.kind import ShardEncoder
from rangestream.storage.temporal.schema import RECORD_ROWS, TemporalSchema

#: The one field of a bulk record: a byte per frame, ``frame % 251``.
FIELD = "x"


class _BulkEncoder(ShardEncoder):
    def __init__(self, schema: TemporalSchema) -> None:
        self.array = schema.groups[0].array

    def encode(self, data: Any, lengths: Mapping[str, int]) -> Mapping[str, np.ndarray]:
        counts = np.asarray(data["counts"], dtype=np.int64)
        first = lengths[self.array]
        ends = first + np.cumsum(counts)
        rows = np.stack([ends - counts, ends], axis=1)
        values = (np.arange(first, int(ends[-1]), dtype=np.int64) % 251).astype(np.uint8)
        return {self.array: values, RECORD_ROWS: rows}


class BulkTemporalStorage(TemporalArrayStorage):
    """A temporal storage whose ``append(shard, {"counts": frames})`` appends one record per
    entry of ``frames``, each a field ``x`` (uint8) whose frame ``f`` of the shard holds
    ``f % 251`` (records back to back, no padding)."""

    def bind_record(self, data: Any) -> TemporalArrayStorage:
        if self._bound is not None:
            return self
        bound = copy.copy(self)
        bound._bound = TemporalSchema.from_record({FIELD: np.zeros(1, dtype=np.uint8)})
        return bound

    def shard_encoder(self) -> ShardEncoder:
        assert self._bound is not None
        return _BulkEncoder(self._bound)


def write_bulk(url: str, counts_per_shard: list[np.ndarray], **options: Any) -> None:
    """Write one shard per array of frame counts (shard ``k`` for entry ``k``)."""
    storage = BulkTemporalStorage(url, **options)
    with storage.sync_writer() as writer:
        for shard, counts in enumerate(counts_per_shard):
            writer.append(shard, {"counts": counts})


def expected_window(counts: np.ndarray, record: int, start: int, frames: int) -> np.ndarray:
    """The bytes ``write_bulk`` stored for a window of ``record`` of a one-shard dataset."""
    first = int(counts[:record].sum()) + start
    return (np.arange(first, first + frames, dtype=np.int64) % 251).astype(np.uint8)


#: The record index tests' dataset (``test_temporal_index.py``, ``..._frame_index.py``,
#: ``..._frame_counts.py``): records of 1..40 frames in three shards; 8 KiB index chunks
#: hold 512 records.
_RNG = np.random.default_rng(21)
COUNTS = [_RNG.integers(1, 41, size=n) for n in (1500, 700, 2100)]
ALL = np.concatenate(COUNTS)
PER_CHUNK = 512


def shard_of(record: int) -> tuple[int, int]:
    """(shard, first frame of the record in its shard) of a global record number."""
    bounds = np.cumsum([0, *(len(c) for c in COUNTS)])
    shard = int(np.searchsorted(bounds, record, side="right")) - 1
    local = record - int(bounds[shard])
    return shard, int(COUNTS[shard][:local].sum())


def window_truth(record: int, start: int, frames: int) -> np.ndarray:
    _shard, offset = shard_of(record)
    first = offset + start
    return (np.arange(first, first + frames) % 251).astype(np.uint8)


def small_cache(url: str, **options: Any) -> TemporalArrayStorage:
    """A storage whose index cache holds two inner chunks (1,024 records) of 4,300."""
    return TemporalArrayStorage(url, index_cache_bytes=2 * PER_CHUNK * 24, **options)
