"""``DocumentDataset``: documents as a sequence, ``reader[i]`` decodes document ``i``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rangestream.dataset.indexing import positions
from rangestream.io.stats import IOStats


class DocumentDataset:
    """Whole documents of a ``DocumentStorage``, in global (shard by shard) order."""

    def __init__(self, storage: Any) -> None:
        if getattr(storage, "kind", None) != "document":
            raise TypeError(
                f"DocumentDataset needs a DocumentStorage, got {type(storage).__name__}"
            )
        self.storage = storage

    def __repr__(self) -> str:
        return f"DocumentDataset({self.storage!r})"

    @property
    def is_local(self) -> bool:
        """Whether the storage is on local disk (the loader then reads synchronously)."""
        return bool(getattr(self.storage, "is_local", False))

    def sync_reader(self) -> DocumentReader:
        return DocumentReader(self)

    def async_reader(self) -> AsyncDocumentReader:
        return AsyncDocumentReader(self)


class DocumentReader:
    """``reader[i]``, ``reader[a:b]``, ``reader.read_many(indexes)``."""

    def __init__(self, dataset: DocumentDataset) -> None:
        self.dataset = dataset
        self.storage_reader = dataset.storage.sync_reader()

    @property
    def stats(self) -> IOStats:
        return self.storage_reader.stats

    def __enter__(self) -> DocumentReader:
        self.storage_reader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.storage_reader.close()

    def __len__(self) -> int:
        return len(self.storage_reader)

    def __getitem__(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = self.storage_reader.read_many(indexes)
        return results if many else results[0]

    def read_many(self, indexes: Sequence[int]) -> list[Any]:
        return self.storage_reader.read_many(list(indexes))


class AsyncDocumentReader:
    """``await reader[i]``, ``await reader.read_many(indexes)``."""

    def __init__(self, dataset: DocumentDataset) -> None:
        self.dataset = dataset
        self.storage_reader = dataset.storage.async_reader()

    @property
    def stats(self) -> IOStats:
        return self.storage_reader.stats

    async def __aenter__(self) -> AsyncDocumentReader:
        await self.storage_reader.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.storage_reader.aclose()

    def __len__(self) -> int:
        return len(self.storage_reader)

    async def _get(self, key: int | slice) -> Any:
        indexes, many = positions(key, len(self))
        results = await self.storage_reader.read_many(indexes)
        return results if many else results[0]

    def __getitem__(self, key: int | slice) -> Any:
        return self._get(key)

    async def read_many(
        self, indexes: Sequence[int], *, max_concurrency: int | None = None
    ) -> list[Any]:
        return await self.storage_reader.read_many(list(indexes), max_concurrency=max_concurrency)
