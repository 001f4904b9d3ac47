"""Storage kinds: writers and readers over the Zarr v3 layout.

Where each part lives:

- ``core``: the lifecycle every kind shares (the ``Storage`` base, opening, readers,
  writing, the commit and appends, options, block uploads) and ``core.kind``, the
  ``StorageKind`` contract it holds every kind to;
- ``stream``, ``document``, ``temporal``: the kinds, each with its readers and the read
  programs of its opened version;
- ``maintenance``: gc, verify and summary, the tools the CLI runs over a stored dataset.
"""

from rangestream.storage.core.base import Storage
from rangestream.storage.core.writing import DatasetWriter, WriteSession
from rangestream.storage.document.storage import DocumentStorage
from rangestream.storage.stream.storage import StreamStorage
from rangestream.storage.stream.with_meta import StreamWithMetaStorage
from rangestream.storage.temporal import TemporalArrayStorage

__all__ = [
    "DatasetWriter",
    "DocumentStorage",
    "Storage",
    "StreamStorage",
    "StreamWithMetaStorage",
    "TemporalArrayStorage",
    "WriteSession",
]
