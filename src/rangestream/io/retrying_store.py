"""Retries for the calls that are not range reads: puts, lists, deletes, small gets.

Range reads get their retries (and exact counters) from ``RangeReader``. Writers, the
commit and ``rangestream gc`` talk to the store directly, and a multi-GB write must not die
of one 503 or reset either: every such call is retried with the same policy. Puts are
whole-object and idempotent (same key, same bytes), so a retry after an ambiguous failure
cannot duplicate or corrupt anything.

``RetryingStore`` delegates the whole ``ObjectStore`` contract to the store it wraps (as
zarr-python's ``storage/_wrapper.py`` does), so a caller never needs the inner store: the
inner store's own listings with sizes, object versions and conditional writes are the ones
that run, each remote call retried. A conditional write is the one call a retry can make
ambiguous: its first attempt may have gone through before the failure, and then the retry
is refused because of it. ``put_if_version`` tells that case apart by reading the object
back, so ``ConcurrentWriteError`` from this store always means another writer came first.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from rangestream.errors import ConcurrentWriteError
from rangestream.io.retry import RetryPolicy, retrying
from rangestream.io.store import ObjectStore

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

T = TypeVar("T")


class RetryingStore(ObjectStore):
    """An object store whose every remote call is retried on transient errors.

    Every public method of ``ObjectStore`` is overridden here (a test checks it), so none
    falls back to the base class's composition of basic calls: what runs is the inner
    store's implementation. Calls that make no request (``describe``, the sync reads of a
    local store, connecting, closing) are passed through as they are.
    """

    def __init__(self, inner: ObjectStore, policy: RetryPolicy) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.policy = policy
        self.supports_sync_reads = inner.supports_sync_reads
        self._rng = random.Random()

    # -- passed through: no request to retry ----------------------------------------------
    def describe(self, key: str) -> str:
        return self.inner.describe(key)

    async def connect(self, *, writes: bool = False) -> None:
        await self.inner.connect(writes=writes)

    def is_connected(self, *, writes: bool = False) -> bool:
        return self.inner.is_connected(writes=writes)

    def preload(self) -> None:
        self.inner.preload()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def close_sync(self) -> None:
        self.inner.close_sync()

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        """The inner store's sync read: only stores without a network offer one."""
        return self.inner.get_range_sync(key, start, end)

    def get_sync(self, key: str) -> bytes:
        return self.inner.get_sync(key)

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes:
        return self.inner.get_suffix_sync(key, nbytes)

    # -- retried -------------------------------------------------------------------------
    async def _retry(
        self, what: str, key: str, call: Callable[[], Awaitable[T]], *, writes: bool = False
    ) -> T:
        if not self.inner.is_connected(writes=writes):
            # the session is made once per loop, outside any request's timeout
            await self.inner.connect(writes=writes)
        return await retrying(
            self.policy, self._rng, lambda _attempt: call(), f"{what} {self.describe(key)}"
        )

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await self._retry("get", key, lambda: self.inner.get_range(key, start, end))

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        return await self._retry("get", key, lambda: self.inner.get_suffix(key, nbytes))

    async def get(self, key: str) -> bytes:
        return await self._retry("get", key, lambda: self.inner.get(key))

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._retry("put", key, lambda: self.inner.put(key, data), writes=True)

    async def size(self, key: str) -> int:
        return await self._retry("size of", key, lambda: self.inner.size(key))

    async def exists(self, key: str) -> bool:
        return await self._retry("exists", key, lambda: self.inner.exists(key))

    async def list(self, prefix: str) -> list[str]:
        return await self._retry("list", prefix, lambda: self.inner.list(prefix), writes=True)

    async def delete_prefix(self, prefix: str) -> None:
        await self._retry("delete", prefix, lambda: self.inner.delete_prefix(prefix), writes=True)

    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        return await self._retry(
            "list", prefix, lambda: self.inner.list_details(prefix), writes=True
        )

    async def list_prefixes(self, prefix: str) -> list[str]:
        return await self._retry(
            "list", prefix, lambda: self.inner.list_prefixes(prefix), writes=True
        )

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        return await self._retry(
            "get", key, lambda: self.inner.get_versioned(key, max_nbytes), writes=True
        )

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """The inner store's conditional write, retried; refused only if someone else wrote.

        An attempt that failed (a reset, a timeout, a 5xx after the body arrived) may have
        written all the same; the retry is then refused because of that very write. So a
        refusal after a failed attempt is checked by reading ``key`` back: if it holds
        exactly ``data``, the write went through and this returns. Otherwise, and for a
        refusal of the first attempt, ``ConcurrentWriteError`` is raised as the store said.
        """
        attempts = 0

        async def attempt() -> None:
            nonlocal attempts
            attempts += 1
            await self.inner.put_if_version(key, data, version, max_nbytes)

        try:
            await self._retry("put", key, attempt, writes=True)
        except ConcurrentWriteError:
            if attempts == 1 or not await self._holds(key, data, max_nbytes):
                raise

    async def _holds(self, key: str, data: bytes, max_nbytes: int) -> bool:
        """Whether ``key`` now holds exactly ``data`` (at most ``max_nbytes`` are read)."""
        try:
            found, _ = await self.get_versioned(key, max_nbytes)
        except FileNotFoundError:
            return False
        return found == bytes(data)
