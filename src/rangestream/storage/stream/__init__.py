"""Token streams: ``StreamStorage`` and ``StreamWithMetaStorage`` with their readers.

- ``storage``: the stream kind and its readers;
- ``windows``: the opened version's window reads (the local hot path);
- ``records``: record lookups through ``record_ends``, which windows build on;
- ``with_meta``: streams with per-segment metadata and their readers;
- ``with_meta_records``: records of a stream with metadata, checked and encoded as rows.
"""

from rangestream.storage.stream.storage import (
    AsyncStreamStorageReader,
    StreamStorage,
    StreamStorageReader,
)
from rangestream.storage.stream.with_meta import (
    AsyncStreamWithMetaStorageReader,
    StreamWithMetaStorage,
    StreamWithMetaStorageReader,
)

__all__ = [
    "AsyncStreamStorageReader",
    "AsyncStreamWithMetaStorageReader",
    "StreamStorage",
    "StreamStorageReader",
    "StreamWithMetaStorage",
    "StreamWithMetaStorageReader",
]
