"""Whether a reader gets a byte cache: its arguments, else the environment, else none.

One :class:`ByteCache` per directory and process, shared by every reader using it, so a
process checks each entry once and counts its hits in one place; its counts reach the
directory's ``STATS`` file as it goes (at most a second late), at every batch a loader's
worker hands out (:func:`flush_stats`, so ``rangestream cache`` agrees with the loader's
``source_stats`` while workers live on), at exit, and at the end of a forked worker; the
last two also hand back the unwritten rest of the process's slab of budget (``budget``).
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import re
import shutil

from rangestream.io.cache.byte_cache import ByteCache
from rangestream.io.cache.writer import drain_all
from rangestream.io.process import after_fork

__all__ = ["CACHE_BYTES_ENV", "CACHE_DIR_ENV", "cache_for", "flush_stats", "parse_budget"]

CACHE_DIR_ENV = "RANGESTREAM_CACHE_DIR"
CACHE_BYTES_ENV = "RANGESTREAM_CACHE_BYTES"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(value: int | str) -> int:
    """``cache_bytes`` as bytes: an integer, or a number with K, M, G or T (``"20G"``)."""
    if isinstance(value, bool):
        raise TypeError(f"cache_bytes must be a number of bytes, got {value!r}")
    if isinstance(value, int):
        nbytes = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([bkmgt]?)(?:i?b)?\s*", str(value).lower())
        if match is None:
            raise ValueError(f"cache_bytes takes bytes such as 20G or 500000000, got {value!r}")
        nbytes = int(float(match.group(1)) * _UNITS[match.group(2)])
    if nbytes < 1:
        raise ValueError(f"cache_bytes must be >= 1, got {value!r}")
    return nbytes


#: One ByteCache per directory in this process (shared by every reader using it).
_caches: dict[str, ByteCache] = {}


def cache_for(
    url: str, cache_dir: str | os.PathLike[str] | None, cache_bytes: int | str | None
) -> ByteCache | None:
    """The cache a reader of ``url`` uses: the arguments, else the environment, else none.

    Local paths and ``memory://`` datasets are never cached (they are local already). A
    directory without a budget gets half of its file system's free space, measured once.
    """
    directory = cache_dir if cache_dir is not None else os.environ.get(CACHE_DIR_ENV) or None
    if directory is None or "://" not in url or url.startswith(("memory://", "file://")):
        return None
    budget_text = cache_bytes if cache_bytes is not None else os.environ.get(CACHE_BYTES_ENV)
    path = os.path.abspath(os.fspath(directory))
    found = _caches.get(path)
    if found is None:
        if budget_text:
            budget = parse_budget(budget_text)
        else:
            os.makedirs(path, exist_ok=True)
            budget = shutil.disk_usage(path).free // 2
        found = _caches[path] = ByteCache(path, budget)
    elif budget_text:
        found.budget = parse_budget(budget_text)
    return found


def flush_stats() -> None:
    """Add the counts this process's caches have not yet added to their ``STATS`` files.

    Cheap when there is nothing to add (no lock taken). The loader's workers call it when a
    batch they hand out carries cache counts: persistent workers live across epochs, and
    without it their last second of counts would wait for their exit.
    """
    for cache in list(_caches.values()):
        cache.flush_stats()


def _at_exit() -> None:
    """Write what is queued, add the last counts, hand back each cache's unwritten slab."""
    drain_all()
    for cache in list(_caches.values()):
        cache.flush_stats()
        cache.hand_back()


def _after_fork_in_child() -> None:
    for cache in _caches.values():
        cache.reset_after_fork()
    # a forked multiprocessing child (a DataLoader worker) ends with os._exit, skipping
    # atexit; its finalizers still run, so its last counts reach STATS
    multiprocessing.util.Finalize(None, _at_exit, exitpriority=10)


atexit.register(_at_exit)
after_fork(in_child=_after_fork_in_child, before=drain_all)
