"""What the GCS and Azure stores do alike, each on its emulator (``cloud_location``)."""

from __future__ import annotations

import asyncio

import pytest
from support.cloud import CloudLocation

from rangestream.io.stores import open_store


def test_listing_sizes_and_deletes(cloud_location: CloudLocation) -> None:
    store = open_store(cloud_location.url, cloud_location.storage_options)

    async def run() -> tuple[object, ...]:
        for key in ("a/1", "a/b/2", "c"):
            await store.put(key, b"x" * len(key))
        found = (await store.list(""), await store.list("a"), await store.list_prefixes(""))
        sizes = [(i.key, i.size) for i in await store.list_details("")]
        checks = (await store.exists("a/1"), await store.exists("nope"), await store.size("a/b/2"))
        await store.delete_prefix("a")
        return found, sizes, checks, await store.list("")

    found, sizes, checks, left = asyncio.run(run())
    assert found == (["a/1", "a/b/2", "c"], ["a/1", "a/b/2"], ["a"])
    assert sizes == [("a/1", 3), ("a/b/2", 5), ("c", 1)]
    assert checks == (True, False, 5)
    assert left == ["c"]


def test_a_missing_object_is_file_not_found(cloud_location: CloudLocation) -> None:
    store = open_store(cloud_location.url, cloud_location.storage_options)
    with pytest.raises(FileNotFoundError):
        asyncio.run(store.get_range("missing", 0, 10))
