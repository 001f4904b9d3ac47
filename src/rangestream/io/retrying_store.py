"""Retries for the calls that are not range reads: puts, lists, deletes, small gets.

Range reads get their retries (and exact counters) from ``RangeReader``. Writers and the
commit talk to the store directly, and a multi-GB write must not die of one 503 or reset
either: every such call is retried with the same policy. Puts are whole-object and
idempotent (same key, same bytes), so a retry after an ambiguous failure cannot duplicate
or corrupt anything.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rangestream.errors import (
    EndpointUnreachableError,
    RangestreamError,
    RetriesExhaustedError,
    StorageError,
)
from rangestream.io.retry import RetryPolicy, is_transient, is_unreachable
from rangestream.io.store import ObjectStore

T = TypeVar("T")


async def with_retries(
    policy: RetryPolicy, call: Callable[[], Awaitable[T]], where: str, rng: random.Random
) -> T:
    """Run ``call`` until it succeeds, a permanent error occurs, or the policy runs out."""
    last_error: BaseException | None = None
    for _attempt, deadline, delay in policy.attempts(rng):
        if delay:
            await asyncio.sleep(delay)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            return await asyncio.wait_for(call(), timeout=min(policy.request_timeout, remaining))
        except (FileNotFoundError, FileExistsError, PermissionError, RangestreamError):
            raise  # permanent, or already a library error naming what is wrong
        except Exception as error:
            if not is_transient(error):
                raise StorageError(f"{where} failed: {error}") from error
            last_error = error
    if last_error is not None and is_unreachable(last_error):
        raise EndpointUnreachableError(
            f"cannot reach the object store for {where}: {last_error}"
        ) from last_error
    raise RetriesExhaustedError(
        f"{where} failed after retries (max_attempts={policy.max_attempts}, "
        f"total_timeout={policy.total_timeout}s): {last_error!r}"
    ) from last_error


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
        return await with_retries(self.policy, call, f"{what} {self.describe(key)}", self._rng)

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
