"""Reading entries: a hit needs no listing of its folder; anything else lists it again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rangestream.io.cache import ByteCache
from rangestream.io.ranges import RangeRequest

URL = "s3://bucket/dataset"
KEY = "data/" + "ef" * 16 + "/shards/0/stream/c/0"
OBJECT = bytes(range(256)) * 4


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders ``os.listdir`` is called on, in order."""
    calls: list[str] = []
    real = os.listdir

    def counting(path: Any = ".") -> list[str]:
        calls.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    return calls


def test_a_hit_reads_entries_without_listing_their_folder_again(
    tmp_path: Path, listings: list[str]
) -> None:
    cache = ByteCache(tmp_path, 1 << 20)
    counts = [0, 0, 0, 0]
    cache.store(URL, RangeRequest(KEY, 0, 100), OBJECT[:100])
    assert cache.lookup(URL, RangeRequest(KEY, 50, 80), counts) == OBJECT[50:80]
    assert len(listings) == 1  # the first look at the folder
    cache.store(URL, RangeRequest(KEY, 100, 200), OBJECT[100:200])  # noted as written
    assert cache.lookup(URL, RangeRequest(KEY, 0, 200), counts) == OBJECT[:200]
    assert cache.lookup(URL, RangeRequest(KEY, 150, 160), counts) == OBJECT[150:160]
    assert len(listings) == 1
    # a range with a hole lists the folder again: the hole is what is on disk now
    pieces, holes = cache.lookup_range(URL, RangeRequest(KEY, 150, 300), counts)
    assert pieces == [(150, OBJECT[150:200])] and holes == [(200, 300)]
    assert len(listings) == 2
    assert counts == [3, 1, 30 + 200 + 10 + 50, 0]


def test_entries_another_process_wrote_or_evicted_since_are_seen(tmp_path: Path) -> None:
    cache, other = ByteCache(tmp_path, 1 << 20), ByteCache(tmp_path, 1 << 20)
    counts = [0, 0, 0, 0]
    cache.store(URL, RangeRequest(KEY, 0, 100), OBJECT[:100])
    assert cache.lookup(URL, RangeRequest(KEY, 0, 100), counts) == OBJECT[:100]
    # written by another process after this one listed the folder: found, a hit
    other.store(URL, RangeRequest(KEY, 100, 300), OBJECT[100:300])
    assert cache.lookup(URL, RangeRequest(KEY, 50, 250), counts) == OBJECT[50:250]
    # evicted by another process: the remembered listing is not trusted, the bytes are
    # a hole again (no stale read, nothing counted as dropped)
    folder = next(tmp_path.glob("*/*/*"))
    os.unlink(folder / "r100-300")
    pieces, holes = cache.lookup_range(URL, RangeRequest(KEY, 50, 250), counts)
    assert pieces == [(50, OBJECT[50:100])] and holes == [(100, 250)]
    assert counts == [2, 1, 100 + 200 + 50, 0]
