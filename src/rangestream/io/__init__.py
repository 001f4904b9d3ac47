"""Object access: stores, byte requests and the range-reading core."""

from rangestream.io.range_reader import (
    IOStats,
    RangeReader,
    ReadProgram,
    process_io_stats,
    set_process_max_concurrency,
)
from rangestream.io.ranges import (
    ByteRequest,
    ObjectRequest,
    RangeRequest,
    SuffixRequest,
    coalesce,
)
from rangestream.io.retry import RetryPolicy
from rangestream.io.store import FsspecStore, LocalStore, ObjectStore, open_store

__all__ = [
    "ByteRequest",
    "FsspecStore",
    "IOStats",
    "LocalStore",
    "ObjectRequest",
    "ObjectStore",
    "RangeReader",
    "RangeRequest",
    "ReadProgram",
    "RetryPolicy",
    "SuffixRequest",
    "coalesce",
    "open_store",
    "process_io_stats",
    "set_process_max_concurrency",
]
