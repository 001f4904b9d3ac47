"""The object store contract: what every store implements, and the keys it accepts.

Keys are ``/``-separated paths relative to the dataset root. The async methods are the
contract every store implements; a store whose reads are cheap enough to make without an
event loop (local files) also offers them synchronously and says so with
``supports_sync_reads``, as zarr-python's stores opt into sync gets. This module knows no
implementation (as zarr-python's ``abc/store.py``): the store for a URL is chosen by
``rangestream.io.stores``, which imports them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from rangestream.errors import UnsafeKeyError

__all__ = ["ObjectStore", "check_key"]

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

_UNSAFE_PARTS = frozenset({"", ".", ".."})


def check_key(key: str) -> str:
    """``key`` if it names an object under the dataset root, else ``UnsafeKeyError``.

    Keys are built from stored metadata (commit ids, shard numbers, array names), so a
    hostile document must not be able to make one that climbs out of the dataset (``..``)
    or replaces its root (an absolute path: joined to a local root, ``/etc/x`` wins).
    The empty key is the root itself (listing or deleting everything).
    """
    if key == "":
        return key
    if (
        not isinstance(key, str)
        or key.startswith("/")
        or "\\" in key
        or "\x00" in key
        or not _UNSAFE_PARTS.isdisjoint(key.split("/"))
    ):
        raise UnsafeKeyError(f"key {key!r} would leave the dataset root; refused")
    return key


class ObjectStore(ABC):
    """Async access to the objects under one dataset root."""

    #: Whether ``get_range_sync`` / ``get_suffix_sync`` / ``get_sync`` work without an event
    #: loop (and need no timeout: no network to wait for).
    supports_sync_reads: bool = False

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:  # never shows storage_options: they may hold credentials
        return f"{type(self).__name__}({self.url!r})"

    def describe(self, key: str) -> str:
        """The full URL of ``key``, for error messages."""
        return f"{self.url.rstrip('/')}/{key}"

    @abstractmethod
    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer only if the object ends before ``end``."""

    @abstractmethod
    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        """The last ``nbytes`` bytes (all of them if the object is shorter)."""

    @abstractmethod
    async def get(self, key: str) -> bytes: ...

    @abstractmethod
    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write a whole object; readers see the old object or the new one, never a mix."""

    @abstractmethod
    async def size(self, key: str) -> int: ...

    @abstractmethod
    async def exists(self, key: str) -> bool: ...

    @abstractmethod
    async def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursively), relative to the root."""

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``; a missing prefix is not an error."""

    async def aclose(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release what this store holds for the running loop (or, locally, open files)."""

    def close_sync(self) -> None:
        """Release this store's resources from sync code (the I/O loop's, if it has any)."""
        from rangestream.io.process import io_loop_started, run_blocking

        if io_loop_started() is not None:
            run_blocking(self.aclose())

    async def connect(self, *, writes: bool = False) -> None:  # noqa: B027 - often nothing to do
        """Make the running loop's session now, so that no request's timeout pays for it.

        Creating an S3 client (and resolving credentials) can take longer than a tight
        ``RetryPolicy.request_timeout``; the range reader calls this outside that timeout.
        ``writes=True`` also makes what puts, listings and deletes need.
        """

    def is_connected(self, *, writes: bool = False) -> bool:
        """Whether ``connect`` has nothing to do on the running loop (a cheap check)."""
        return True

    def preload(self) -> None:  # noqa: B027 - local files need no client code
        """Import the client code reads will need, without connecting.

        A process about to fork DataLoader workers calls this, so that each worker inherits
        the imports instead of paying for them on its way to the first batch.
        """

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    def get_sync(self, key: str) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    # -- listings with sizes, object versions, conditional writes (gc, verify, commit) --
    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        """Objects under ``prefix`` (recursively) with their sizes and, if known, ages."""
        from rangestream.io.object_info import ObjectInfo

        return [ObjectInfo(key, await self.size(key), None) for key in await self.list(prefix)]

    async def list_prefixes(self, prefix: str) -> list[str]:
        """The prefixes one level below ``prefix`` that hold objects (its "directories")."""
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        rests = [key[len(base) :] for key in await self.list(prefix)]
        return sorted({base + rest.split("/", 1)[0] for rest in rests if "/" in rest})

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        """At most ``max_nbytes`` bytes of ``key``, and a token naming this version of it.

        ``FileNotFoundError`` if there is no such object. Here versions are named by
        content (``object_info.content_version``); S3 names them by ETag.
        """
        from rangestream.io.object_info import content_version

        data = await self.get_range(key, 0, max_nbytes)
        size = len(data) if len(data) < max_nbytes else await self.size(key)
        return data, content_version(data, size)

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """Write ``key`` only if it is still ``version`` (``None``: only if it is absent).

        Raises ``ConcurrentWriteError`` otherwise. This fallback checks, then writes: a
        write by someone else between the two goes unseen here, so callers read back
        afterwards. Stores with an atomic conditional write (S3, local files) override it.
        """
        from rangestream.errors import ConcurrentWriteError

        try:
            _, current = await self.get_versioned(key, max_nbytes)
        except FileNotFoundError:
            current = None
        if current != version:
            raise ConcurrentWriteError(f"{self.describe(key)} changed since it was read")
        await self.put(key, data)
