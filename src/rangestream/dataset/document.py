"""``DocumentDataset``: documents as a sequence, ``reader[i]`` decodes document ``i``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rangestream.dataset.indexing import positions
from rangestream.dataset.readers import AsyncDatasetReader, DatasetReader


class DocumentDataset:
    """Documents of a ``DocumentStorage``, in global (shard by shard) order.

    Parameters
    ----------
    storage
        The document storage to read.
    keys
        Return only these keys of each record (AstrAI's ``fetch_record(index, keys)``):
        with ``RecordFormat`` records, large records are read as their header and the
        keys' bytes only. ``None`` returns whole documents.
    """

    def __init__(self, storage: Any, *, keys: Sequence[str] | None = None) -> None:
        if getattr(storage, "kind", None) != "document":
            raise TypeError(
                f"DocumentDataset needs a DocumentStorage, got {type(storage).__name__}"
            )
        if keys is not None and (
            isinstance(keys, str) or not all(isinstance(key, str) for key in keys)
        ):
            raise TypeError(f"keys must be a list of field names, got {keys!r:.200}")
        self.storage = storage
        self.keys = None if keys is None else list(keys)

    def __repr__(self) -> str:
        keys = "" if self.keys is None else f", keys={self.keys!r}"
        return f"DocumentDataset({self.storage!r}{keys})"

    def __len__(self) -> int:
        """Documents in the dataset (opens it in this process, once, if needed)."""
        return int(self.storage.default_opening.get_sync().num_documents)

    def __bool__(self) -> bool:  # a description: a truth test must not open it
        return True

    @property
    def is_local(self) -> bool:
        """Whether the storage is on local disk (the loader then reads synchronously)."""
        return bool(getattr(self.storage, "is_local", False))

    @property
    def sample_span_bytes(self) -> int:
        """Stored bytes of a document on average (opens the dataset in this process).

        Documents in storage order lie back to back in their shard's heap, so a run of
        them is one offsets range and one heap range: the block shuffle reads runs of
        ``4 MiB // span`` documents, about 4 MiB each; their sizes vary, so a run's bytes
        vary around that.
        """
        opened = self.storage.default_opening.get_sync()
        heap = opened.manifest.totals["payload_heap"]  # uint8 rows: bytes
        return max(1, -(-int(heap) // max(1, int(opened.num_documents))))

    def sync_reader(self) -> DocumentReader:
        return DocumentReader(self)

    def async_reader(self) -> AsyncDocumentReader:
        return AsyncDocumentReader(self)


class DocumentReader(DatasetReader):
    """``reader[i]``, ``reader[a:b]``, ``reader.read_many(indexes)``."""

    dataset: DocumentDataset

    def __len__(self) -> int:
        return len(self.storage_reader)

    def __getitem__(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = self.storage_reader.read_many(indexes, self.dataset.keys)
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        """Documents at ``indexes`` (negative count from the end), read together."""
        return self.storage_reader.read_many(list(indexes), self.dataset.keys)


class AsyncDocumentReader(AsyncDatasetReader):
    """``await reader[i]``, ``await reader.read_many(indexes)``."""

    dataset: DocumentDataset

    def __len__(self) -> int:
        return len(self.storage_reader)

    async def _get(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = await self.storage_reader.read_many(indexes, self.dataset.keys)
        return results if many else results[0]

    def __getitem__(self, key: int | slice) -> Any:
        return self._get(key)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        return await self.storage_reader.read_many(
            list(indexes), self.dataset.keys, max_concurrency=max_concurrency
        )
