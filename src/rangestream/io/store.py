"""Object access: one async interface over local files, S3 (s3fs) and any fsspec store.

Keys are ``/``-separated paths relative to the dataset root. The async methods are the
real implementation; the local store also answers reads synchronously with ``os.pread``,
because a sync read of a local file through an event loop costs ten times the read.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import uuid
import weakref
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rangestream.errors import StorageError, UnsafeKeyError
from rangestream.io.log_redaction import hide_session_tokens
from rangestream.io.loop import current_pid
from rangestream.io.s3_reads import S3ReadClient, S3ReadConfig, lean_read_config, lean_reads_enabled

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

_LOCAL_PROTOCOLS = {"file", "local"}
#: Local reads larger than this are first clamped to the file's size (one ``fstat``).
_CHECKED_READ_BYTES = 1 << 20
_UNSAFE_PARTS = frozenset({"", ".", ".."})


def check_key(key: str) -> str:
    """``key`` if it names an object under the dataset root, else ``UnsafeKeyError``.

    Keys are built from stored metadata (commit ids, shard numbers, array names), so a
    hostile document must not be able to make one that climbs out of the dataset (``..``)
    or replaces its root (an absolute path: joined to a local root, ``/etc/x`` wins).
    The empty key is the root itself (listing or deleting everything).
    """
    if key == "":
        return key
    if (
        not isinstance(key, str)
        or key.startswith("/")
        or "\\" in key
        or "\x00" in key
        or not _UNSAFE_PARTS.isdisjoint(key.split("/"))
    ):
        raise UnsafeKeyError(f"key {key!r} would leave the dataset root; refused")
    return key


class ObjectStore(ABC):
    """Async access to the objects under one dataset root."""

    #: Whether ``get_range_sync`` / ``get_suffix_sync`` work without an event loop.
    supports_sync_reads: bool = False

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:  # never shows storage_options: they may hold credentials
        return f"{type(self).__name__}({self.url!r})"

    def describe(self, key: str) -> str:
        """The full URL of ``key``, for error messages."""
        return f"{self.url.rstrip('/')}/{key}"

    @abstractmethod
    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer only if the object ends before ``end``."""

    @abstractmethod
    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        """The last ``nbytes`` bytes (all of them if the object is shorter)."""

    @abstractmethod
    async def get(self, key: str) -> bytes: ...

    @abstractmethod
    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write a whole object; readers see the old object or the new one, never a mix."""

    @abstractmethod
    async def size(self, key: str) -> int: ...

    @abstractmethod
    async def exists(self, key: str) -> bool: ...

    @abstractmethod
    async def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix`` (recursively), relative to the root."""

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``; a missing prefix is not an error."""

    async def aclose(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release connections held for the running loop."""

    async def connect(self, *, writes: bool = False) -> None:  # noqa: B027 - often nothing to do
        """Make the running loop's session now, so that no request's timeout pays for it.

        Creating an S3 client (and resolving credentials) can take longer than a tight
        ``RetryPolicy.request_timeout``; the range reader calls this outside that timeout.
        ``writes=True`` also makes what puts, listings and deletes need (S3 reads and writes
        use different clients).
        """

    def is_connected(self, *, writes: bool = False) -> bool:
        """Whether ``connect`` has nothing to do on the running loop (a cheap check)."""
        return True

    def preload(self) -> None:  # noqa: B027 - local files need no client code
        """Import the client code reads will need, without connecting.

        A process about to fork DataLoader workers calls this, so that each worker inherits
        the imports instead of paying for them on its way to the first batch.
        """

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    def get_sync(self, key: str) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes:
        raise TypeError(f"{type(self).__name__} has no synchronous reads")

    # -- listings with sizes, object versions, conditional writes (gc, verify, commit) --
    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        """Objects under ``prefix`` (recursively) with their sizes and, if known, ages."""
        from rangestream.io.object_info import ObjectInfo

        return [ObjectInfo(key, await self.size(key), None) for key in await self.list(prefix)]

    async def list_prefixes(self, prefix: str) -> list[str]:
        """The prefixes one level below ``prefix`` that hold objects (its "directories")."""
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        rests = [key[len(base) :] for key in await self.list(prefix)]
        return sorted({base + rest.split("/", 1)[0] for rest in rests if "/" in rest})

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        """At most ``max_nbytes`` bytes of ``key``, and a token naming this version of it.

        ``FileNotFoundError`` if there is no such object. Here versions are named by
        content (``object_info.content_version``); S3 names them by ETag.
        """
        from rangestream.io.object_info import content_version

        data = await self.get_range(key, 0, max_nbytes)
        size = len(data) if len(data) < max_nbytes else await self.size(key)
        return data, content_version(data, size)

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """Write ``key`` only if it is still ``version`` (``None``: only if it is absent).

        Raises ``ConcurrentWriteError`` otherwise. This fallback checks, then writes: a
        write by someone else between the two goes unseen here, so callers read back
        afterwards. Stores with an atomic conditional write (S3, local files) override it.
        """
        from rangestream.errors import ConcurrentWriteError

        try:
            _, current = await self.get_versioned(key, max_nbytes)
        except FileNotFoundError:
            current = None
        if current != version:
            raise ConcurrentWriteError(f"{self.describe(key)} changed since it was read")
        await self.put(key, data)


