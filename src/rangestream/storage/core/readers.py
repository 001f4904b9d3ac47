"""Sync and async readers: two faces of one opened version (``storage.core.opening``).

A reader opens the dataset on first use (or on entering its context) and releases it on
exit; its ``stats`` count every request it made, the open's included. A sync reader made
in one process and used in a forked child opens the dataset again there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from rangestream.io.process import ProcessLocal
from rangestream.io.stats import IOStats
from rangestream.layout.executors import Program
from rangestream.storage.core.opening import OpenedStorage, Opening

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind

__all__ = ["AsyncReader", "StorageFacts", "SyncReader"]

T = TypeVar("T")
R = TypeVar("R", bound="SyncReader")
A = TypeVar("A", bound="AsyncReader")


class StorageFacts:
    """What both readers of every kind say the same way about the version they read."""

    opened: Any

    @property
    def format(self) -> Any:
        """The format records decode with: the one given, or the one the dataset records."""
        return self.opened.format

    @property
    def num_shards(self) -> int:
        """One more than the highest shard id written (unwritten shards hold nothing)."""
        return int(self.opened.num_shards)


class _Face:
    """What a sync and an async reader share: the storage, and the opening they read."""

    def __init__(self, storage: StorageKind, opening: Opening | None = None) -> None:
        self.storage = storage
        self._opening = Opening(storage) if opening is None else opening


class SyncReader(_Face):
    """Context-managed sync reader: opens on ``__enter__`` (or first use), closes on exit."""

    @property
    def opened(self) -> Any:
        """This process's opened version (opened now if needed)."""
        opened = self._opening.opened.value
        return opened if opened is not None else self._opening.get_sync()

    @property
    def opened_holder(self) -> ProcessLocal[OpenedStorage]:
        """Where the opened version is kept (``value``: ``None`` until opened, and in a
        forked child), for layers above that read it on every call."""
        return self._opening.opened

    @property
    def stats(self) -> IOStats:
        """Exact requests and bytes this reader has issued (open included)."""
        return self.opened.stats

    def _run(self, program: Program[T]) -> T:
        return self.opened.run_sync(program)  # type: ignore[no-any-return]

    def __enter__(self: R) -> R:
        self._opening.get_sync()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release files, mappings and connections; a later read opens the dataset again."""
        self._opening.forget_sync()

    def release(self) -> None:
        """Release files and connections but keep the opened version: the next read (an
        epoch later, say) opens nothing and keeps the indexes and offsets read so far."""
        self._opening.release_sync()


class AsyncReader(_Face):
    """Context-managed async reader; its reads run on the loop that awaits them."""

    @property
    def opened(self) -> Any:
        opened = self._opening.opened.value
        if opened is None:
            raise RuntimeError("use the async reader inside 'async with' (it is not open yet)")
        return opened

    @property
    def stats(self) -> IOStats:
        return self.opened.stats  # type: ignore[no-any-return]

    async def _opened(self) -> OpenedStorage:
        opened = self._opening.opened.value
        return opened if opened is not None else await self._opening.get_async()

    async def _run(self, program: Program[T], max_concurrency: int | None = None) -> T:
        opened = await self._opened()
        return await opened.run(program, max_concurrency=max_concurrency)

    async def __aenter__(self: A) -> A:
        await self._opening.get_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._opening.aforget()

    async def arelease(self) -> None:
        """Release the running loop's connections but keep the opened version, so the
        reader can be used again on another loop without opening anything: call it before
        that loop closes (a persistent DataLoader worker between epochs)."""
        await self._opening.arelease()
