"""rangestream: stream training data out of object storage.

Datasets are Zarr v3 groups of sharded arrays; readers fetch exactly the byte ranges a
window needs with bounded concurrent range requests.
"""

from rangestream.dataset import DocumentDataset, StreamDataset, TemporalRecords, train_test_split
from rangestream.errors import RangestreamError
from rangestream.formats import DocumentPickleFormat, RecordField, RecordFormat, StreamNumpyFormat
from rangestream.ingest import convert, write, write_records
from rangestream.io import IOStats, RetryPolicy, set_process_max_concurrency
from rangestream.storage import (
    DocumentStorage,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
    WriteSession,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The loader needs torch; importing it lazily keeps ``import rangestream`` light for
    # writers and readers that never touch a DataLoader.
    if name == "StatefulDataLoader":
        from rangestream.loader import StatefulDataLoader

        return StatefulDataLoader
    raise AttributeError(f"module 'rangestream' has no attribute {name!r}")


__all__ = [
    "DocumentDataset",
    "DocumentPickleFormat",
    "DocumentStorage",
    "IOStats",
    "RangestreamError",
    "RecordField",
    "RecordFormat",
    "RetryPolicy",
    "StatefulDataLoader",
    "StreamDataset",
    "StreamNumpyFormat",
    "StreamStorage",
    "StreamWithMetaStorage",
    "TemporalArrayStorage",
    "TemporalRecords",
    "WriteSession",
    "convert",
    "set_process_max_concurrency",
    "train_test_split",
    "write",
    "write_records",
]
