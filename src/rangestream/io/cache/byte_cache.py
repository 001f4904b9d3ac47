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
    claims/<object tag>-<start>-<end>-<random>    ranges being fetched (``claims``)
    <dataset id>/URL                        the dataset's URL, for ``rangestream cache``
    <dataset id>/<commit>/<object>/r<start>-<end>   a fetched range of one object
    <dataset id>/<commit>/<object>/s<n>              its last n bytes (a chunk index)
    <dataset id>/<commit>/<object>/o<max>            a whole small object

(``<object>`` is the key under the commit, ``/`` written as ``~``.) An entry is an 8-byte
header (``RSC1`` and the CRC-32C of the payload) and the payload. It is written to ``tmp/``
and renamed into place, so a reader never sees a partial entry. The first time a process
uses an entry it reads it whole and checks its length and CRC; a bad entry is deleted,
counted (``cache_dropped``) and the range fetched again. The executors check every inner
chunk's crc32c on the bytes handed out, as for remote reads.

Bound: the bytes of entries and of files in ``tmp/`` are accounted in ``SIZE`` under the lock
before a file is written, evicting least recently used entries (file mtimes; a hit touches
its entry) down to 90% of the budget when needed, so entry files never total more than
``cache_bytes``. The slack on disk is the directories, the three small files and the file
system's block rounding (at most one block per entry). Two processes missing the same range
at once fetch it once: the first claims it (``claims``) and the second waits for its entry;
at worst (a claim older than a minute, a suffix) twice, never torn: the second rename
replaces the first.

A process that verified an entry reads it again without its CRC; if the entry is damaged
since (overwritten in place), the executor's inner-chunk checksums fail on those bytes and
it asks the cache to ``forget`` the range (the entries are dropped, counted) and fetches it
again from the store, so the training loop never sees the damage.

Any OS error writing (a full disk, a read-only mount) turns the cache off for this process
with one warning; training goes on reading the store.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import struct
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import google_crc32c

from rangestream.io.cache.claims import (
    CLAIMS,
    ClaimedParts,
    claim_is_live,
    hold_claim,
    object_tag,
    read_claims,
    release_claim,
    split_covered,
)
from rangestream.io.ranges import ByteRequest, ObjectRequest, RangeRequest, SuffixRequest

__all__ = [
    "HEADER",
    "ByteCache",
    "dataset_id",
    "is_cacheable_key",
    "read_stats",
    "scan_entries",
]

MAGIC = b"RSC1"
#: Bytes before an entry's payload: the magic and the payload's CRC-32C.
HEADER = 8
#: Eviction frees room down to this fraction of the budget, so scans are rare.
LOW_WATER = 0.9
#: A temporary file older than this belongs to a process that died while writing it.
STALE_TEMP_SECONDS = 3600.0
#: How often a process adds its hit counts to ``STATS``.
STATS_FLUSH_SECONDS = 1.0

_IMMUTABLE = re.compile(r"^data/([0-9a-f]{32})/(.+)$")
_RANGE_ENTRY = re.compile(r"^r(\d+)-(\d+)$")


def is_cacheable_key(key: str) -> bool:
    """Whether ``key`` belongs to a committed version (immutable), so it may be cached."""
    return _IMMUTABLE.match(key) is not None


