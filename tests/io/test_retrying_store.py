"""``RetryingStore``: the whole store contract delegated, every remote call retried.

The inner store here is a local store whose chosen calls fail with a connection reset a
set number of times first (optionally after doing their work, as a request whose answer
was lost), and which counts the calls of its own methods: so a test sees both that a call
was retried and that the inner store's implementation ran, not the base class's
composition of basic calls.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rangestream import RetryPolicy
from rangestream.errors import ConcurrentWriteError, RetriesExhaustedError
from rangestream.io.local import LocalStore
from rangestream.io.object_info import ObjectInfo
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.store import ObjectStore

T = TypeVar("T")
FAST = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002, request_timeout=10)


class FlakyLocalStore(LocalStore):
    """A local store whose calls named in ``failures`` raise ``ConnectionResetError``.

    ``failures[name]`` calls of ``name`` fail before it succeeds; a name in ``lost_answers``
    does its work first and then fails (the object was written, the answer never came).
    ``calls`` counts every call of each overridden method, failed ones included.
    """

    def __init__(self, root: Path, failures: dict[str, int], lost_answers: set[str]) -> None:
        super().__init__(root)
        self.failures = Counter(failures)
        self.lost_answers = lost_answers
        self.calls: Counter[str] = Counter()

    async def _call(self, name: str, work: Callable[[], Awaitable[T]]) -> T:
        self.calls[name] += 1
        failing = self.failures[name] > 0
        if failing:
            self.failures[name] -= 1
            if name not in self.lost_answers:
                raise ConnectionResetError(f"injected reset before {name}")
        result = await work()
        if failing:
            raise ConnectionResetError(f"injected reset after {name}")
        return result

    async def list(self, prefix: str) -> list[str]:
        return await self._call("list", partial(super().list, prefix))

    async def size(self, key: str) -> int:
        return await self._call("size", partial(super().size, key))

    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        return await self._call("list_details", partial(super().list_details, prefix))

    async def list_prefixes(self, prefix: str) -> list[str]:
        return await self._call("list_prefixes", partial(super().list_prefixes, prefix))

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        return await self._call("get_versioned", partial(super().get_versioned, key, max_nbytes))

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        await self._call(
            "put_if_version", partial(super().put_if_version, key, data, version, max_nbytes)
        )


def flaky(
    tmp_path: Path,
    failures: dict[str, int] | None = None,
    lost_answers: frozenset[str] = frozenset(),
) -> tuple[RetryingStore, FlakyLocalStore]:
    inner = FlakyLocalStore(tmp_path / "ds", failures or {}, set(lost_answers))
    return RetryingStore(inner, FAST), inner


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if callable(member) and not name.startswith("_")
    }


def test_every_public_and_abstract_method_of_the_store_contract_is_overridden() -> None:
    contract = public_methods(ObjectStore) | set(ObjectStore.__abstractmethods__)
    assert {"list_details", "list_prefixes", "get_versioned", "put_if_version"} <= contract
    missing = sorted(name for name in contract if name not in vars(RetryingStore))
    assert missing == [], f"RetryingStore leaves these to the base class: {missing}"


def test_every_call_reaches_the_inner_store_and_sync_reads_work_over_a_local_one(
    tmp_path: Path,
) -> None:
    store, inner = flaky(tmp_path)
    inner.put_sync("a/b/x", b"0123456789")
    assert store.supports_sync_reads
    assert store.get_range_sync("a/b/x", 2, 5) == b"234"
    assert store.get_suffix_sync("a/b/x", 3) == b"789"
    assert store.get_sync("a/b/x") == b"0123456789"
    assert store.describe("k") == inner.describe("k")
    store.preload()
    store.close_sync()


def test_listings_and_versioned_reads_retry_the_inner_stores_own_call(tmp_path: Path) -> None:
    store, inner = flaky(tmp_path, {"list_details": 2, "list_prefixes": 2, "get_versioned": 2})
    inner.put_sync("a/b/x", b"0123456789")
    inner.put_sync("a/c/y", b"abc")

    async def run() -> tuple[Any, ...]:
        return (
            await store.list_details("a"),
            await store.list_prefixes("a"),
            await store.get_versioned("a/b/x", 1024),
        )

    details, prefixes, (data, version) = asyncio.run(run())
    assert [(info.key, info.size) for info in details] == [("a/b/x", 10), ("a/c/y", 3)]
    assert prefixes == ["a/b", "a/c"]
    assert data == b"0123456789"
    assert version == asyncio.run(LocalStore(tmp_path / "ds").get_versioned("a/b/x", 1024))[1]
    # two failed attempts and the one that succeeded, each the inner store's own method:
    # not the base class's listing-then-sizes, nor its read-then-size
    assert inner.calls["list_details"] == 3
    assert inner.calls["list_prefixes"] == 3
    assert inner.calls["get_versioned"] == 3
    assert inner.calls["list"] == 0 and inner.calls["size"] == 0


def test_a_conditional_write_is_retried_after_a_reset_before_it_reached_the_store(
    tmp_path: Path,
) -> None:
    store, inner = flaky(tmp_path, {"put_if_version": 2})
    asyncio.run(store.put_if_version("zarr.json", b"first", None, 1024))
    assert inner.get_sync("zarr.json") == b"first"
    assert inner.calls["put_if_version"] == 3
    assert inner.calls["get_versioned"] == 0  # nothing refused, nothing to read back


def test_a_retried_conditional_write_whose_first_attempt_went_through_succeeds(
    tmp_path: Path,
) -> None:
    store, inner = flaky(tmp_path, {"put_if_version": 1}, frozenset({"put_if_version"}))
    asyncio.run(store.put_if_version("zarr.json", b"mine", None, 1024))
    # the first attempt wrote, its answer was lost; the retry was refused because of that
    # very write, and the read-back recognised it
    assert inner.get_sync("zarr.json") == b"mine"
    assert inner.calls["put_if_version"] == 2
    assert inner.calls["get_versioned"] == 1


def test_a_retried_conditional_write_refused_for_another_writer_is_refused(
    tmp_path: Path,
) -> None:
    store, inner = flaky(tmp_path, {"put_if_version": 1})
    other = LocalStore(tmp_path / "ds")
    original = inner._call

    async def another_writer_first(name: str, work: Callable[[], Awaitable[Any]]) -> Any:
        if name == "put_if_version" and inner.calls[name] == 1:  # between the two attempts
            other.put_sync("zarr.json", b"theirs")
        return await original(name, work)

    inner._call = another_writer_first  # type: ignore[method-assign]
    with pytest.raises(ConcurrentWriteError):
        asyncio.run(store.put_if_version("zarr.json", b"mine", None, 1024))
    assert inner.get_sync("zarr.json") == b"theirs"
    assert inner.calls["get_versioned"] == 1  # the refusal after a failure was checked


def test_a_conditional_write_refused_at_its_first_attempt_is_not_read_back(
    tmp_path: Path,
) -> None:
    store, inner = flaky(tmp_path)
    inner.put_sync("zarr.json", b"theirs")
    with pytest.raises(ConcurrentWriteError):
        asyncio.run(store.put_if_version("zarr.json", b"mine", None, 1024))
    assert inner.calls["put_if_version"] == 1 and inner.calls["get_versioned"] == 0


def test_retries_of_a_conditional_write_end_with_the_policy(tmp_path: Path) -> None:
    store, inner = flaky(tmp_path, {"put_if_version": 10})
    with pytest.raises(RetriesExhaustedError):
        asyncio.run(store.put_if_version("zarr.json", b"mine", None, 1024))
    assert inner.calls["put_if_version"] == FAST.max_attempts
