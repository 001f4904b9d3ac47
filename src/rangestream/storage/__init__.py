"""Storage kinds: writers and readers over the Zarr v3 layout."""

from rangestream.storage.base import Storage
from rangestream.storage.document import DocumentStorage
from rangestream.storage.stream import StreamStorage
from rangestream.storage.stream_with_meta import StreamWithMetaStorage
from rangestream.storage.temporal import TemporalArrayStorage
from rangestream.storage.writing import DatasetWriter, WriteSession

__all__ = [
    "DatasetWriter",
    "DocumentStorage",
    "Storage",
    "StreamStorage",
    "StreamWithMetaStorage",
    "TemporalArrayStorage",
    "WriteSession",
]
