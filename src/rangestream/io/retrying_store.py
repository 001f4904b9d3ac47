"""Retries for the calls that are not range reads: puts, lists, deletes, small gets.

Range reads get their retries (and exact counters) from ``RangeReader``. Writers and the
commit talk to the store directly, and a multi-GB write must not die of one 503 or reset
either: every such call is retried with the same policy. Puts are whole-object and
idempotent (same key, same bytes), so a retry after an ambiguous failure cannot duplicate
or corrupt anything.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rangestream.io.retry import RetryPolicy, retrying
from rangestream.io.store import ObjectStore

T = TypeVar("T")


class RetryingStore(ObjectStore):
    """An object store whose every call is retried on transient errors."""

    def __init__(self, inner: ObjectStore, policy: RetryPolicy) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.policy = policy
        self.supports_sync_reads = inner.supports_sync_reads
        self._rng = random.Random()

    def describe(self, key: str) -> str:
        return self.inner.describe(key)

    async def connect(self, *, writes: bool = False) -> None:
        await self.inner.connect(writes=writes)

    def is_connected(self, *, writes: bool = False) -> bool:
        return self.inner.is_connected(writes=writes)

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

    async def aclose(self) -> None:
        await self.inner.aclose()
