"""Object access: stores, byte requests, the range-reading core and per-process state."""

from rangestream.io.fsspec_store import FsspecStore
from rangestream.io.local import LocalStore
from rangestream.io.range_reader import RangeReader, set_process_max_concurrency
from rangestream.io.ranges import (
    ByteRequest,
    ObjectRequest,
    RangeRequest,
    SuffixRequest,
    coalesce,
)
from rangestream.io.retry import RetryPolicy
from rangestream.io.s3 import S3Store
from rangestream.io.stats import IOCounter, IOStats, process_io_stats
from rangestream.io.store import ObjectStore
from rangestream.io.stores import open_store

__all__ = [
    "ByteRequest",
    "FsspecStore",
    "IOCounter",
    "IOStats",
    "LocalStore",
    "ObjectRequest",
    "ObjectStore",
    "RangeReader",
    "RangeRequest",
    "RetryPolicy",
    "S3Store",
    "SuffixRequest",
    "coalesce",
    "open_store",
    "process_io_stats",
    "set_process_max_concurrency",
]