#: Local async reads up to this size run inline: a pread from the page cache takes a few
#: microseconds and a hop to a worker thread tens of them (the async DataLoader path
#: made 3k windows/s locally with a hop per read). Larger reads go to a thread, so one
#: cold read of a slow disk cannot stall the event loop for long.
INLINE_READ_BYTES = 1 << 20


class LocalStore(ObjectStore):
    """Files under a local directory, read with ``os.pread`` through a bounded fd cache.

    A bounded mmap cache was measured and dropped: random windows touch fresh pages, and
    their page faults cost more than pread's copy (0.25x against 0.31x of raw memmap
    slicing on 64-frame temporal windows, and no difference on 2049-token windows).
    ``TemporalArrayStorage`` does keep mappings, outside this store, because it also drops
    the ``bytes`` copy and the per-read crc32c pass (``rangestream.io.local_map``); it gets
    file paths from ``local_path``.
    """

    supports_sync_reads = True

    def __init__(self, root: str | os.PathLike[str], *, max_open_files: int = 128) -> None:
        self.root = Path(root).expanduser().absolute()
        super().__init__(str(self.root))
        self._max_open_files = max_open_files
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._fd_pid = os.getpid()
        self._fd_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root), "max_open_files": self._max_open_files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], max_open_files=state["max_open_files"])  # type: ignore[misc]

    def describe(self, key: str) -> str:
        return str(self.root / key)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> str:
        """The file of ``key`` (checked like every key), for readers that map it."""
        return str(self._path(key))

    def _fd(self, key: str) -> int:
        with self._fd_lock:
            if self._fd_pid != current_pid():  # inherited from a parent: start afresh
                self._fds = OrderedDict()
                self._fd_pid = current_pid()
            fd = self._fds.get(key)
            if fd is not None:
                self._fds.move_to_end(key)
                return fd
            fd = os.open(self._path(key), os.O_RDONLY)
            self._fds[key] = fd
            while len(self._fds) > self._max_open_files:
                _, old = self._fds.popitem(last=False)
                os.close(old)
            return fd

    def close_files(self) -> None:
        with self._fd_lock:
            if self._fd_pid == os.getpid():
                for fd in self._fds.values():
                    os.close(fd)
            self._fds = OrderedDict()

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        fd = self._fd(key)
        nbytes = end - start
        if nbytes > _CHECKED_READ_BYTES:
            # pread allocates what it is asked for before reading; a range derived from
            # damaged metadata must cost only what the file holds (the short read is caught)
            nbytes = max(0, min(nbytes, os.fstat(fd).st_size - start))
        return os.pread(fd, nbytes, start)

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes:
        fd = self._fd(key)
        size = os.fstat(fd).st_size
        start = max(0, size - nbytes)
        return os.pread(fd, size - start, start)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end - start <= INLINE_READ_BYTES:
            return self.get_range_sync(key, start, end)
        return await asyncio.to_thread(self.get_range_sync, key, start, end)

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        if nbytes <= INLINE_READ_BYTES:
            return self.get_suffix_sync(key, nbytes)
        return await asyncio.to_thread(self.get_suffix_sync, key, nbytes)

    def get_sync(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self.get_sync, key)

    def put_sync(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
        with self._fd_lock:  # a cached fd would still point at the replaced file
            fd = self._fds.pop(key, None)
            if fd is not None and self._fd_pid == os.getpid():
                os.close(fd)

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
        import shutil

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
                    if stat.S_ISREG(status.st_mode):
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
        import stat

        from rangestream.io.object_info import content_version

        fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise StorageError(f"{self.describe(key)} is not a regular file")
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


#: Async filesystems and S3 read clients shared by every store of this process on a loop,
#: by options. Creating an S3 client costs 150-450 ms of CPU (botocore loads its service
#: models), so readers of one process and loop share one client and its connection pool.
_shared_filesystems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)
_shared_pid = os.getpid()
#: A forked child's inherited clients, kept alive and never used: collecting one would close
#: its sockets, and in the child that also removes them from the parent's shared epoll set.
_inherited_clients: list[Any] = []


