"""Claims: a process about to fetch a range says so, so the node fetches each byte once.

Why: the cache alone cannot stop two processes that miss the same bytes at the same moment
from both fetching them (two ranks whose coalesced reads share gap bytes, two workers
whose windows share an inner chunk): neither has an entry yet. So before fetching, a
process takes a **claim** on each part of its coalesced ranges that no entry and no live
claim covers, and fetches only those parts; the parts another process covers it waits for
and reads from that process's entry.

A claim is an open-file-description byte-range lock (``F_OFD_SETLK``) on one shared file,
``claims/LOCKS``, over the object's bytes: each object has a slot of ``2**40`` offsets in
it (a hash of its entry folder), so a claim on ``[start, end)`` of an object locks
``[slot + start, slot + end)``. Why locks and not a file per claim: creating a file costs a
cold fetch call about 0.3 ms or more on ext4; a lock on a file that exists costs an
``open`` and a few ``fcntl`` calls, and no directory is listed to find the claims of others
(the kernel finds the overlapping locks: ``F_OFD_GETLK``). Each claimed part has its own
descriptor, so two threads of one process conflict as two processes do.

A claim is **live** while its descriptor holds the lock: its owner unlocks it (and keeps
the descriptor for a later claim: ``LockDescriptors``); the kernel drops it when its owner
dies, so a crashed owner never blocks others (no pid checks, which would be
wrong across PID namespaces). An owner stores its entry (write, atomic rename), then releases
its claim; a claimer lists the object's entries only after taking its locks, so a part
whose owner let go before it is found as an entry, not fetched again. A waiter stops
waiting after ``CLAIM_SECONDS`` (an owner stuck in retries) and fetches the bytes itself:
the "at worst twice". Two objects whose slots collide (a 22-bit hash) only make one wait
for the other's fetch and then fetch for itself: slower, never wrong.

No cycle of waits: a process waits only after it has fetched, kept and released all of its
own claims. Suffixes and whole objects (chunk indexes, small index arrays) take no claim:
they are few, read once per process, and at worst fetched twice.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import struct
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from rangestream.io.cache.entries import range_spans
from rangestream.io.ranges import RangeRequest

__all__ = [
    "CLAIMS",
    "CLAIM_SECONDS",
    "LOCKS",
    "Claim",
    "ClaimedParts",
    "LockDescriptors",
    "claim_free_parts",
    "claim_is_live",
    "open_locks",
    "split_covered",
]

#: The directory of claims, under the cache directory, and the file their locks are on.
CLAIMS = "claims"
LOCKS = "LOCKS"
#: A waiter stops waiting for a claim after this long: its owner is stuck.
CLAIM_SECONDS = 60.0
#: Offsets of one object in ``LOCKS``; objects are at most this large (larger ones share
#: their last offset: a claim past it conflicts with any other claim there, never misses).
SLOT_BITS = 40
_SLOTS = 1 << 22
#: ``struct flock`` (Linux, 64-bit): type, whence, start, len, pid (0 for OFD locks).
_FLOCK = "hhqqi4x"

#: A claim as ``(offset, length)`` in ``LOCKS``: what a waiter waits for.
Claim = tuple[int, int]


@dataclass
class ClaimedParts:
    """What ``ByteCache.claim`` decided for a list of ranges about to be fetched.

    ``mine``: parts this process claimed (it fetches them, keeps them, then releases
    ``held``, one descriptor per claim). ``theirs``: parts an entry or another process's
    live claim covers (read from the cache once the claims in ``awaited`` are released).
    """

    mine: list[RangeRequest] = field(default_factory=list)
    theirs: list[RangeRequest] = field(default_factory=list)
    held: list[tuple[Claim, int]] = field(default_factory=list)
    awaited: list[Claim] = field(default_factory=list)


def open_locks(directory: Path) -> int:
    """A new descriptor (a new open file description) of the directory's ``LOCKS``."""
    path = directory / CLAIMS / LOCKS
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _slot(folder: Path) -> int:
    """The first offset of an object's slot in ``LOCKS``."""
    return _slot_of(str(folder))


@functools.lru_cache(maxsize=4096)
def _slot_of(folder: str) -> int:
    digest = hashlib.sha1(folder.encode()).digest()
    return (int.from_bytes(digest[:4], "big") % _SLOTS) << SLOT_BITS