def dataset_id(url: str) -> str:
    """The directory name of a dataset's entries: a hash of its URL."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:20]


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
        self._verified: set[str] = set()
        self._known_urls: set[str] = set()
        #: hits, misses, bytes served, entries dropped: not yet added to STATS.
        self._pending = [0, 0, 0, 0]
        self._mutex = threading.Lock()
        self._flushed_at = time.monotonic()
        #: This process's claims being fetched: fd -> path (closed in a forked child).
        self._held: dict[int, str] = {}
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "tmp").mkdir(exist_ok=True)
        (self.directory / CLAIMS).mkdir(exist_ok=True)

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
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            data = self._whole(folder / _entry_name(request))
        except OSError as error:
            self._disable(f"reading {folder}", error)
            data = None
        counts[3] += self._pending[3] - before
        self._count(counts, data is not None, 0 if data is None else len(data))
        return data

    def lookup_range(
        self, url: str, request: RangeRequest, counts: list[int]
    ) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
        """What the cache holds of a range, as ``(offset, bytes)`` pieces, and the holes.

        A hit has no holes; a miss names the byte ranges still to fetch (so bytes another
        read already kept are not fetched again). Counts a hit or a miss in ``counts``.
        """
        if not self.enabled:
            return [], [(request.start, request.end)]
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            pieces, holes = self._assemble(folder, request.start, request.end)
        except OSError as error:
            self._disable(f"reading {folder}", error)
            pieces, holes = [], [(request.start, request.end)]
        counts[3] += self._pending[3] - before
        self._count(counts, not holes, sum(len(p) for _, p in pieces))
        return pieces, holes

    def kept(
        self, url: str, request: RangeRequest, counts: list[int]
    ) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
        """``lookup_range`` for a part another process fetched for this request: its bytes
        count as served from the cache, the request was counted (a miss) already."""
        if not self.enabled:
            return [], [(request.start, request.end)]
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            pieces, holes = self._assemble(folder, request.start, request.end)
        except OSError as error:
            self._disable(f"reading {folder}", error)
            pieces, holes = [], [(request.start, request.end)]
        served = sum(len(p) for _, p in pieces)
        with self._mutex:
            counts[3] += self._pending[3] - before
            self._pending[2] += served
            counts[2] += served
        return pieces, holes

    def forget(self, url: str, request: ByteRequest, counts: list[int]) -> None:
        """Drop every entry holding bytes of ``request`` (counted): its bytes were found
        damaged after the entry's first check, so the next read fetches them again."""
        if not self.enabled or not is_cacheable_key(request.key):
            return
        before = self._pending[3]
        folder = self._object_folder(url, request.key)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        except OSError as error:
            self._disable(f"reading {folder}", error)
            return
        for name in names:
            path = folder / name
            match = _RANGE_ENTRY.match(name)
            if isinstance(request, RangeRequest):
                if match is None:
                    continue
                low, high = int(match.group(1)), int(match.group(2))
                if not (low < request.end and high > request.start):
                    continue
                size = HEADER + high - low  # as accounted when written
            elif name != _entry_name(request):
                continue
            else:
                try:
                    size = os.path.getsize(path)
                except FileNotFoundError:
                    continue
            self._verified.discard(str(path))
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

    def _assemble(
        self, folder: Path, start: int, end: int
    ) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return [], [(start, end)]
        spans = []
        for name in names:
            match = _RANGE_ENTRY.match(name)
            if match is not None:
                low, high = int(match.group(1)), int(match.group(2))
                if low < end and high > start:
                    spans.append((low, high, name))
        pieces: list[tuple[int, bytes]] = []
        holes: list[tuple[int, int]] = []
        at = start
        while at < end:
            best = None
            for low, high, name in spans:
                if low <= at < high and (best is None or high > best[1]):
                    best = (low, high, name)
            if best is None:  # a hole up to the next entry that starts later
                upto = min([low for low, _h, _n in spans if low > at] + [end])
                holes.append((at, upto))
                at = upto
                continue
            low, high, name = best
            upto = min(high, end)
            piece = self._slice(folder / name, high - low, at - low, upto - at)
            if piece is None:  # dropped as damaged (or evicted): fetched again
                spans.remove(best)
                continue
            pieces.append((at, piece))
            at = upto
        return pieces, holes

    def _whole(self, path: Path) -> bytes | None:
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        return self._slice(path, size - HEADER, 0, size - HEADER)

    def _slice(self, path: Path, payload: int, offset: int, nbytes: int) -> bytes | None:
        """``nbytes`` at ``offset`` of an entry's payload; the entry is checked on first use."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # evicted by another process since the listing
        try:
            name = str(path)
            if name not in self._verified:
                whole = os.pread(fd, HEADER + payload + 1, 0)
                if not _intact(whole, payload):
                    self._drop(path, HEADER + payload)  # as accounted when written
                    return None
                self._verified.add(name)
                data = whole[HEADER + offset : HEADER + offset + nbytes]
            else:
                data = os.pread(fd, nbytes, HEADER + offset)
                if len(data) != nbytes:  # truncated since it was checked
                    self._verified.discard(name)
                    self._drop(path, HEADER + payload)
                    return None
        finally:
            os.close(fd)
        with suppress(FileNotFoundError):
            os.utime(path)  # recency, for eviction across processes
        return data

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
        try:
            with self._locked():
                self._claim_locked(url, ranges, parts)
        except OSError as error:
            self.release(parts)
            self._disable(f"claiming ranges in {self.directory}", error)
            return ClaimedParts(mine=list(ranges))
        return parts

    def _claim_locked(self, url: str, ranges: list[RangeRequest], parts: ClaimedParts) -> None:
        where = self.directory / CLAIMS
        claims = read_claims(where)
        now = time.time()
        live: dict[str, bool] = {}
        spans: dict[Path, list[tuple[int, int]]] = {}
        for request in ranges:
            folder = self._object_folder(url, request.key)
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
                spans[folder] = _range_spans(folder)
            covered += spans[folder]
            free, taken = split_covered(request.start, request.end, covered)
            for low, high in free:
                path, fd = hold_claim(where, tag, low, high)
                parts.held.append((path, fd))
                self._held[fd] = path
                parts.mine.append(RangeRequest(request.key, low, high))
            parts.theirs += [RangeRequest(request.key, low, high) for low, high in taken]

    def release(self, parts: ClaimedParts) -> None:
        """Release this process's claims of ``parts`` (after keeping what they fetched)."""
        for path, fd in parts.held:
            if self._held.pop(fd, None) is not None:
                with suppress(OSError):  # a claim left behind is ignored once unlocked
                    release_claim(path, fd)
        parts.held = []

    @staticmethod
    def claim_is_live(path: str) -> bool:
        """Whether another process still fetches the range of the claim at ``path``."""
        return claim_is_live(path)

    # -- writing --------------------------------------------------------------------------
    def store(self, url: str, request: ByteRequest, data: bytes | memoryview) -> None:
        """Keep the bytes fetched for ``request`` (a coalesced range, a suffix, an object)."""
        if not self.enabled:
            return
        nbytes = HEADER + len(data)
        if nbytes > self.budget:
            return
        folder = self._object_folder(url, request.key)
        temp = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{nbytes}"
        try:
            self._remember_url(url)
            self._reserve(nbytes, temp)
        except OSError as error:
            self._disable(f"making room in {self.directory}", error)
            return
        try:
            with open(temp, "wb") as file:
                file.write(MAGIC + struct.pack("<I", google_crc32c.value(bytes(data))))
                file.write(data)
            folder.mkdir(parents=True, exist_ok=True)
            final = folder / _entry_name(request)
            os.replace(temp, final)  # checked on first use, even by this process
        except OSError as error:
            # the cache is being turned off for this process: a failed clean-up of its
            # own temp file leaves at most that file, which the next eviction scan removes
            with suppress(OSError):
                temp.unlink(missing_ok=True)
                self._release(nbytes)
            self._disable(f"writing {temp}", error)

    def _remember_url(self, url: str) -> None:
        if url in self._known_urls:
            return
        folder = self.directory / dataset_id(url)
        folder.mkdir(exist_ok=True)
        marker = folder / "URL"
        if not marker.exists():
            temp = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-0"
            temp.write_text(url.rstrip("/") + "\n")
            os.replace(temp, marker)
        self._known_urls.add(url)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _reserve(self, nbytes: int, temp: Path) -> None:
        """Account ``nbytes`` about to be written to ``temp``, evicting LRU entries for room.

        ``temp`` is made under the lock, so a scan by another process counts it from then on.
        """
        with self._locked():
            used = _read_size(self.directory)
            if used + nbytes > self.budget:
                used = self._evict(int(self.budget * LOW_WATER) - nbytes)
            _write_size(self.directory, used + nbytes)
            temp.touch()
            self._flush_stats_locked()

    def _release(self, nbytes: int) -> None:
        with self._locked():
            _write_size(self.directory, max(0, _read_size(self.directory) - nbytes))

    def _evict(self, target: int) -> int:
        """Delete the least recently used entries until they total ``<= target``; the total."""
        entries, temps = scan_entries(self.directory)
        used = temps + sum(size for _mtime, size, _path in entries)
        entries.sort()
        for _mtime, size, path in entries:
            if used <= target:
                break
            with suppress(FileNotFoundError):
                os.unlink(path)
            self._verified.discard(str(path))
            used -= size
        return used

    def _drop(self, path: Path, size: int) -> None:
        """Delete a damaged entry (counted), so the range is fetched again."""
        with self._mutex:
            self._pending[3] += 1
        try:
            with self._locked():
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    return  # another process dropped it first
                _write_size(self.directory, max(0, _read_size(self.directory) - size))
        except OSError as error:
            self._disable(f"dropping {path}", error)

    # -- counts ---------------------------------------------------------------------------
    def flush_stats(self) -> None:
        """Add this process's hits and misses to the directory's ``STATS`` file."""
        if not self.enabled or not any(self._pending):
            return
        # the counts are for people (``rangestream cache``): a directory that cannot take
        # them loses this flush's counts rather than failing a read
        with suppress(OSError), self._locked():
            self._flush_stats_locked()

    def _flush_stats_locked(self) -> None:
        with self._mutex:
            pending, self._pending = self._pending, [0, 0, 0, 0]
        if not any(pending):
            return
        stats = read_stats(self.directory)
        for name, count in zip(("hits", "misses", "bytes_served", "dropped"), pending, strict=True):
            stats[name] = stats.get(name, 0) + count
        temp = self.directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-0"
        temp.write_text(json.dumps(stats))
        os.replace(temp, self.directory / "STATS")

    # -- state ----------------------------------------------------------------------------
    def _object_folder(self, url: str, key: str) -> Path:
        match = _IMMUTABLE.match(key)
        assert match is not None, key
        return self.directory / dataset_id(url) / match.group(1) / match.group(2).replace("/", "~")

    def _disable(self, what: str, error: OSError) -> None:
        if not self.enabled:
            return
        self.enabled = False
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


