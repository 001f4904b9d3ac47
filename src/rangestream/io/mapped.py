"""A bounded, per-process cache of read-only memory maps of local files.

Why: a sync window of a local dataset is a few tens of kilobytes already in the page
cache. ``os.pread`` of it costs a syscall and a copy into a fresh ``bytes`` before the
rows can be copied out again; slicing a mapping kept open costs only the final copy, and
the kernel's fault-around fills a warm mapping's page tables once. No ``pread`` design
reaches numpy memmap's speed on small windows (docs/design.md); a kept mapping is what
memmap does.

Rules that make this safe:

- **Bounded**: at most ``max_files`` files stay mapped per cache, and about
  ``PROCESS_MAX_MAPPED_FILES`` in the whole process (every cache that maps one more drops
  one of its own beyond that); the least recently used is dropped first. Mappings cost
  address space, one kernel mapping each (``vm.max_map_count``, 65,530 by default, bounds
  them per process: the process bound takes a quarter of it) and page tables for the pages
  touched, not copies of the data.
- **Never unmapped while in use**: the cache only drops its reference. A mapping is
  unmapped by refcounting, when the last numpy array over it goes away; nothing here calls
  ``mmap.close()`` (which would raise ``BufferError`` while views exist). Readers copy out
  of the mapping, so the arrays they return own their memory and hold no mapping alive.
- **Per process**: the entries live in a ``ProcessLocal``; a forked child starts with none
  and maps files itself.
- **Why so many**: a random window whose block is not mapped costs a map, page faults and,
  beyond the bound, an unmap: about 160 us against 6 us for a mapped one (open and path
  check about 90 us, map 20, first touch 16, unmap 19), so a working set larger than the
  bound falls off a cliff. The bound was 256 blocks; it is 16,384 (a working set of 64 GiB
  of 4 MiB blocks) where ``vm.max_map_count`` allows, and a failed map (``ENOMEM``) drops
  half of the cache and leaves that read to ``pread``.
- **No SIGBUS**: a mapping covers exactly the file's size when it was mapped, and callers
  compare the bytes they slice with ``MappedFile.size`` (``MappedFile.covers``), so a file
  shorter than its metadata says is reported as such instead of faulting. The files are
  committed objects and never change afterwards, but something outside rangestream can
  truncate one while it is mapped: touching a page past the new end would kill the process
  with SIGBUS, and the rest of the last page reads as zeros. The compiled copier guards its
  copies against that fault (``layout/_chunked.c``) and asks the file's size now
  (``MappedFile.live_size``: an ``fstat`` through the mapping's own descriptor) only where
  its guard cannot tell; other copies ask it first. A block found cut is read another way,
  which reports it.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

from rangestream.io.local import open_regular_file
from rangestream.io.process import ProcessLocal

__all__ = [
    "DEFAULT_MAX_MAPPED_FILES",
    "PROCESS_MAX_MAPPED_FILES",
    "LocalMapCache",
    "MappedFile",
    "mapped_files",
]

#: Environment override of the process bound (a positive integer).
MAX_MAPPED_FILES_ENV = "RANGESTREAM_MAX_MAPPED_FILES"
#: Most files mapped per process by default: 64 GiB of 4 MiB blocks.
MAPPED_FILES_TARGET = 16384


def _process_bound() -> int:
    """The process bound: the target, within a quarter of ``vm.max_map_count`` (the
    kernel's limit on mappings per process, which the interpreter, its libraries and
    allocations share), or ``RANGESTREAM_MAX_MAPPED_FILES``."""
    override = os.environ.get(MAX_MAPPED_FILES_ENV, "").strip()
    if override.isdigit() and int(override) > 0:
        return int(override)
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            max_map_count = int(limit.read().strip())
    except (OSError, ValueError):
        max_map_count = 65530  # Linux's default; other systems have no such small limit
    return max(256, min(MAPPED_FILES_TARGET, max_map_count // 4))


#: Files kept mapped by all caches of this process together.
PROCESS_MAX_MAPPED_FILES = _process_bound()
#: Files kept mapped per cache. A random window over a working set of more blocks than
#: this maps and unmaps a block per window (about 25x the time of a mapped window).
DEFAULT_MAX_MAPPED_FILES = PROCESS_MAX_MAPPED_FILES

_EMPTY = np.empty(0, dtype=np.uint8)
_EMPTY.flags.writeable = False


class MappedFile:
    """One mapped file: its bytes as a read-only ``uint8`` array, and what readers learnt.

    ``verified`` has one flag per unit a reader checks (an inner chunk): set once the unit's
    checksum has matched in this process, so immutable bytes are verified once, not on
    every read. ``views`` holds typed views readers made over ``data`` (keyed by the
    reader's own objects), so a window does not rebuild them.
    """

    __slots__ = ("data", "live_size", "path", "size", "verified", "views")

    def __init__(
        self, path: str, data: np.ndarray, units: int, mapping: mmap.mmap | None = None
    ) -> None:
        self.path = path
        self.data = data
        self.size = len(data)
        self.verified = bytearray(units)
        self.views: dict[Any, np.ndarray] = {}
        #: The file's size now (``fstat`` of the descriptor the mapping keeps): smaller
        #: than ``size`` once the file was truncated, when pages past it would fault.
        self.live_size = mapping.size if mapping is not None else _no_bytes

    def covers(self, end: int) -> bool:
        """Whether bytes ``[0, end)`` lie inside the file (slicing past it could fault)."""
        return end <= self.size


def _no_bytes() -> int:
    return 0


def map_file(path: str, root: str, units: int = 0) -> MappedFile:
    """Map ``path``, a regular file under the resolved ``root``, read-only.

    ``FileNotFoundError`` / ``OSError`` as ``os.open`` raises; a file that is not regular
    or leads out of ``root`` is refused (``rangestream.io.local.open_regular_file``).
    """
    fd = open_regular_file(path, root)
    try:
        size = os.fstat(fd).st_size
        if size == 0:  # mmap refuses empty files; nothing can be sliced out of one anyway
            return MappedFile(path, _EMPTY, units)
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)  # the mapping keeps the file's pages; the descriptor is not needed
    return MappedFile(path, np.frombuffer(mapping, dtype=np.uint8), units, mapping)


class _Entries:
    """This process's mapped files, least recently used first, and the lock for opening."""

    __slots__ = ("__weakref__", "files", "lock")

    def __init__(self) -> None:
        self.files: OrderedDict[Hashable, MappedFile] = OrderedDict()
        self.lock = threading.Lock()
        _live_entries.get_or_make(weakref.WeakSet).add(self)


#: Every cache's entries in this process (a forked child starts with none).
_live_entries = ProcessLocal[weakref.WeakSet[_Entries]]()


def mapped_files() -> int:
    """Files mapped by the caches of this process now (their entries)."""
    live = _live_entries.value
    return 0 if live is None else sum(len(entries.files) for entries in list(live))


class LocalMapCache:
    """Least-recently-used mapped files of one dataset root, at most ``max_files`` of them.

    Entries are keyed by path, or by any hashable ``key`` a caller gives ``open`` and then
    ``get`` (a hot loop can look a block up by an int it computes, without making the path).

    Parameters
    ----------
    root
        The dataset's directory, resolved: mapped files must lie under it.
    max_files
        Files kept mapped; opening one more drops the least recently used entry.
    process_bound
        Files mapped by every cache of the process together beyond which opening one more
        drops this cache's least recently used entry (``PROCESS_MAX_MAPPED_FILES``).

    ``entries()`` returns the process's ``OrderedDict`` (key to entry) so a hot loop can
    inline ``get``: look the key up and ``move_to_end`` the hit.

    ``get`` (a hit) takes no lock: dictionary operations are atomic under the GIL, and an
    entry dropped by another thread between ``get`` and ``move_to_end`` stays usable by
    whoever holds it. ``open`` maps outside the lock and keeps the first mapping if two
    threads race on one path.
    """

    def __init__(
        self,
        root: str,
        max_files: int = DEFAULT_MAX_MAPPED_FILES,
        *,
        process_bound: int | None = None,
    ) -> None:
        if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 1:
            raise ValueError(f"max_files must be a positive integer, got {max_files!r}")
        self.root = os.path.realpath(root)
        self.max_files = max_files
        #: Files mapped by all caches of the process beyond which this one maps a file
        #: only in place of one of its own.
        self.process_bound = PROCESS_MAX_MAPPED_FILES if process_bound is None else process_bound
        self._entries = ProcessLocal[_Entries]()

    def entries(self) -> OrderedDict[Hashable, MappedFile]:
        """This process's entries (key to mapped file, least recently used first)."""
        entries = self._entries.value or self._entries.get_or_make(_Entries)
        return entries.files

    def __len__(self) -> int:
        return len(self.entries())

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries()

    def get(self, key: Hashable) -> MappedFile | None:
        """The mapped file if cached (now the most recently used), else ``None``."""
        files = self.entries()
        found = files.get(key)
        if found is not None:
            try:  # noqa: SIM105 - contextlib.suppress costs more than the move itself
                files.move_to_end(key)
            except KeyError:  # dropped by another thread just now: still valid to use
                pass
        return found

    def open(self, path: str, units: int = 0, key: Hashable = None) -> MappedFile:
        """The mapped file, mapping it now if needed (dropping the oldest beyond the bound).

        ``units`` sizes ``MappedFile.verified`` of a new entry; ``key`` (default: ``path``)
        is what ``get`` finds it by. One file must always be opened under the same key.
        """
        if key is None:
            key = path
        found = self.get(key)
        if found is not None:
            return found
        entries = self._entries.value or self._entries.get_or_make(_Entries)
        try:
            mapped = map_file(path, self.root, units)
        except OSError as error:
            if error.errno == errno.ENOMEM:  # out of mappings: make room for what follows
                with entries.lock:
                    for _ in range(len(entries.files) // 2):
                        entries.files.popitem(last=False)
            raise
        with entries.lock:
            files = entries.files
            found = files.get(key)
            if found is not None:
                return found  # another thread mapped it first; ours is dropped unused
            files[key] = mapped
            bound = self.max_files
            if len(files) > bound or (len(files) > 1 and mapped_files() > self.process_bound):
                # one out for one in, beyond the cache's bound or the process's
                files.popitem(last=False)  # unmapped once no array uses it any more
                while len(files) > bound:
                    files.popitem(last=False)
        return mapped

    def clear(self) -> None:
        """Drop every entry (mappings still referenced by arrays live until those go)."""
        self._entries.pop()
