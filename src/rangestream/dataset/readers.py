"""What every dataset reader shares: it is a face of its storage's reader.

A dataset (documents, temporal records) turns its own indexes into its storage's and
reads through the storage's sync or async reader; opening, closing and request counts are
that reader's. These bases say so once, so each dataset's reader states only how it maps
``reader[i]`` to the storage. The loader counts a reader's requests through
``storage_reader`` (``loader.transport``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from rangestream.io.stats import IOStats

__all__ = ["AsyncDatasetReader", "DatasetReader"]

R = TypeVar("R", bound="DatasetReader")
A = TypeVar("A", bound="AsyncDatasetReader")


class DatasetReader:
    """A dataset's sync reader: opens, closes and counts through its storage's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.storage_reader = dataset.storage.sync_reader()

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes the storage's reader has issued (open included)."""
        return self.storage_reader.stats  # type: ignore[no-any-return]

    def __enter__(self: R) -> R:
        self.storage_reader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the storage reader's files and connections (a later read reopens)."""
        self.storage_reader.close()


class AsyncDatasetReader:
    """A dataset's async reader: opens, closes and counts through its storage's."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.storage_reader = dataset.storage.async_reader()

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes the storage's reader has issued (open included)."""
        return self.storage_reader.stats  # type: ignore[no-any-return]

    async def __aenter__(self: A) -> A:
        await self.storage_reader.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the connections the running loop holds (or local open files)."""
        await self.storage_reader.aclose()