async def _loop_clients(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """The running loop's shared clients by options key (this process's only)."""
    global _shared_pid
    if _shared_pid != current_pid():
        for by_options in _shared_filesystems.values():
            _inherited_clients.extend(by_options.values())
        _shared_filesystems.clear()
        _shared_pid = current_pid()
    by_options = _shared_filesystems.get(loop)
    if by_options is None:
        by_options = _shared_filesystems[loop] = {}
        await _close_with_loop(by_options)
    return by_options


def _options_key(protocol: str, options: dict[str, Any]) -> str:
    import json

    return protocol + json.dumps(options, sort_keys=True, default=repr)


class FsspecStore(ObjectStore):
    """Objects in any fsspec filesystem; S3 and other async filesystems run natively.

    An async fsspec filesystem binds to the loop that first uses it and must not cross a
    fork, so one instance is kept per (process, loop, options), shared by all stores, and
    rebuilt when the process or loop changes. Synchronous filesystems (``memory://`` and
    friends) run in a worker thread.

    S3 reads go through ``s3_reads.S3ReadClient`` (a fraction of s3fs's CPU per request and
    at client creation), shared and rebuilt the same way; s3fs keeps writes, listings and
    deletes. Storage options that client does not reproduce, or ``RANGESTREAM_S3_READS=s3fs``,
    keep reads on s3fs.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url)
        protocol, path = url.split("://", 1)
        self.protocol = protocol
        self.root_path = path.rstrip("/")
        self._storage_options = dict(storage_options or {})
        self._read_config: S3ReadConfig | None = None
        if protocol in {"s3", "s3a"} and lean_reads_enabled():
            self._read_config = lean_read_config(self._options())
        if self._read_config is not None:
            self._is_async = True  # s3fs is async; not imported until a write needs it
        else:
            import fsspec

            cls = fsspec.get_filesystem_class(protocol)
            self._is_async = bool(getattr(cls, "async_impl", False))
        self._instances: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._read_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, S3ReadClient] = (
            weakref.WeakKeyDictionary()
        )
        self._sync_instance: Any = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self._storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    def _options(self) -> dict[str, Any]:
        options = dict(self._storage_options)
        if self.protocol in {"s3", "s3a"}:
            # Our RangeReader owns retries, so it can count them and bound their time;
            # botocore's and s3fs's own retry loops would hide attempts from the counters.
            # (botocore's "max_attempts" counts retries after the first attempt, so 1 would
            # still retry once; "total_max_attempts" counts the first one too.)
            config = dict(options.get("config_kwargs") or {})
            config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
            config.setdefault("max_pool_connections", 128)
            config.setdefault("connect_timeout", 5)
            config.setdefault("read_timeout", 30)
            options["config_kwargs"] = config
        return options

    def _path(self, key: str) -> str:
        return f"{self.root_path}/{check_key(key)}" if key else self.root_path

    def _forget_parent_clients(self) -> None:
        if self._pid != current_pid():
            _inherited_clients.extend(self._read_clients.values())
            _inherited_clients.extend(self._instances.values())
            self._instances = weakref.WeakKeyDictionary()
            self._read_clients = weakref.WeakKeyDictionary()
            self._sync_instance = None
            self._pid = current_pid()

    async def _fs(self) -> Any:
        import fsspec

        self._forget_parent_clients()
        if not self._is_async:
            if self._sync_instance is None:
                self._sync_instance = fsspec.filesystem(self.protocol, **self._options())
            return self._sync_instance
        loop = asyncio.get_running_loop()
        fs = self._instances.get(loop)
        if fs is not None:
            return fs
        options = self._options()
        by_options = await _loop_clients(loop)
        key = _options_key(self.protocol, options)
        fs = by_options.get(key)
        if fs is None:
            hide_session_tokens(options)  # botocore logs signed headers at DEBUG
            fs = fsspec.filesystem(
                self.protocol, asynchronous=True, skip_instance_cache=True, **options
            )
            if self.protocol in {"s3", "s3a"}:
                fs.retries = 1  # s3fs retries some errors itself; ours are counted instead
            if hasattr(fs, "set_session"):
                await fs.set_session()
            by_options[key] = fs
        self._instances[loop] = fs
        return fs

    async def _reads(self) -> S3ReadClient:
        """The lean S3 read client of this process, loop and options (``s3_reads``)."""
        assert self._read_config is not None
        self._forget_parent_clients()
        loop = asyncio.get_running_loop()
        client = self._read_clients.get(loop)
        if client is not None:
            return client
        by_options = await _loop_clients(loop)
        key = "lean-reads:" + _options_key(self.protocol, self._options())
        client = by_options.get(key)
        if client is None:
            client = by_options[key] = S3ReadClient(self._read_config)
        self._read_clients[loop] = client
        return client

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, object_key = self._path(key).partition("/")
        return bucket, object_key

    async def connect(self, *, writes: bool = False) -> None:
        if self._read_config is not None:
            await self._reads()
            if not writes:
                return
        await self._fs()

    def preload(self) -> None:
        """Import aiohttp and botocore's signer (lean S3 reads) or the fsspec filesystem.

        About 200 ms of CPU for aiohttp and botocore's signer alone: paid once in the
        process that forks DataLoader workers rather than once in every worker.
        """
        if self._read_config is not None:
            import aiohttp  # noqa: F401
            import botocore.auth
            import botocore.awsrequest  # noqa: F401
        else:
            import fsspec

            fsspec.get_filesystem_class(self.protocol)

    def is_connected(self, *, writes: bool = False) -> bool:
        if self._pid != current_pid():
            return False
        if not self._is_async:
            return self._sync_instance is not None
        loop = asyncio.get_running_loop()
        if self._read_config is not None:
            if loop not in self._read_clients:
                return False
            if not writes:
                return True
        return loop in self._instances

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fs = await self._fs()
        if self._is_async:
            return await getattr(fs, f"_{method}")(*args, **kwargs)
        return await asyncio.to_thread(getattr(fs, method), *args, **kwargs)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        if self._read_config is not None:
            return await (await self._reads()).get_range(*self._bucket_key(key), start, end)
        return bytes(await self._call("cat_file", self._path(key), start=start, end=end))

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        if self._read_config is not None:
            return await (await self._reads()).get_suffix(*self._bucket_key(key), nbytes)
        if self.protocol in {"s3", "s3a"}:
            return bytes(await self._call("cat_file", self._path(key), start=-nbytes))
        size = await self.size(key)
        return await self.get_range(key, max(0, size - nbytes), size)

    async def get(self, key: str) -> bytes:
        if self._read_config is not None:
            return await (await self._reads()).get(*self._bucket_key(key))
        return bytes(await self._call("cat_file", self._path(key)))

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._call("pipe_file", self._path(key), bytes(data))

    async def size(self, key: str) -> int:
        if self._read_config is not None:
            with contextlib.suppress(FileNotFoundError):
                return await (await self._reads()).size(*self._bucket_key(key))
            # no such object: s3fs says what a "directory" prefix measures, or raises
        info = await self._call("info", self._path(key))
        return int(info["size"])

    async def exists(self, key: str) -> bool:
        if self._read_config is not None:
            with contextlib.suppress(FileNotFoundError):
                await (await self._reads()).size(*self._bucket_key(key))
                return True
            # no such object: s3fs also counts a prefix with objects under it as existing
        try:
            await self._call("info", self._path(key))
        except FileNotFoundError:
            return False
        return True

    async def list(self, prefix: str) -> list[str]:
        base = self._path(prefix).rstrip("/")
        try:
            found = await self._call("find", base)
        except FileNotFoundError:
            return []
        root = self.root_path + "/"
        keys = []
        for path in found:
            path = path.split("://", 1)[-1]
            if path.startswith("/") and not root.startswith("/"):
                path = path.lstrip("/")
            if path.startswith(root):
                keys.append(path[len(root) :])
        return sorted(keys)

    async def delete_prefix(self, prefix: str) -> None:
        keys = await self.list(prefix)
        if not keys:
            return
        paths = [self._path(key) for key in keys]
        with contextlib.suppress(FileNotFoundError):
            await self._call("rm", paths)
        if self.protocol == "memory":
            # memory:// keeps pseudo-directories that would make a prefix look present
            fs = await self._fs()
            with contextlib.suppress(FileNotFoundError):
                fs.rm(self._path(prefix), recursive=True)

    async def aclose(self) -> None:
        """Forget this loop's filesystem; the shared client closes with its loop.

        Other readers of the process may be using the same client, so it is not closed
        here; ``close_loop_filesystems`` closes them all before a loop ends.
        """
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            self._instances.pop(loop, None)
            self._read_clients.pop(loop, None)

    # -- listings with sizes, object versions, conditional writes (gc, verify, commit) --
    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        from rangestream.io.object_info import ObjectInfo

        try:
            found = await self._call("find", self._path(prefix).rstrip("/"), detail=True)
        except FileNotFoundError:
            return []
        root, infos = self.root_path + "/", []
        for path, info in found.items():
            path = path.split("://", 1)[-1]
            if path.startswith("/") and not root.startswith("/"):
                path = path.lstrip("/")
            if not path.startswith(root) or info.get("type", "file") != "file":
                continue
            stamp = info.get("LastModified") or info.get("mtime") or info.get("created")
            modified = stamp.timestamp() if hasattr(stamp, "timestamp") else stamp
            infos.append(ObjectInfo(path[len(root) :], int(info.get("size") or 0), modified))
        return sorted(infos, key=lambda info: info.key)

    async def list_prefixes(self, prefix: str) -> list[str]:
        try:
            entries = await self._call("ls", self._path(prefix).rstrip("/"), detail=True)
        except FileNotFoundError:
            return []
        start = f"{prefix.rstrip('/')}/" if prefix else ""
        names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                 if e.get("type") == "directory"]  # fmt: skip
        return sorted(start + name for name in names)

    @staticmethod
    def _s3_error(error: BaseException) -> tuple[str | None, int | None]:
        """The S3 error code and HTTP status behind an s3fs exception, if any."""
        current: BaseException | None = error
        for _ in range(8):
            response = getattr(current, "response", None)
            if isinstance(response, dict):
                status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
                return (response.get("Error") or {}).get("Code"), status
            if current is None:
                break
            current = current.__cause__ or current.__context__
        return None, None

    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        if self.protocol not in {"s3", "s3a"}:
            return await super().get_versioned(key, max_nbytes)
        fs, (bucket, object_key) = await self._fs(), self._bucket_key(key)
        try:  # one bounded GET: the ETag of a range names the whole object's version
            response = await fs._call_s3(
                "get_object", Bucket=bucket, Key=object_key, Range=f"bytes=0-{max_nbytes - 1}"
            )
        except OSError as error:
            if self._s3_error(error)[1] != 416:
                raise
            response = await fs._call_s3("get_object", Bucket=bucket, Key=object_key)  # empty
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), str(response["ETag"])

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        if self.protocol not in {"s3", "s3a"}:
            return await super().put_if_version(key, data, version, max_nbytes)
        from rangestream.errors import ConcurrentWriteError

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        fs, (bucket, object_key) = await self._fs(), self._bucket_key(key)
        try:
            await fs._call_s3(
                "put_object", Bucket=bucket, Key=object_key, Body=bytes(data), **condition
            )
        except OSError as error:
            code, status = self._s3_error(error)
            if status in (409, 412) or code in {"PreconditionFailed", "ConditionalRequestConflict"}:
                raise ConcurrentWriteError(
                    f"{self.describe(key)} changed since it was read"
                ) from error
            if version is not None and isinstance(error, FileNotFoundError):
                raise ConcurrentWriteError(f"{self.describe(key)} was deleted") from error
            if status != 501 and code != "NotImplemented":
                raise
            await super().put_if_version(key, data, version, max_nbytes)  # no conditions here


async def _close_with_loop(by_options: dict[str, Any]) -> None:
    """Close the loop's shared clients when the loop shuts down.

    ``asyncio.run`` (and any orderly loop shutdown) calls ``aclose`` on every live async
    generator before closing the loop; this one's ``finally`` closes the clients then,
    inside the loop, so no session is left unclosed.
    """

    async def closer() -> Any:
        try:
            yield
        finally:
            await close_loop_filesystems()

    generator = closer()
    await generator.__anext__()
    by_options["__closer__"] = generator  # kept alive as long as the loop's entry


async def close_loop_filesystems() -> None:
    """Close the S3 clients shared on the running loop (call before the loop closes)."""
    by_options = _shared_filesystems.pop(asyncio.get_running_loop(), {})
    by_options.pop("__closer__", None)
    for fs in by_options.values():
        if isinstance(fs, S3ReadClient):
            with contextlib.suppress(Exception):
                await fs.aclose()
            continue
        client = getattr(fs, "_s3", None)
        if client is not None:
            # closing a half-broken session must not mask the error that broke it
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)


def _close_io_loop_filesystems() -> None:
    """At exit, close the clients of the sync wrappers' I/O loop (a daemon thread)."""
    from rangestream.io import loop as io_loop_module

    loop = io_loop_module._loop
    if loop is None or io_loop_module._loop_pid != os.getpid() or loop.is_closed():
        return
    if loop not in _shared_filesystems:
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_loop_filesystems(), loop).result(timeout=5)


atexit.register(_close_io_loop_filesystems)


def is_local_url(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names a local directory, which :func:`open_store` serves with pread."""
    if isinstance(url, os.PathLike) or "://" not in str(url):
        return True
    return str(url).split("://", 1)[0] in _LOCAL_PROTOCOLS


def open_store(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> ObjectStore:
    """The store for a dataset URL: a local path, ``file://``, ``s3://`` or any fsspec URL."""
    if isinstance(url, os.PathLike):
        return LocalStore(os.fspath(url))
    if not isinstance(url, str) or not url:
        raise StorageError(f"a dataset URL must be a non-empty string or path, got {url!r}")
    if "://" not in url:
        return LocalStore(url)
    protocol, rest = url.split("://", 1)
    if protocol in _LOCAL_PROTOCOLS:
        return LocalStore(rest)
    try:
        return FsspecStore(url, storage_options)
    except (ValueError, ImportError) as error:
        raise StorageError(f"no storage backend for URL {url!r}: {error}") from error
