"""The byte cache's bound: the directory's lock, its accounted ``SIZE``, slabs, LRU eviction.

Why accounted and not measured: walking every entry per write would cost a directory scan
per fetch. So bytes are added to ``SIZE`` under the directory's ``LOCK`` before they are
written; only when a reservation would pass the budget is the directory scanned, and least
recently used entries (file mtimes: a hit touches its entry) are deleted down to
``LOW_WATER`` of the budget, so scans are rare.

Why slabs: taking the lock and updating ``SIZE`` for every entry cost a cold fetch call
milliseconds on ext4 (replacing ``SIZE`` by rename flushed it: ``auto_da_alloc``). So a
process reserves a **slab** of budget at a time (:func:`slab_bytes`: 1/64 of the budget, at
most 32 MiB, at least the entry) and carves its entries out of it without touching any
shared file; ``SIZE`` is updated in place (one ``pwrite`` of a fixed-width number, no
rename). A slab is backed by a **lease**, ``leases/<pid>-<random>-<nbytes>``, that its owner
holds an exclusive ``flock`` on: an eviction scan counts every live lease whole (the
entries already carved out of it too: an over-count, safe) and deletes the leases nobody
holds. A process hands back what is left of its slab when it takes the next one, when its
cache is turned off and at exit.

Crash safety: a process killed while holding a slab leaves its unused part in ``SIZE``;
the kernel drops its lease's lock, so the next scan (which that leaked part itself brings
forward, since ``SIZE`` reaches the budget sooner) deletes the lease and recomputes
``SIZE`` from the files: the leak lasts until then, never longer.

Bound: entry files, files in ``tmp/`` and live slabs never total more than ``cache_bytes``
(a reservation that does not fit after eviction is refused: the entry is not kept). The
slack on disk is the directories, the small bookkeeping files and the file system's block
rounding (at most one block per entry). Slabs do not add to it: they are reserved budget
not yet written, so they make eviction start earlier (by at most one slab per process),
never the directory larger.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rangestream.io.cache.claims import CLAIMS, LOCKS

__all__ = [
    "LEASES",
    "LOW_WATER",
    "SLAB_FRACTION",
    "SLAB_MAX",
    "STALE_TEMP_SECONDS",
    "evict",
    "hold_lease",
    "lease_is_live",
    "locked",
    "read_size",
    "release_lease",
    "scan_entries",
    "scan_leases",
    "slab_bytes",
    "write_size",
]

#: Eviction frees room down to this fraction of the budget, so scans are rare.
LOW_WATER = 0.9
#: A temporary file older than this belongs to a process that died while writing it.
STALE_TEMP_SECONDS = 3600.0
#: The directory of leases (slabs of budget held by live processes), under the cache's.
LEASES = "leases"
#: A slab is this fraction of the budget (and at most ``SLAB_MAX``, at least one entry).
SLAB_FRACTION = 64
SLAB_MAX = 32 << 20
#: ``SIZE`` holds the accounted bytes as this many decimal digits, rewritten in place.
_SIZE_DIGITS = 20


def slab_bytes(budget: int, nbytes: int) -> int:
    """The budget a process reserves at once to write an entry of ``nbytes``."""
    return max(nbytes, min(budget // SLAB_FRACTION, SLAB_MAX))


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold the directory's ``LOCK`` (an exclusive ``flock``, shared by every process)."""
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_size(directory: Path) -> int:
    """The accounted bytes (0 when ``SIZE`` is missing or unreadable)."""
    try:
        return int((directory / "SIZE").read_bytes().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_size(directory: Path, nbytes: int) -> None:
    """Rewrite ``SIZE`` in place: one ``pwrite`` of a fixed-width number (no rename, which
    on ext4 flushes the file; every reader and writer of ``SIZE`` holds the lock)."""
    fd = os.open(directory / "SIZE", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, b"%0*d" % (_SIZE_DIGITS, max(0, nbytes)), 0)
    finally:
        os.close(fd)


def hold_lease(directory: Path, nbytes: int) -> tuple[str, int]:
    """Make and lock a new lease of ``nbytes``; ``(path, fd)``. Call under ``locked``."""
    where = directory / LEASES
    path = str(where / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{nbytes}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # a directory made before leases existed
        where.mkdir(exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    return path, fd


def release_lease(path: str, fd: int) -> None:
    """Delete a lease, then unlock it. Call under ``locked`` (with ``SIZE`` updated)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # a scan took it for a dead process's (it cannot while locked; defensive)
    finally:
        os.close(fd)


def lease_is_live(path: str) -> bool:
    """Whether some process holds the lease at ``path`` (its lock goes when it dies)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def scan_leases(directory: Path) -> int:
    """The bytes of the live leases; the leases of dead processes are deleted on the way.
    Call under ``locked`` (a lease is made and released under it, so none is missed)."""
    held = 0
    with suppress(FileNotFoundError):
        for lease in os.scandir(directory / LEASES):
            if lease_is_live(lease.path):
                held += int(lease.name.rsplit("-", 1)[-1] or 0)
            else:
                with suppress(FileNotFoundError):
                    os.unlink(lease.path)
    return held


def evict(directory: Path, target: int, forgotten: set[str]) -> int:
    """Delete the least recently used entries until the directory's files and live leases
    total ``<= target`` (or no entry is left); that total.

    Each deleted entry's path is discarded from ``forgotten`` (the caller's set of entries
    it has checked). Call under ``locked``.
    """
    held = scan_leases(directory)
    entries, temps = scan_entries(directory)
    used = held + temps + sum(size for _mtime, size, _path in entries)
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
    with suppress(FileNotFoundError):  # claim files of older versions, left by dead processes
        for claim in os.scandir(directory / CLAIMS):
            if claim.name == LOCKS:  # the claims' lock file: it must stay (``claims``)
                continue
            with suppress(FileNotFoundError):
                if now - claim.stat().st_mtime > STALE_TEMP_SECONDS:
                    os.unlink(claim.path)
    entries: list[tuple[float, int, Path]] = []
    for dataset in os.scandir(directory):
        if not dataset.is_dir() or dataset.name in ("tmp", CLAIMS, LEASES):
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
