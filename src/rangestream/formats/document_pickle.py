"""``DocumentPickleFormat``: any picklable Python object per document.

Unpickling runs code chosen by whoever wrote the bytes: use this format only for data you
trust. Nothing else in rangestream (metadata, indexes) is ever pickled.
"""

from __future__ import annotations

import pickle
from typing import Any, Generic, TypeVar

from rangestream.types import DocumentStorageFormat, StorageBufferTypes

DocumentT = TypeVar("DocumentT")


class DocumentPickleFormat(DocumentStorageFormat[DocumentT, DocumentT], Generic[DocumentT]):
    """Pickle each document (trusted data only: unpickling can execute code)."""

    #: Recorded in the dataset's schema, so that readers without this class can tell.
    payload_encoding = "pickle"

    def pack(self, data: DocumentT) -> bytes:
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self, encoded_data: StorageBufferTypes, shard: int) -> DocumentT:
        return pickle.loads(encoded_data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), ())
