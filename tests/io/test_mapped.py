"""LocalMapCache: mapped bytes equal the file, the bound drops the least recently used,
dropped mappings stay valid for arrays still using them, and a forked child maps anew."""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from rangestream.io.mapped import LocalMapCache, map_file


def make_files(tmp_path: Path, count: int, size: int = 5000) -> list[str]:
    paths = []
    for number in range(count):
        path = tmp_path / f"f{number}"
        path.write_bytes(np.random.default_rng(number).bytes(size))
        paths.append(str(path))
    return paths


def test_a_mapped_file_reads_as_its_bytes_and_is_read_only(tmp_path: Path) -> None:
    (path,) = make_files(tmp_path, 1)
    mapped = LocalMapCache(str(tmp_path)).open(path, units=3)
    assert mapped.size == 5000
    assert mapped.data.tobytes() == Path(path).read_bytes()
    assert not mapped.data.flags.writeable
    assert mapped.verified == bytearray(3)
    assert mapped.covers(5000) and not mapped.covers(5001)


def test_opening_a_cached_path_returns_the_same_mapping(tmp_path: Path) -> None:
    (path,) = make_files(tmp_path, 1)
    cache = LocalMapCache(str(tmp_path))
    assert cache.get(path) is None
    first = cache.open(path)
    assert cache.open(path) is first and cache.get(path) is first and len(cache) == 1


def test_the_cache_keeps_at_most_max_files_dropping_the_least_recently_used(
    tmp_path: Path,
) -> None:
    paths = make_files(tmp_path, 5)
    cache = LocalMapCache(str(tmp_path), max_files=3)
    for path in paths[:3]:
        cache.open(path)
    cache.get(paths[0])  # now the most recently used: paths[1] is the oldest
    cache.open(paths[3])
    assert [path in cache for path in paths] == [True, False, True, True, False]
    cache.open(paths[4])
    assert [path in cache for path in paths] == [True, False, False, True, True]
    assert len(cache) == 3


def test_an_array_over_a_dropped_mapping_stays_readable(tmp_path: Path) -> None:
    paths = make_files(tmp_path, 2)
    cache = LocalMapCache(str(tmp_path), max_files=1)
    kept = cache.open(paths[0]).data[100:200]  # a view: keeps the mapping alive
    cache.open(paths[1])  # drops paths[0] from the cache
    cache.clear()
    del cache
    gc.collect()
    assert kept.tobytes() == Path(paths[0]).read_bytes()[100:200]


def test_an_empty_file_maps_to_zero_bytes(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    mapped = map_file(str(path), str(tmp_path), units=2)
    assert mapped.size == 0 and len(mapped.data) == 0 and not mapped.covers(1)


def test_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LocalMapCache(str(tmp_path)).open(str(tmp_path / "missing"))


def test_max_files_must_be_a_positive_integer(tmp_path: Path) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_files"):
            LocalMapCache(str(tmp_path), max_files=bad)  # type: ignore[arg-type]


_CACHE: LocalMapCache | None = None
_PARENT_ENTRY: object = None


def _child_reads(path: str) -> tuple[bool, bool, int, bytes]:
    assert _CACHE is not None
    inherited = _CACHE.get(path) is not None  # the parent's entry must be gone
    mapped = _CACHE.open(path)
    return inherited, mapped is _PARENT_ENTRY, len(_CACHE), mapped.data[:64].tobytes()


def test_a_forked_child_drops_the_parents_mappings_and_maps_its_own(tmp_path: Path) -> None:
    global _CACHE, _PARENT_ENTRY
    paths = make_files(tmp_path, 2)
    _CACHE = LocalMapCache(str(tmp_path))
    _PARENT_ENTRY = _CACHE.open(paths[0])
    _CACHE.open(paths[1])
    context = multiprocessing.get_context("fork")
    try:
        with context.Pool(1) as pool:
            inherited, same, size, head = pool.apply(_child_reads, (paths[0],))
        assert len(_CACHE) == 2  # the parent keeps its own
    finally:
        _CACHE = _PARENT_ENTRY = None
    assert not inherited and not same and size == 1
    assert head == Path(paths[0]).read_bytes()[:64]


def test_caches_of_one_process_share_its_bound_each_dropping_its_own_oldest(
    tmp_path: Path,
) -> None:
    from rangestream.io.mapped import mapped_files

    paths = make_files(tmp_path, 12, size=100)
    first = LocalMapCache(str(tmp_path), max_files=100, process_bound=6)
    second = LocalMapCache(str(tmp_path), max_files=100, process_bound=6)
    for path in paths[:5]:
        first.open(path)
    assert mapped_files() == 5
    for path in paths[5:9]:  # the process passes 6: the second cache maps one for one
        second.open(path)
    assert (len(first), len(second)) == (5, 1) and mapped_files() == 6
    assert second.get(paths[8]) is not None and second.get(paths[5]) is None
    first.clear()
    assert mapped_files() == 1


def test_the_default_bound_is_a_quarter_of_the_kernels_mappings_at_most_16384(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rangestream.io import mapped

    with open("/proc/sys/vm/max_map_count") as limit:
        expected = max(256, min(16384, int(limit.read()) // 4))
    monkeypatch.delenv(mapped.MAX_MAPPED_FILES_ENV, raising=False)
    assert mapped._process_bound() == expected
    monkeypatch.setenv(mapped.MAX_MAPPED_FILES_ENV, "1000")
    assert mapped._process_bound() == 1000


def test_a_map_refused_for_lack_of_mappings_drops_half_the_cache_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import mmap

    from rangestream.io import mapped

    paths = make_files(tmp_path, 9, size=100)
    cache = LocalMapCache(str(tmp_path))
    for path in paths[:8]:
        cache.open(path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mapped.mmap, "mmap", refuse)
    with pytest.raises(OSError):
        cache.open(paths[8])
    monkeypatch.setattr(mapped.mmap, "mmap", mmap.mmap)
    assert len(cache) == 4 and all(cache.get(path) for path in paths[4:8])