class LockDescriptors:
    """Descriptors of a directory's ``LOCKS``, each its own open file description, reused.

    Why reused: a claim needs a descriptor of its own (its lock is the description's), but
    opening and closing one per claim was two system calls of every cold fetch call. A
    claim given back is unlocked (``F_UNLCK`` over its span) and its descriptor kept for
    the next claim; a descriptor in the pool holds no lock. A forked child closes its copies
    (``forget``): they are its parent's descriptions, whose locks would not conflict with
    the parent's.
    """

    #: Descriptors kept at most (the rest are closed when given back).
    KEPT = 64

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._free: list[int] = []
        self._pid = os.getpid()

    def take(self) -> int:
        """A descriptor holding no lock (list ``pop``: atomic across threads)."""
        if os.getpid() != self._pid:  # forked without ``forget`` (a cache made directly)
            self.forget()
        try:
            return self._free.pop()
        except IndexError:
            return open_locks(self.directory)

    def give(self, fd: int, claim: Claim | None = None) -> None:
        """Unlock ``claim`` (if given) on ``fd`` and keep ``fd`` for a later claim."""
        if claim is not None:
            try:
                _lock(fd, fcntl.F_UNLCK, claim)
            except OSError:
                os.close(fd)  # closing drops the lock too
                return
        if len(self._free) < self.KEPT:
            self._free.append(fd)
        else:
            os.close(fd)

    def close(self) -> None:
        """Close every kept descriptor."""
        while self._free:
            with suppress(OSError, IndexError):
                os.close(self._free.pop())

    def forget(self) -> None:
        """In a forked child: close the copies of the parent's descriptors."""
        self.close()
        self._pid = os.getpid()


def _span(slot: int, start: int, end: int) -> Claim:
    limit = 1 << SLOT_BITS
    low = min(start, limit - 1)
    return slot + low, max(1, min(end, limit) - low)


def _lock(fd: int, kind: int, claim: Claim) -> bool:
    """Set (or clear) a lock without waiting; whether it was set."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, *claim, 0))
    except (BlockingIOError, PermissionError):
        return False
    return True


def _conflict(fd: int, claim: Claim) -> Claim | None:
    """A lock of another open file description over ``claim``, if there is one."""
    asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, *claim, 0)
    kind, _whence, start, length, _pid = struct.unpack(
        _FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, asked)
    )
    if kind == fcntl.F_UNLCK:
        return None
    return start, length if length else (1 << 62)


def claim_is_live(fd: int, claim: Claim) -> bool:
    """Whether another descriptor (a process, a thread's claim) still locks ``claim``;
    ``fd`` is any descriptor of ``LOCKS``."""
    return _conflict(fd, claim) is not None


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


def _lock_free(
    descriptors: LockDescriptors, slot: int, start: int, end: int, parts: ClaimedParts
) -> list:
    """Lock the parts of ``[start, end)`` no other claim covers; ``[(low, high, fd)]``.
    The parts others hold are noted in ``parts.awaited`` and returned as ``(low, high, -1)``.
    """
    done: list[tuple[int, int, int]] = []
    todo = [(start, end)]
    while todo:
        low, high = todo.pop()
        claim = _span(slot, low, high)
        fd = descriptors.take()
        if _lock(fd, fcntl.F_WRLCK, claim):
            done.append((low, high, fd))
            continue
        other = _conflict(fd, claim)
        descriptors.give(fd)  # not locked
        if other is None:
            todo.append((low, high))  # let go of meanwhile: try again
            continue
        their_low = max(low, other[0] - slot)
        their_high = min(high, other[0] + other[1] - slot)
        if their_high <= their_low:  # a collision past the slot's end: wait for it all
            their_low, their_high = low, high
        parts.awaited.append(_span(slot, their_low, their_high))
        done.append((their_low, their_high, -1))
        todo += [(a, b) for a, b in ((low, their_low), (their_high, high)) if a < b]
    return sorted(done)


def claim_free_parts(
    descriptors: LockDescriptors,
    folders: list[Path],
    ranges: list[RangeRequest],
    parts: ClaimedParts,
) -> None:
    """Fill ``parts`` for ``ranges`` (``folders``: each range's entry folder): claim for this
    process the parts no entry and no live claim covers, note the rest and the claims to
    wait for (see the module docstring for the order: locks first, then entries)."""
    spans: dict[Path, list[tuple[int, int]]] = {}
    for request, folder in zip(ranges, folders, strict=True):
        slot = _slot(folder)
        locked = _lock_free(descriptors, slot, request.start, request.end, parts)
        if folder not in spans:
            spans[folder] = range_spans(folder)
        for low, high, fd in locked:
            if fd < 0:
                parts.theirs.append(RangeRequest(request.key, low, high))
                continue
            free, kept = split_covered(low, high, spans[folder])
            for a, b in kept:  # an owner kept it and let go before we locked: read it
                _lock(fd, fcntl.F_UNLCK, _span(slot, a, b))
                parts.theirs.append(RangeRequest(request.key, a, b))
            if not free:
                descriptors.give(fd, _span(slot, low, high))
                continue
            parts.held.append((_span(slot, low, high), fd))
            parts.mine += [RangeRequest(request.key, a, b) for a, b in free]
