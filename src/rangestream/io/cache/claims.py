"""Claims: a process about to fetch a range says so, so the node fetches each byte once.

Why: the cache alone cannot stop two processes that miss the same bytes at the same moment
from both fetching them (two ranks whose coalesced reads share gap bytes, two workers
whose windows share an inner chunk): neither has an entry yet. So before fetching, a
process takes, under the directory's ``LOCK``, a **claim** on each part of its coalesced
ranges that no entry and no live claim covers, and fetches only those parts; the parts
another process covers it waits for and reads from that process's entry.

A claim is a file ``claims/<object tag>-<start>-<end>-<random>`` that its owner holds an
exclusive ``flock`` on while it fetches. It is **live** while that lock is held: the kernel
drops the lock when the owner closes it or dies, so a crashed owner never blocks others (no
pid checks, which would be wrong across PID namespaces). An owner stores its entry (write,
atomic rename), then deletes its claim, then closes it: a process that finds no claim
under the lock therefore finds the entry. A claim older than ``CLAIM_SECONDS`` is ignored
(an owner stuck in retries): the waiter fetches the bytes itself, the "at worst twice".

No cycle of waits: a process waits only after it has fetched, kept and released all of its
own claims. Suffixes and whole objects (chunk indexes, small index arrays) take no claim:
they are few, read once per process, and at worst fetched twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from rangestream.io.cache.entries import range_spans
from rangestream.io.ranges import RangeRequest

__all__ = [
    "CLAIMS",
    "CLAIM_SECONDS",
    "ClaimedParts",
    "claim_free_parts",
    "claim_is_live",
    "hold_claim",
    "object_tag",
    "read_claims",
    "release_claim",
    "split_covered",
]

#: The directory of claims, under the cache directory.
CLAIMS = "claims"
#: A claim older than this is ignored: its owner is stuck, the waiter fetches for itself.
CLAIM_SECONDS = 60.0


@dataclass
class ClaimedParts:
    """What ``ByteCache.claim`` decided for a list of ranges about to be fetched.

    ``mine``: parts this process claimed (it fetches them, keeps them, then releases
    ``held``). ``theirs``: parts an entry or another process's live claim covers (read from
    the cache once the claims in ``awaited`` are released).
    """

    mine: list[RangeRequest] = field(default_factory=list)
    theirs: list[RangeRequest] = field(default_factory=list)
    held: list[tuple[str, int]] = field(default_factory=list)
    awaited: list[str] = field(default_factory=list)


def object_tag(folder: Path) -> str:
    """A short name for an object's entry folder, for its claims' file names."""
    return hashlib.sha1(str(folder).encode()).hexdigest()[:16]


def read_claims(directory: Path) -> dict[str, list[tuple[int, int, str]]]:
    """Every claim file as ``tag -> [(start, end, path)]`` (live or not)."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name in os.listdir(directory):
        parts = name.split("-")
        if len(parts) != 4 or not (parts[1].isdigit() and parts[2].isdigit()):
            continue
        found.setdefault(parts[0], []).append((int(parts[1]), int(parts[2]), str(directory / name)))
    return found


def claim_is_live(path: str, now: float | None = None) -> bool:
    """Whether the claim at ``path`` is held by a process (and young enough to wait for)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # released
    try:
        if (time.time() if now is None else now) - os.fstat(fd).st_mtime > CLAIM_SECONDS:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # nobody holds it: its owner closed it or died
    finally:
        os.close(fd)


def hold_claim(directory: Path, tag: str, start: int, end: int) -> tuple[str, int]:
    """Make and lock a new claim; ``(path, fd)`` (the lock lasts until ``fd`` is closed)."""
    path = str(directory / f"{tag}-{start}-{end}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return path, fd


def release_claim(path: str, fd: int) -> None:
    """Delete a claim, then unlock it (in that order: see the module docstring)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # taken as stale (too old) and deleted by another process
    finally:
        os.close(fd)


def split_covered(
    start: int, end: int, covered: list[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``[start, end)`` cut into the parts ``covered`` does not cover and those it does."""
    free: list[tuple[int, int]] = []
    taken: list[tuple[int, int]] = []
    at = start
    for low, high in sorted(covered):
        if high <= at or low >= end:
            continue
        if low > at:
            free.append((at, low))
            at = low
        upto = min(high, end)
        if upto > at:
            taken.append((at, upto))
            at = upto
    if at < end:
        free.append((at, end))
    return free, taken


def claim_free_parts(
    directory: Path,
    folders: list[Path],
    ranges: list[RangeRequest],
    parts: ClaimedParts,
) -> None:
    """Fill ``parts`` for ``ranges`` (``folders``: each range's entry folder): claim for this
    process the parts no entry and no live claim covers, note the rest and the claims to
    wait for. Call under the directory's lock (see the module docstring for why)."""
    where = directory / CLAIMS
    claims = read_claims(where)
    now = time.time()
    live: dict[str, bool] = {}
    spans: dict[Path, list[tuple[int, int]]] = {}
    for request, folder in zip(ranges, folders, strict=True):
        tag = object_tag(folder)
        covered = []
        for low, high, path in claims.get(tag, ()):
            if low < request.end and high > request.start:
                if path not in live:
                    live[path] = claim_is_live(path, now)
                    if live[path]:
                        parts.awaited.append(path)
                    else:
                        with suppress(FileNotFoundError):
                            os.unlink(path)  # released or abandoned
                if live[path]:
                    covered.append((low, high))
        if folder not in spans:
            spans[folder] = range_spans(folder)
        covered += spans[folder]
        free, taken = split_covered(request.start, request.end, covered)
        for low, high in free:
            parts.held.append(hold_claim(where, tag, low, high))
            parts.mine.append(RangeRequest(request.key, low, high))
        parts.theirs += [RangeRequest(request.key, low, high) for low, high in taken]
