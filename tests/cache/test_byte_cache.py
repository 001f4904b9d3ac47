"""The byte cache on its own: ranges kept and stitched, damage dropped, a bound, a full disk."""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

import pytest

from rangestream.cli.main import main
from rangestream.io.cache import ByteCache, summarize_cache
from rangestream.io.cache import byte_cache as byte_cache_module
from rangestream.io.cache.byte_cache import HEADER, scan_entries
from rangestream.io.ranges import RangeRequest, SuffixRequest

URL = "s3://bucket/dataset"
KEY = "data/" + "ab" * 16 + "/shards/0/stream/c/0"
OBJECT = bytes(range(256)) * 16  # 4 KiB


def fetched(cache: ByteCache, start: int, end: int) -> None:
    cache.store(URL, RangeRequest(KEY, start, end), OBJECT[start:end])


def entry_bytes(directory: Path) -> int:
    entries, temps = scan_entries(directory)
    return temps + sum(size for _mtime, size, _path in entries)


def test_ranges_are_served_whole_or_stitched_and_holes_named(tmp_path: Path) -> None:
    cache = ByteCache(tmp_path, 1 << 20)
    counts = [0, 0, 0, 0]
    fetched(cache, 100, 300)
    fetched(cache, 300, 500)
    assert cache.lookup(URL, RangeRequest(KEY, 150, 250), counts) == OBJECT[150:250]
    assert cache.lookup(URL, RangeRequest(KEY, 200, 450), counts) == OBJECT[200:450]
    pieces, holes = cache.lookup_range(URL, RangeRequest(KEY, 50, 600), counts)
    assert holes == [(50, 100), (500, 600)]
    assert b"".join(p for _, p in pieces) == OBJECT[100:500]
    assert counts == [2, 1, 100 + 250 + 400, 0]
    # another reader of the directory (a new process) sees the same entries
    assert ByteCache(tmp_path, 1 << 20).lookup(URL, RangeRequest(KEY, 120, 480), counts)
    # a suffix (a chunk index) is its own entry; other datasets and keys miss
    cache.store(URL, SuffixRequest(KEY, 64), OBJECT[-64:])
    assert cache.lookup(URL, SuffixRequest(KEY, 64), counts) == OBJECT[-64:]
    assert cache.lookup("s3://bucket/other", RangeRequest(KEY, 150, 250), counts) is None


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_entry_is_dropped_counted_and_missed(tmp_path: Path, damage: str) -> None:
    fetched(ByteCache(tmp_path, 1 << 20), 0, 1000)
    ((_mtime, _size, path),), _ = scan_entries(tmp_path)
    raw = bytearray(path.read_bytes())
    if damage == "flipped":
        raw[HEADER + 500] ^= 1
        path.write_bytes(bytes(raw))
    else:
        path.write_bytes(bytes(raw[:-10]))
    reader = ByteCache(tmp_path, 1 << 20)  # a process that has not checked the entry yet
    counts = [0, 0, 0, 0]
    assert reader.lookup(URL, RangeRequest(KEY, 10, 20), counts) is None
    assert counts == [0, 1, 0, 1]
    assert not path.exists() and entry_bytes(tmp_path) == 0
    assert int((tmp_path / "SIZE").read_text()) == 0
    reader.flush_stats()
    assert summarize_cache(tmp_path).dropped == 1


def test_the_directory_never_exceeds_its_budget_and_evicts_the_least_recent(
    tmp_path: Path,
) -> None:
    budget = 10 * (HEADER + 100)  # ten entries of 100 bytes
    cache = ByteCache(tmp_path, budget)
    counts = [0, 0, 0, 0]
    for number in range(10):
        fetched(cache, number * 100, number * 100 + 100)
        stamp = 1_000_000 + number
        for _mtime, _size, path in scan_entries(tmp_path)[0]:
            if path.name == f"r{number * 100}-{number * 100 + 100}":
                os.utime(path, (stamp, stamp))
    assert entry_bytes(tmp_path) == budget
    assert cache.lookup(URL, RangeRequest(KEY, 0, 100), counts)  # the oldest, touched now
    fetched(cache, 1000, 1100)  # over budget: down to 90% first, the least recent go
    kept = {path.name for _m, _s, path in scan_entries(tmp_path)[0]}
    assert kept == {f"r{n * 100}-{n * 100 + 100}" for n in (0, 3, 4, 5, 6, 7, 8, 9, 10)}
    for number in range(11, 40):
        fetched(cache, number * 100, number * 100 + 100)
        assert entry_bytes(tmp_path) <= budget
        assert int((tmp_path / "SIZE").read_text()) <= budget
    fetched(cache, 0, budget)  # larger than the whole budget: not kept
    assert entry_bytes(tmp_path) <= budget


def test_a_full_disk_turns_the_cache_off_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ByteCache(tmp_path, 1 << 20)

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(byte_cache_module.os, "replace", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fetched(cache, 0, 100)
        fetched(cache, 100, 200)
        assert cache.lookup(URL, RangeRequest(KEY, 0, 100), [0, 0, 0, 0]) is None
    assert [str(w.message).count("disk is full") for w in caught] == [1]
    assert not cache.enabled
    assert entry_bytes(tmp_path) == 0 and byte_cache_module._read_size(tmp_path) == 0


def test_the_command_shows_and_clears_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ByteCache(tmp_path, 1 << 20)
    fetched(cache, 0, 100)
    cache.lookup(URL, RangeRequest(KEY, 0, 50), [0, 0, 0, 0])
    cache.lookup(URL, RangeRequest(KEY, 50, 150), [0, 0, 0, 0])
    cache.flush_stats()
    assert main(["cache", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bytes"] == HEADER + 100 and report["entries"] == 1
    assert report["datasets"] == {URL: {"entries": 1, "bytes": HEADER + 100}}
    assert (report["hits"], report["misses"], report["hit_rate"]) == (1, 1, 0.5)
    assert main(["cache", str(tmp_path)]) == 0
    assert "hits 1 of 2 requests (50.0%)" in capsys.readouterr().out
    assert main(["cache", str(tmp_path), "--clear"]) == 0
    assert "cleared 108 bytes" in capsys.readouterr().out
    assert summarize_cache(tmp_path).entries == 0
    assert main(["cache", str(tmp_path / "none")]) == 2


def test_the_environment_turns_it_on_and_local_datasets_are_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rangestream.io.cache import cache_for

    assert cache_for("s3://bucket/a", None, None) is None  # off by default
    monkeypatch.setenv("RANGESTREAM_CACHE_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("RANGESTREAM_CACHE_BYTES", "2M")
    found = cache_for("s3://bucket/a", None, None)
    assert found is not None and found.budget == 2 << 20
    assert found.directory == tmp_path / "env"
    assert cache_for("s3://bucket/b", None, None) is found  # one per directory and process
    assert cache_for(str(tmp_path / "local"), None, None) is None
    assert cache_for("memory://x", None, None) is None
    assert cache_for("s3://bucket/a", tmp_path / "arg", 1000).directory == tmp_path / "arg"
