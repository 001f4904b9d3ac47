"""Temporal array records: schema, writing, the record index and window reads."""

from rangestream.storage.temporal.readers import AsyncTemporalReader, TemporalReader
from rangestream.storage.temporal.storage import (
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_TEMPORAL_BLOCK_BYTES,
    DEFAULT_TEMPORAL_CHUNK_BYTES,
    TemporalArrayStorage,
)

__all__ = [
    "DEFAULT_CHUNK_FRAMES",
    "DEFAULT_TEMPORAL_BLOCK_BYTES",
    "DEFAULT_TEMPORAL_CHUNK_BYTES",
    "AsyncTemporalReader",
    "TemporalArrayStorage",
    "TemporalReader",
]
