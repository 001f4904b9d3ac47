"""A node-local cache of exactly the byte ranges reads fetched, shared through one directory.

Why a range cache and not a shard cache: a window of 8 KiB read out of a 4 MiB block should
cost 8 KiB of local disk, not the block (LitData and Energon cache whole chunks; MosaicML
whole shards, re-downloaded every epoch when they do not fit). The range reader asks this
cache for each request before it coalesces, and hands it every coalesced range it fetched.

Why it can never be stale: only keys under ``data/<commit>/`` are cached, and a committed
version is immutable (format.md); the root ``zarr.json``, which names the commit, is never
cached. Entries are keyed by the dataset's URL (hashed), the commit, the object and the range.

Layout of a cache directory::

    LOCK  SIZE  STATS                       flock'ed lock; accounted bytes; hit counts (JSON)
    tmp/<pid>-<random>-<nbytes>             entries being written (renamed into place)
    leases/<pid>-<random>-<nbytes>          slabs of budget held by live processes (``budget``)
    claims/LOCKS                            byte-range locks: ranges being fetched (``claims``)
    <dataset id>/URL                        the dataset's URL, for ``rangestream cache``
    <dataset id>/<commit>/<object>/r<start>-<end>   a fetched range of one object
    <dataset id>/<commit>/<object>/s<n>              its last n bytes (a chunk index)
    <dataset id>/<commit>/<object>/o<max>            a whole small object

The modules: ``entries`` (names, the header, the CRC check), ``reading`` (the pieces of a
range, each entry checked once), ``budget`` (the lock, ``SIZE``, eviction), ``counts``
(``STATS``), ``claims`` (who fetches what); this one is the facade a process uses, with its
per-process state (claims it holds, counts not yet in ``STATS``).

An entry is written to ``tmp/`` and renamed into place, so a reader never sees a partial
entry. The first time a process uses an entry it reads it whole and checks its length and
CRC; a bad entry is deleted, counted (``cache_dropped``) and the range fetched again. The
executors check every inner chunk's crc32c on the bytes handed out, as for remote reads.

Bound: see ``budget``: entry files never total more than ``cache_bytes``; a process
reserves budget a slab at a time, so most entries it writes touch no shared file. Two processes
missing the same range at once fetch it once: the first claims it (``claims``) and the
second waits for its entry; at worst (a claim older than a minute, a suffix) twice, never
torn: the second rename replaces the first.

A process that verified an entry reads it again without its CRC; if the entry is damaged
since (overwritten in place), the executor's inner-chunk checksums fail on those bytes and
it asks the cache to ``forget`` the range (the entries are dropped, counted) and fetches it
again from the store, so the training loop never sees the damage.

Any OS error writing (a full disk, a read-only mount) turns the cache off for this process
with one warning; training goes on reading the store.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from rangestream.io.cache.budget import (
    LEASES,
    LOW_WATER,
    evict,
    hold_lease,
    locked,
    release_lease,
    scan_entries,
    slab_bytes,
    write_size,
)
from rangestream.io.cache.budget import read_size as _read_size
from rangestream.io.cache.claims import (
    CLAIMS,
    Claim,
    ClaimedParts,
    LockDescriptors,
    claim_free_parts,
    claim_is_live,
    open_locks,
)
from rangestream.io.cache.counts import add_to_stats, read_stats
from rangestream.io.cache.entries import (
    HEADER,
    RANGE_ENTRY,
    dataset_id,
    entry_name,
    is_cacheable_key,
    object_folder,
    temp_path,
    write_entry,
)
from rangestream.io.cache.reading import EntryReader, Pieces
from rangestream.io.cache.writer import EntryWriter
from rangestream.io.ranges import ByteRequest, RangeRequest

__all__ = [
    "HEADER",
    "ByteCache",
    "dataset_id",
    "is_cacheable_key",
    "read_stats",
    "scan_entries",
]

#: How often a process adds its hit counts to ``STATS`` while it reads (the loader's
#: workers also add theirs at every batch: ``flush_stats``).
STATS_FLUSH_SECONDS = 1.0
#: Object folders remembered per cache (then forgotten at once, and remembered again).
_FOLDERS_KEPT = 1 << 16


class ByteCache:
    """One cache directory as seen by this process (one object per directory and process).

    Parameters
    ----------
    directory
        The directory every process of the node shares.
    budget
        Upper bound on the bytes of its entry files.
    """

    def __init__(self, directory: str | os.PathLike[str], budget: int) -> None:
        self.directory = Path(directory)
        self.budget = budget
        self.enabled = True
        self._entries = EntryReader(_weak(self, "_drop"))
        self._writer = EntryWriter()
        self._known_urls: set[str] = set()
        #: hits, misses, bytes served, entries dropped: not yet added to STATS.
        self._pending = [0, 0, 0, 0]
        self._mutex = threading.Lock()
        self._flushed_at = time.monotonic()
        #: This process's claims being fetched: fd -> claim (closed in a forked child), and
        #: a descriptor of ``claims/LOCKS`` to look at others' claims with (no lock on it).
        self._held: dict[int, Claim] = {}
        self._probe: int | None = None
        self._locks = LockDescriptors(self.directory)
        #: ``(url, key)`` -> the object's entry folder (two hashes and paths per call saved)
        self._folders: dict[tuple[str, str], Path] = {}
        #: Budget reserved and not yet written (``budget``), and the lease backing it.
        self._slab = 0
        self._lease: tuple[str, int] | None = None
        self._slab_mutex = threading.Lock()
        self.directory.mkdir(parents=True, exist_ok=True)
        for child in ("tmp", CLAIMS, LEASES):
            (self.directory / child).mkdir(exist_ok=True)
        if not (self.directory / "SIZE").exists():  # there from the start, for every reader
            with locked(self.directory):
                if not (self.directory / "SIZE").exists():
                    write_size(self.directory, 0)

    # -- reading --------------------------------------------------------------------------
    def lookup(self, url: str, request: ByteRequest, counts: list[int]) -> bytes | None:
        """The bytes of ``request`` if the cache holds them all, else ``None`` (a miss).

        ``counts`` is the reader's ``[hits, misses, bytes served, dropped]``, bumped here.
        """
        if isinstance(request, RangeRequest):
            pieces, holes = self.lookup_range(url, request, counts)
            if holes or not pieces:
                return None
            return pieces[0][1] if len(pieces) == 1 else b"".join(p for _, p in pieces)
        if not self.enabled:
            return None
        self._writer.wait_for(request.key)
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            data = self._entries.whole(folder / entry_name(request))
        except OSError as error:
            self._disable(f"reading {folder}", error)
            data = None
        counts[3] += self._pending[3] - before
        self._count(counts, data is not None, 0 if data is None else len(data))
        return data

    def lookup_range(self, url: str, request: RangeRequest, counts: list[int]) -> Pieces:
        """What the cache holds of a range, as ``(offset, bytes)`` pieces, and the holes.

        A hit has no holes; a miss names the byte ranges still to fetch (so bytes another
        read already kept are not fetched again). Counts a hit or a miss in ``counts``.
        """
        if not self.enabled:
            return [], [(request.start, request.end)]
        pieces, holes = self._pieces(url, request, counts)
        self._count(counts, not holes, sum(len(p) for _, p in pieces))
        return pieces, holes

    def kept(self, url: str, request: RangeRequest, counts: list[int]) -> Pieces:
        """``lookup_range`` for a part another process fetched for this request: its bytes
        count as served from the cache, the request was counted (a miss) already."""
        if not self.enabled:
            return [], [(request.start, request.end)]
        pieces, holes = self._pieces(url, request, counts)
        served = sum(len(p) for _, p in pieces)
        with self._mutex:
            self._pending[2] += served
            counts[2] += served
        return pieces, holes

    def _pieces(self, url: str, request: RangeRequest, counts: list[int]) -> Pieces:
        """The pieces and holes of a range (an error reading turns the cache off: a miss)."""
        # what this process is still writing of these bytes
        self._writer.wait_for(request.key, request.start, request.end)
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            pieces, holes = self._entries.assemble(folder, request.start, request.end)
        except OSError as error:
            self._disable(f"reading {folder}", error)
            pieces, holes = [], [(request.start, request.end)]
        counts[3] += self._pending[3] - before
        return pieces, holes

    def forget(self, url: str, request: ByteRequest, counts: list[int]) -> None:
        """Drop every entry holding bytes of ``request`` (counted): its bytes were found
        damaged after the entry's first check, so the next read fetches them again."""
        if not self.enabled or not is_cacheable_key(request.key):
            return
        self._writer.wait_for(request.key)  # entries of it still queued are dropped too
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        self._entries.forget_listings(str(folder))
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        except OSError as error:
            self._disable(f"reading {folder}", error)
            return
        for name in names:
            path = folder / name
            match = RANGE_ENTRY.match(name)
            if isinstance(request, RangeRequest):
                if match is None:
                    continue
                low, high = int(match.group(1)), int(match.group(2))
                if not (low < request.end and high > request.start):
                    continue
                size = HEADER + high - low  # as accounted when written
            elif name != entry_name(request):
                continue
            else:
                try:
                    size = os.path.getsize(path)
                except FileNotFoundError:
                    continue
            self._entries.verified.discard(str(path))
            self._drop(path, size)
        counts[3] += self._pending[3] - before

    def _count(self, counts: list[int], hit: bool, served: int) -> None:
        """One request: a hit (``served`` bytes from disk) or a miss (partial pieces too)."""
        with self._mutex:
            if hit:
                self._pending[0] += 1
                counts[0] += 1
            else:
                self._pending[1] += 1
                counts[1] += 1
            self._pending[2] += served
            counts[2] += served
        now = time.monotonic()
        if now - self._flushed_at > STATS_FLUSH_SECONDS:
            # DataLoader workers end without atexit: their counts reach STATS as they go
            self._flushed_at = now
            self.flush_stats()

    # -- claims ---------------------------------------------------------------------------
    def claim(self, url: str, ranges: list[RangeRequest]) -> ClaimedParts:
        """Decide who fetches what of ``ranges`` (misses about to be fetched): the parts no
        entry and no other live claim covers are claimed for this process (``mine``); the
        rest (``theirs``) is read from the cache after waiting for ``awaited``.

        Release the claims with ``release`` once ``mine`` is fetched and kept.
        """
        if not self.enabled or not ranges:
            return ClaimedParts(mine=list(ranges))
        parts = ClaimedParts()
        folders = [self._object_folder(url, request.key) for request in ranges]
        try:
            claim_free_parts(self._locks, folders, ranges, parts)
        except OSError as error:
            self._track(parts)
            self.release(parts)
            self._disable(f"claiming ranges in {self.directory}", error)
            return ClaimedParts(mine=list(ranges))
        self._track(parts)
        return parts

    def _track(self, parts: ClaimedParts) -> None:
        """Note the claims of ``parts`` as this process's (closed in a forked child)."""
        for claim, fd in parts.held:
            self._held[fd] = claim

    def release(self, parts: ClaimedParts) -> None:
        """Release this process's claims of ``parts`` (after keeping what they fetched)."""
        for claim, fd in parts.held:
            if self._held.pop(fd, None) is not None:
                self._locks.give(fd, claim)  # unlocked, kept for a later claim
        parts.held = []

    def claim_is_live(self, claim: Claim) -> bool:
        """Whether another process (or another claim of this one) still locks ``claim``."""
        if self._probe is None:
            self._probe = open_locks(self.directory)
        return claim_is_live(self._probe, claim)

    # -- writing --------------------------------------------------------------------------
    def keep_later(
        self, url: str, entries: list[tuple[ByteRequest, bytes | memoryview]], parts: ClaimedParts
    ) -> None:
        """Keep ``entries`` (what one fetch call fetched) and then release ``parts``, on this
        cache's writer thread (``writer``): the call does not wait for the files."""
        if not self.enabled:
            self.release(parts)
            return
        self._writer.submit(self, url, entries, parts)

    def drain(self) -> None:
        """Wait until every entry handed to ``keep_later`` is written."""
        self._writer.drain()

    def store(self, url: str, request: ByteRequest, data: bytes | memoryview) -> None:
        """Keep the bytes fetched for ``request`` (a coalesced range, a suffix, an object)."""
        if not self.enabled:
            return
        nbytes = HEADER + len(data)
        if nbytes > self.budget:
            return
        folder = self._object_folder(url, request.key)
        temp = temp_path(self.directory, nbytes)
        try:
            self._remember_url(url)
            if not self._reserve(nbytes):
                return  # no room even after eviction (others' slabs and writes): not kept
        except OSError as error:
            self._disable(f"making room in {self.directory}", error)
            return
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                write_entry(fd, data)
            finally:
                os.close(fd)
            name = entry_name(request)
            final = f"{folder}/{name}"
            try:
                os.replace(temp, final)  # a new name: no flush (checked on first use)
            except FileNotFoundError:
                folder.mkdir(parents=True, exist_ok=True)
                os.replace(temp, final)
            if isinstance(request, RangeRequest):
                self._entries.wrote(str(folder), request.start, request.end, name)
        except OSError as error:
            # the cache is being turned off for this process: a failed clean-up of its
            # own temp file leaves at most that file, which the next eviction scan removes
            with suppress(OSError):
                temp.unlink(missing_ok=True)
            with self._slab_mutex:
                self._slab += nbytes  # not written: back to the slab, handed back below
            self._disable(f"writing {temp}", error)

    def _remember_url(self, url: str) -> None:
        if url in self._known_urls:
            return
        folder = self.directory / dataset_id(url)
        folder.mkdir(exist_ok=True)
        marker = folder / "URL"
        if not marker.exists():
            temp = temp_path(self.directory, 0)
            temp.write_text(url.rstrip("/") + "\n")
            os.replace(temp, marker)
        self._known_urls.add(url)

    def _reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` of budget for an entry about to be written; whether there was room.

        Out of this process's slab when it holds enough (no shared file touched), else a
        new slab is reserved under the lock, evicting LRU entries for room (``budget``).
        """
        with self._slab_mutex:
            if self._slab >= nbytes:
                self._slab -= nbytes
                return True
            with locked(self.directory):
                used = _read_size(self.directory) - self._slab  # what is left goes back
                if self._lease is not None:
                    release_lease(*self._lease)
                    self._lease, self._slab = None, 0
                slab = slab_bytes(self.budget, nbytes)
                if used + slab > self.budget:
                    target = int(self.budget * LOW_WATER) - slab
                    used = evict(self.directory, target, self._entries.verified)
                    self._entries.forget_listings()  # entries deleted
                    if used + slab > self.budget:
                        slab = max(nbytes, self.budget - used)  # a smaller slab fits
                        if used + slab > self.budget:
                            write_size(self.directory, used)
                            return False
                self._lease = hold_lease(self.directory, slab)
                write_size(self.directory, used + slab)
                self._slab = slab - nbytes
                return True

    def hand_back(self) -> None:
        """Give the unwritten rest of this process's slab back to the directory (at exit,
        when the cache is turned off): others may use it before the next scan."""
        with self._slab_mutex:
            if self._lease is None:
                return
            with suppress(OSError), locked(self.directory):
                write_size(self.directory, _read_size(self.directory) - self._slab)
                release_lease(*self._lease)
            self._lease, self._slab = None, 0

    def __del__(self) -> None:
        # a cache object let go of (a test, a reader's own cache) frees its slab and lease
        # descriptor now rather than at the next scan
        with suppress(Exception):
            self._writer.drain()
            self.hand_back()
        with suppress(Exception):
            self._locks.close()

    def _drop(self, path: str | Path, size: int) -> None:
        """Delete a damaged entry (counted), so the range is fetched again."""
        with self._mutex:
            self._pending[3] += 1
        self._entries.forget_listings(os.path.dirname(path))
        try:
            with locked(self.directory):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    return  # another process dropped it first
                write_size(self.directory, max(0, _read_size(self.directory) - size))
        except OSError as error:
            self._disable(f"dropping {path}", error)

    # -- counts ---------------------------------------------------------------------------
    def flush_stats(self) -> None:
        """Add this process's hits and misses to the directory's ``STATS`` file."""
        if not self.enabled or not any(self._pending):
            return
        self._flushed_at = time.monotonic()
        # the counts are for people (``rangestream cache``): a directory that cannot take
        # them loses this flush's counts rather than failing a read
        with suppress(OSError), locked(self.directory):
            self._flush_stats_locked()

    def _flush_stats_locked(self) -> None:
        with self._mutex:
            pending, self._pending = self._pending, [0, 0, 0, 0]
        if any(pending):
            add_to_stats(self.directory, pending)

    # -- state ----------------------------------------------------------------------------
    def _object_folder(self, url: str, key: str) -> Path:
        found = self._folders.get((url, key))
        if found is None:
            if len(self._folders) >= _FOLDERS_KEPT:
                self._folders.clear()
            found = self._folders[url, key] = object_folder(self.directory, url, key)
        return found

    def _disable(self, what: str, error: OSError) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self.hand_back()
        full = " (the disk is full)" if error.errno == errno.ENOSPC else ""
        warnings.warn(
            f"rangestream: the byte cache at {self.directory} is off for this process: "
            f"{what} failed{full}: {error}; reads go to the store",
            RuntimeWarning,
            stacklevel=2,
        )

    def reset_after_fork(self) -> None:
        """A forked child counts from zero (its parent flushes its own counts)."""
        self._pending = [0, 0, 0, 0]
        self._mutex = threading.Lock()
        # the parent's claims stay locked by the parent alone: closing the child's copies
        # of their descriptors leaves the lock with the parent's open description
        for fd in self._held:
            with suppress(OSError):
                os.close(fd)
        self._held = {}
        self._locks.forget()
        self._writer.reset_after_fork()
        # the parent's slab is the parent's to spend: the child reserves its own
        self._slab_mutex = threading.Lock()
        if self._lease is not None:
            with suppress(OSError):
                os.close(self._lease[1])
        self._lease, self._slab = None, 0


def _weak(cache: ByteCache, name: str) -> Callable[..., None]:
    """``cache.<name>`` without a reference to ``cache`` (no cycle: a cache let go of is
    freed at once, and hands back its slab)."""
    ref = weakref.ref(cache)

    def call(*args: object) -> None:
        found = ref()
        if found is not None:
            getattr(found, name)(*args)

    return call
