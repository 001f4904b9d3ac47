"""Documents of bytes: ``DocumentStorage`` and its readers.

- ``storage``: the document kind and its readers;
- ``reads``: the opened version's read programs (spans, bytes, some keys);
- ``offset_chunks``: the compact cache of document offsets.
"""

from rangestream.storage.document.storage import (
    AsyncDocumentStorageReader,
    DocumentStorage,
    DocumentStorageReader,
)

__all__ = ["AsyncDocumentStorageReader", "DocumentStorage", "DocumentStorageReader"]
