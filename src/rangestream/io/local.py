"""Local datasets: files under a directory, read with ``os.pread`` through a bounded fd cache.

A sync read of a local file through an event loop costs many times the read itself, so this
store answers reads synchronously too (``supports_sync_reads``). Readers that keep blocks
mapped (``rangestream.io.mapped``) open files through :func:`open_regular_file` as well.

A local dataset is a directory this process trusts to hold only what rangestream wrote, but
two things a careless or hostile directory can hold are refused before any read: files that
are not regular (a FIFO would block ``open`` forever) and symbolic links that lead outside
the dataset's root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import sys
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rangestream.errors import StorageError, UnsafeKeyError
from rangestream.io.process import ProcessLocal
from rangestream.io.store import ObjectStore, check_key

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

__all__ = ["INLINE_READ_BYTES", "LocalStore", "open_regular_file"]

#: Local reads larger than this are first clamped to the file's size (one ``fstat``).
_CHECKED_READ_BYTES = 1 << 20
#: Local async reads up to this size run inline: a pread from the page cache takes a few
#: microseconds and a hop to a worker thread tens of them. Larger reads go to a thread, so
#: one cold read of a slow disk cannot stall the event loop for long.
INLINE_READ_BYTES = 1 << 20


def open_regular_file(path: str, root: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file inside ``root``.

    Opened non-blocking, so a FIFO or device in its place is refused instead of blocking
    forever; ``root`` is a resolved directory, and a path whose symlinks lead elsewhere is
    refused (``UnsafeKeyError``). ``FileNotFoundError`` passes through as ``os.open``
    raises it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError(
                f"{path} is not a regular file ({_file_kind(mode)}); a dataset holds only "
                "the files rangestream wrote"
            )
        resolved = _resolved_path(fd, path)
        if not resolved.startswith(root + os.sep):
            raise UnsafeKeyError(
                f"{path} resolves to {resolved}, outside the dataset root {root} (a symbolic "
                "link leads out of the dataset); refused"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _resolved_path(fd: int, path: str) -> str:
    """Where the open descriptor ``fd`` of ``path`` really is.

    On Linux the kernel names it (``/proc/self/fd``): one ``readlink`` instead of the
    ``lstat`` of every component that ``realpath`` makes (the path of a hundred-thousand-
    shard dataset is checked on every open), and it names the file opened, not whatever
    the path leads to a moment later. Elsewhere, or where ``/proc`` is not mounted, or
    the file was unlinked after the open, ``realpath``.
    """
    if _PROC_FD_NAMES:
        with contextlib.suppress(OSError):  # no such entry: realpath below
            resolved = os.readlink(f"/proc/self/fd/{fd}")
            if resolved.startswith(os.sep) and not resolved.endswith(" (deleted)"):
                return resolved
    return os.path.realpath(path)


#: ``/proc/self/fd`` names open descriptors (Linux with procfs mounted).
_PROC_FD_NAMES = sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class _OpenFiles:
    """This process's descriptors, least recently used first, and the reads using them.

    A descriptor evicted (or dropped) while a read on another thread still uses it is
    closed by that read's end, not at once: closed at once, its number could be reused by
    the next file opened, and the read would return that file's bytes.
    """

    def __init__(self) -> None:
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.users: dict[int, int] = {}  # descriptor -> reads in progress
        self.retired: set[int] = set()  # evicted while in use: closed by its last read
        self.lock = threading.Lock()

    def retire(self, fd: int) -> None:
        """Close ``fd`` now, or when its last read ends (call under ``lock``)."""
        if self.users.get(fd):
            self.retired.add(fd)
        else:
            os.close(fd)

    def release(self, fd: int) -> None:
        """End one read of ``fd``; the last read of a retired descriptor closes it."""
        with self.lock:
            left = self.users[fd] - 1
            if left:
                self.users[fd] = left
                return
            del self.users[fd]
            if fd in self.retired:
                self.retired.discard(fd)
                os.close(fd)


class LocalStore(ObjectStore):
    """Files under a local directory, read with ``os.pread`` through a bounded fd cache."""

    supports_sync_reads = True

    def __init__(self, root: str | os.PathLike[str], *, max_open_files: int = 128) -> None:
        self.root = Path(root).expanduser().absolute()
        super().__init__(str(self.root))
        self.max_open_files = max_open_files
        self._files = ProcessLocal[_OpenFiles]()
        self._resolved_root: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root), "max_open_files": self.max_open_files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], max_open_files=state["max_open_files"])  # type: ignore[misc]

    def describe(self, key: str) -> str:
        return str(self.root / key)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> str:
        """The file of ``key`` (checked like every key), for readers that map it."""
        return str(self._path(key))

    @property
    def resolved_root(self) -> str:
        """The root with its symbolic links resolved: what opened files must lie under."""
        root = self._resolved_root
        if root is None:
            root = self._resolved_root = os.path.realpath(self.root)
        return root

    def _acquire(self, key: str) -> tuple[_OpenFiles, int]:
        """A descriptor of ``key``, held open until ``release``d (reads on other threads
        may evict it from the cache meanwhile: see ``_OpenFiles``)."""
        files = self._files.value or self._files.get_or_make(_OpenFiles)
        with files.lock:
            fd = files.fds.get(key)
            if fd is not None:
                files.fds.move_to_end(key)
            else:
                fd = open_regular_file(str(self._path(key)), self.resolved_root)
                files.fds[key] = fd
                while len(files.fds) > self.max_open_files:
                    files.retire(files.fds.popitem(last=False)[1])
            files.users[fd] = files.users.get(fd, 0) + 1
            return files, fd

    def close_files(self) -> None:
        files = self._files.pop()
        if files is not None:
            with files.lock:
                for fd in files.fds.values():
                    files.retire(fd)
                files.fds.clear()

    def close_sync(self) -> None:
        self.close_files()

    async def aclose(self) -> None:
        self.close_files()

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        files, fd = self._acquire(key)
        try:
            nbytes = end - start
            if nbytes > _CHECKED_READ_BYTES:
                # pread allocates what it is asked for before reading; a range derived from
                # damaged metadata must cost only what the file holds (the short read is
                # caught)
                nbytes = max(0, min(nbytes, os.fstat(fd).st_size - start))
            return os.pread(fd, nbytes, start)
        finally:
            files.release(fd)

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes:
        files, fd = self._acquire(key)
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - nbytes)
            return os.pread(fd, size - start, start)
        finally:
            files.release(fd)

    def get_sync(self, key: str) -> bytes:
        files, fd = self._acquire(key)
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            files.release(fd)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end - start <= INLINE_READ_BYTES:
            return self.get_range_sync(key, start, end)
        files, fd = self._acquire(key)
        try:
            # a bounded read of a small object (its bound far past its end) is small too
            nbytes = max(0, min(end, os.fstat(fd).st_size) - start)
            if nbytes <= INLINE_READ_BYTES:
                return os.pread(fd, nbytes, start)
        finally:
            files.release(fd)
        return await asyncio.to_thread(self.get_range_sync, key, start, end)

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        if nbytes <= INLINE_READ_BYTES:
            return self.get_suffix_sync(key, nbytes)
        return await asyncio.to_thread(self.get_suffix_sync, key, nbytes)

    async def get(self, key: str) -> bytes:
        files, fd = self._acquire(key)
        try:
            size = os.fstat(fd).st_size
            if size <= INLINE_READ_BYTES:  # small objects as small ranges: inline
                return os.pread(fd, size, 0)
        finally:
            files.release(fd)
        return await asyncio.to_thread(self.get_sync, key)

    def put_sync(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
        files = self._files.value
        if files is not None:
            with files.lock:  # a cached fd would still point at the replaced file
                fd = files.fds.pop(key, None)
                if fd is not None:
                    files.retire(fd)

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await asyncio.to_thread(self.put_sync, key, data)

    async def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    async def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    async def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(path.relative_to(self.root)).replace(os.sep, "/")
            for path in base.rglob("*")
            if path.is_file()
        )

    async def delete_prefix(self, prefix: str) -> None:
        self.close_files()
        path = self._path(prefix)
        await asyncio.to_thread(shutil.rmtree, path, True)

    # -- listings with sizes, object versions, conditional writes (gc, verify, commit) --
    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        import stat

        from rangestream.io.object_info import ObjectInfo

        def scan() -> list[ObjectInfo]:
            base, found = self._path(prefix), []
            for path in base.rglob("*") if base.is_dir() else ():
                with contextlib.suppress(FileNotFoundError):  # deleted while listed
                    status = path.lstat()
                    # what is not a directory is listed, FIFOs and links included: reading
                    # them is what names them as not belonging (verify reports it)
                    if not stat.S_ISDIR(status.st_mode):
                        key = str(path.relative_to(self.root)).replace(os.sep, "/")
                        found.append(ObjectInfo(key, status.st_size, status.st_mtime))
            return sorted(found, key=lambda info: info.key)

        return await asyncio.to_thread(scan)

    async def list_prefixes(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        return sorted(start + e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False))

    def _get_versioned_sync(self, key: str, max_nbytes: int) -> tuple[bytes, str]:

        from rangestream.io.object_info import content_version

        fd = open_regular_file(str(self._path(key)), self.resolved_root)
        try:
            status = os.fstat(fd)
            data = os.pread(fd, min(max_nbytes, status.st_size), 0)
        finally:
            os.close(fd)
        return data, content_version(data, status.st_size)

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        return await asyncio.to_thread(self._get_versioned_sync, key, max_nbytes)

    def _put_if_version_sync(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        import fcntl

        from rangestream.errors import ConcurrentWriteError

        # Conditional writes of one dataset take an exclusive lock on its directory (flock:
        # held per open file, across processes), so check and rename are one step to them.
        self.root.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current: str | None = self._get_versioned_sync(key, max_nbytes)[1]
            except FileNotFoundError:
                current = None
            if current != version:
                raise ConcurrentWriteError(f"{self.describe(key)} changed since it was read")
            self.put_sync(key, data)
        finally:
            os.close(lock)  # releases the lock

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        await asyncio.to_thread(self._put_if_version_sync, key, data, version, max_nbytes)
