"""rangestream: stream training data out of object storage.

Datasets are Zarr v3 groups of sharded arrays; readers fetch exactly the byte ranges a
window needs with bounded concurrent range requests.
"""

from rangestream.dataset import DocumentDataset, StreamDataset
from rangestream.errors import RangestreamError
from rangestream.formats import DocumentPickleFormat, StreamNumpyFormat
from rangestream.io import IOStats, RetryPolicy, set_process_max_concurrency
from rangestream.storage import (
    DocumentStorage,
    StreamStorage,
    StreamWithMetaStorage,
    WriteSession,
)

__version__ = "0.1.0"

__all__ = [
    "DocumentDataset",
    "DocumentPickleFormat",
    "DocumentStorage",
    "IOStats",
    "RangestreamError",
    "RetryPolicy",
    "StreamDataset",
    "StreamNumpyFormat",
    "StreamStorage",
    "StreamWithMetaStorage",
    "WriteSession",
    "set_process_max_concurrency",
]
