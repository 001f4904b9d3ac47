"""The format protocols: how records become stored bytes and reads become user values.

Formats are pure functions of arrays and bytes (no I/O). Subclass the matching protocol
(``class MyFormat(StreamStorageFormat[dict, dict, np.int32])``) or implement its methods.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy as np

InDataT = TypeVar("InDataT", contravariant=True)
OutDataT = TypeVar("OutDataT", covariant=True)
StreamDType = TypeVar("StreamDType", bound=np.generic)
DocumentT = TypeVar("DocumentT")

#: A one-dimensional numpy array.
Vector: TypeAlias = np.ndarray[tuple[int], np.dtype[Any]]
#: What a format may hand to storage.
UserBufferTypes: TypeAlias = bytes | memoryview
#: What storage hands to a format's ``unpack``.
StorageBufferTypes: TypeAlias = bytes | memoryview


@runtime_checkable
class StreamStorageFormat(Protocol[InDataT, OutDataT, StreamDType]):
    """A fixed-size stream element (``stream_dtype``) and how records map to elements."""

    stream_dtype: np.dtype[StreamDType]

    def __init__(self, stream_dtype: np.dtype[StreamDType]) -> None:
        self.stream_dtype = np.dtype(stream_dtype)

    def pack(self, data: InDataT) -> Vector:
        """The record's elements: a 1-D array of ``stream_dtype``."""
        ...

    def unpack(self, stream: Vector, shard_lengths: Vector, shards: Vector) -> OutDataT:
        """Decode a read; segment ``i`` is ``shard_lengths[i]`` elements of ``shards[i]``."""
        ...


@runtime_checkable
class StreamWithMetaStorageFormat(Protocol[InDataT, OutDataT, StreamDType]):
    """A stream whose runs of elements each reference a variable-size payload."""

    stream_dtype: np.dtype[StreamDType]

    def __init__(self, stream_dtype: np.dtype[StreamDType]) -> None:
        self.stream_dtype = np.dtype(stream_dtype)

    def size(self, data: InDataT) -> int:
        """Number of stream elements in ``data``; ``pack`` yields this many pairs."""
        ...

    def pack(
        self, data: InDataT
    ) -> Generator[tuple[Hashable, UserBufferTypes | None], None, Vector]:
        """Yield ``(key, payload | None)`` per element, then return the stream array."""
        ...

    def unpack(
        self,
        stream_data: Vector,
        document_shard: Vector,
        document_index: Vector,
        document_data: Sequence[StorageBufferTypes],
    ) -> OutDataT:
        """Decode a window and the payloads its elements reference."""
        ...


@runtime_checkable
class DocumentStorageFormat(Protocol[InDataT, OutDataT]):
    """One variable-size encoded blob per document.

    A format may name its encoding in a class attribute ``payload_encoding`` (a string,
    ``"pickle"`` for ``DocumentPickleFormat``): the dataset's schema records it, and a
    format that names another encoding is refused when it opens the dataset.
    """

    def pack(self, data: InDataT) -> UserBufferTypes:
        """Encode one document."""
        ...

    def unpack(self, encoded_data: StorageBufferTypes, shard: int) -> OutDataT:
        """Decode one document read from ``shard``."""
        ...


StorageFormat: TypeAlias = (
    StreamStorageFormat[Any, Any, Any]
    | DocumentStorageFormat[Any, Any]
    | StreamWithMetaStorageFormat[Any, Any, Any]
)

__all__ = [
    "DocumentStorageFormat",
    "StorageBufferTypes",
    "StorageFormat",
    "StreamStorageFormat",
    "StreamWithMetaStorageFormat",
    "UserBufferTypes",
    "Vector",
]
