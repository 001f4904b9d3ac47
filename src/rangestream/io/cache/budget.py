"""The byte cache's bound: the directory's lock, its accounted ``SIZE``, and LRU eviction.

Why accounted and not measured: walking every entry per write would cost a directory scan
per fetch. So the bytes of entries and of files in ``tmp/`` are added to ``SIZE`` under the
directory's ``LOCK`` before a file is written; only when a write would pass the budget is
the directory scanned, and least recently used entries (file mtimes: a hit touches its
entry) are deleted down to ``LOW_WATER`` of the budget, so scans are rare. Entry files
therefore never total more than ``cache_bytes``; the slack on disk is the directories, the
small bookkeeping files and the file system's block rounding (at most one block per entry).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rangestream.io.cache.claims import CLAIMS
from rangestream.io.cache.entries import temp_path

__all__ = [
    "LOW_WATER",
    "STALE_TEMP_SECONDS",
    "evict",
    "locked",
    "read_size",
    "scan_entries",
    "write_size",
]

#: Eviction frees room down to this fraction of the budget, so scans are rare.
LOW_WATER = 0.9
#: A temporary file older than this belongs to a process that died while writing it.
STALE_TEMP_SECONDS = 3600.0


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the directory's ``LOCK`` (an exclusive ``flock``, shared by every process)."""
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_size(directory: Path) -> int:
    """The accounted bytes (0 when ``SIZE`` is missing or unreadable)."""
    try:
        return int((directory / "SIZE").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_size(directory: Path, nbytes: int) -> None:
    """Replace ``SIZE`` whole (renamed into place), so a reader never sees it empty."""
    temp = temp_path(directory, 0)
    temp.write_text(str(nbytes))
    os.replace(temp, directory / "SIZE")


def evict(directory: Path, target: int, forgotten: set[str]) -> int:
    """Delete the least recently used entries until they total ``<= target``; the total.

    Each deleted entry's path is discarded from ``forgotten`` (the caller's set of entries
    it has checked). Call under ``locked``.
    """
    entries, temps = scan_entries(directory)
    used = temps + sum(size for _mtime, size, _path in entries)
    entries.sort()
    for _mtime, size, path in entries:
        if used <= target:
            break
        with suppress(FileNotFoundError):
            os.unlink(path)
        forgotten.discard(str(path))
        used -= size
    return used


def scan_entries(directory: Path) -> tuple[list[tuple[float, int, Path]], int]:
    """Every entry as ``(mtime, size, path)``, and the bytes reserved by files in ``tmp/``.

    Temporary files of a dead writer (older than an hour) are deleted on the way.
    """
    # files in transit first: one renamed between the two walks is then counted twice (an
    # over-count, safe), never missed
    temps = 0
    now = time.time()
    for temp in os.scandir(directory / "tmp"):
        try:
            if now - temp.stat().st_mtime > STALE_TEMP_SECONDS:
                os.unlink(temp.path)
                continue
        except FileNotFoundError:
            continue
        temps += int(temp.name.rsplit("-", 1)[-1] or 0)
    with suppress(FileNotFoundError):  # claims of processes that died long ago
        for claim in os.scandir(directory / CLAIMS):
            with suppress(FileNotFoundError):
                if now - claim.stat().st_mtime > STALE_TEMP_SECONDS:
                    os.unlink(claim.path)
    entries: list[tuple[float, int, Path]] = []
    for dataset in os.scandir(directory):
        if not dataset.is_dir() or dataset.name in ("tmp", CLAIMS):
            continue
        for commit in os.scandir(dataset.path):
            if not commit.is_dir():
                continue
            for obj in os.scandir(commit.path):
                for entry in os.scandir(obj.path):
                    try:
                        info = entry.stat()
                    except FileNotFoundError:
                        continue
                    entries.append((info.st_mtime, info.st_size, Path(entry.path)))
    return entries, temps