def _range_spans(folder: Path) -> list[tuple[int, int]]:
    """The byte ranges an object's range entries hold (none if it has no folder yet)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    spans = []
    for name in names:
        match = _RANGE_ENTRY.match(name)
        if match is not None:
            spans.append((int(match.group(1)), int(match.group(2))))
    return spans


def _entry_name(request: ByteRequest) -> str:
    if isinstance(request, RangeRequest):
        return f"r{request.start}-{request.end}"
    if isinstance(request, SuffixRequest):
        return f"s{request.nbytes}"
    assert isinstance(request, ObjectRequest)
    return f"o{request.max_nbytes if request.max_nbytes is not None else 'all'}"


def _intact(whole: bytes, payload: int) -> bool:
    if len(whole) != HEADER + payload or whole[:4] != MAGIC:
        return False
    (stored,) = struct.unpack("<I", whole[4:HEADER])
    return int(google_crc32c.value(whole[HEADER:])) == stored


def _read_size(directory: Path) -> int:
    try:
        return int((directory / "SIZE").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _write_size(directory: Path, nbytes: int) -> None:
    """Replace ``SIZE`` whole (renamed into place), so a reader never sees it empty."""
    temp = directory / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-0"
    temp.write_text(str(nbytes))
    os.replace(temp, directory / "SIZE")


def read_stats(directory: Path) -> dict[str, int]:
    """The directory's accumulated counts (``hits``, ``misses``, ``bytes_served``...)."""
    try:
        loaded = json.loads((directory / "STATS").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): int(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


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
