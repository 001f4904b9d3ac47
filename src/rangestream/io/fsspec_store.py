"""Objects in any fsspec filesystem (``memory://``, GCS, Azure, ...; S3's writes too).

An async fsspec filesystem binds to the loop that first uses it and must not cross a fork,
so one instance is kept per (process, loop, options), shared by every store of that process
and loop (creating an S3 client costs a lot of CPU: see docs/design.md), and forgotten by a
forked child with the rest of the process's state. Synchronous filesystems (``memory://``
and friends) run in a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rangestream.io.log_redaction import hide_session_tokens
from rangestream.io.process import ProcessLocal, io_loop_started
from rangestream.io.store import ObjectStore, check_key

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

__all__ = ["FsspecStore", "close_loop_clients", "shared_client"]

#: Per event loop of this process: clients by options key (async filesystems, S3 readers).
_shared = ProcessLocal[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]]]()


async def shared_client(key: str, make: Callable[[], Awaitable[Any]]) -> Any:
    """The running loop's client for ``key``, made once (``await make()``) and shared."""
    by_loop = _shared.get_or_make(weakref.WeakKeyDictionary)
    loop = asyncio.get_running_loop()
    by_key = by_loop.get(loop)
    if by_key is None:
        by_key = by_loop[loop] = {}
        await _close_with_loop(by_key)
    client = by_key.get(key)
    if client is None:
        client = by_key[key] = await make()
    return client


def options_key(protocol: str, options: dict[str, Any]) -> str:
    return protocol + json.dumps(options, sort_keys=True, default=repr)


class FsspecStore(ObjectStore):
    """Objects under ``protocol://root`` of an fsspec filesystem."""

    #: Whether the filesystem is async; ``None``: ask fsspec (importing its implementation).
    is_async: bool | None = None

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url)
        protocol, path = url.split("://", 1)
        self.protocol = protocol
        self.root_path = path.rstrip("/")
        self._storage_options = dict(storage_options or {})
        if self.is_async is None:
            import fsspec

            cls = fsspec.get_filesystem_class(protocol)
            self._is_async = bool(getattr(cls, "async_impl", False))
        else:  # known: nothing is imported until a call needs the filesystem
            self._is_async = self.is_async
        self._instances = ProcessLocal[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]]()
        self._sync_instance = ProcessLocal[Any]()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self._storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    def _options(self) -> dict[str, Any]:
        return dict(self._storage_options)

    def _prepare(self, fs: Any) -> None:
        """Adjust a new async filesystem before it is shared (S3: no retries of its own)."""

    def _path(self, key: str) -> str:
        return f"{self.root_path}/{check_key(key)}" if key else self.root_path

    async def _fs(self) -> Any:
        import fsspec

        if not self._is_async:
            return self._sync_instance.get_or_make(
                lambda: fsspec.filesystem(self.protocol, **self._options())
            )
        by_loop = self._instances.get_or_make(weakref.WeakKeyDictionary)
        loop = asyncio.get_running_loop()
        fs = by_loop.get(loop)
        if fs is not None:
            return fs
        options = self._options()

        async def make() -> Any:
            hide_session_tokens(options)  # botocore logs signed headers at DEBUG
            made = self._make_filesystem(options)
            self._prepare(made)
            if hasattr(made, "set_session"):
                await made.set_session()
            return made

        fs = by_loop[loop] = await shared_client(self._shared_key(options), make)
        return fs

    def _make_filesystem(self, options: dict[str, Any]) -> Any:
        """A new async filesystem for ``options`` (a store may pick its class itself)."""
        import fsspec

        return fsspec.filesystem(
            self.protocol, asynchronous=True, skip_instance_cache=True, **options
        )

    def _shared_key(self, options: dict[str, Any]) -> str:
        """What makes two stores' filesystems interchangeable: the protocol and options."""
        return options_key(self.protocol, options)

    async def connect(self, *, writes: bool = False) -> None:
        await self._fs()

    def is_connected(self, *, writes: bool = False) -> bool:
        if not self._is_async:
            return self._sync_instance.value is not None
        by_loop = self._instances.value
        return by_loop is not None and asyncio.get_running_loop() in by_loop

    def preload(self) -> None:
        import fsspec

        fsspec.get_filesystem_class(self.protocol)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fs = await self._fs()
        if self._is_async:
            return await getattr(fs, f"_{method}")(*args, **kwargs)
        return await asyncio.to_thread(getattr(fs, method), *args, **kwargs)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return bytes(await self._call("cat_file", self._path(key), start=start, end=end))

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        size = await self.size(key)
        return await self.get_range(key, max(0, size - nbytes), size)

    async def get(self, key: str) -> bytes:
        return bytes(await self._call("cat_file", self._path(key)))

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._call("pipe_file", self._path(key), bytes(data))

    async def size(self, key: str) -> int:
        info = await self._call("info", self._path(key))
        return int(info["size"])

    async def exists(self, key: str) -> bool:
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

    # -- listings with sizes (gc, verify) ------------------------------------------------
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

    async def aclose(self) -> None:
        """Forget this loop's filesystem; the shared client closes with its loop.

        Other readers of the process may be using the same client, so it is not closed
        here; ``close_loop_clients`` closes them all before a loop ends.
        """
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            by_loop = self._instances.value
            if by_loop is not None:
                by_loop.pop(loop, None)


async def _close_with_loop(by_key: dict[str, Any]) -> None:
    """Close the loop's shared clients when the loop shuts down.

    ``asyncio.run`` (and any orderly loop shutdown) calls ``aclose`` on every live async
    generator before closing the loop; this one's ``finally`` closes the clients then,
    inside the loop, so no session is left unclosed.
    """

    async def closer() -> Any:
        try:
            yield
        finally:
            await close_loop_clients()

    generator = closer()
    await generator.__anext__()
    by_key["__closer__"] = generator  # kept alive as long as the loop's entry


async def close_loop_clients() -> None:
    """Close the clients shared on the running loop (call before the loop closes)."""
    by_loop = _shared.value
    if by_loop is None:
        return
    by_key = by_loop.pop(asyncio.get_running_loop(), {})
    by_key.pop("__closer__", None)
    for client in by_key.values():
        closer = getattr(client, "aclose", None)
        if closer is not None:  # the lean S3 read client
            with contextlib.suppress(Exception):
                await closer()
            continue
        session = getattr(client, "_s3", None)
        if session is not None:
            # closing a half-broken session must not mask the error that broke it
            with contextlib.suppress(Exception):
                await session.__aexit__(None, None, None)
        await _close_cloud_sessions(client)


async def _close_cloud_sessions(client: Any) -> None:
    """Close what gcsfs (an aiohttp session) and adlfs (the blob service client and its
    credential) opened on this loop: left to their finalizers, they are closed on another
    loop or not at all ("Unclosed client session" at exit)."""
    service = getattr(client, "service_client", None)  # adlfs
    if service is not None:
        with contextlib.suppress(Exception):
            await service.close()
        credential = getattr(client, "credential", None)
        closer = getattr(credential, "close", None)
        if closer is not None and asyncio.iscoroutinefunction(closer):
            with contextlib.suppress(Exception):
                await closer()
    session = getattr(client, "_session", None)  # gcsfs
    if session is not None and hasattr(session, "closed") and not session.closed:
        with contextlib.suppress(Exception):
            await session.close()


def _close_io_loop_clients() -> None:
    """At exit, close the clients of the sync wrappers' I/O loop (a daemon thread)."""
    loop = io_loop_started()
    by_loop = _shared.value
    if loop is None or loop.is_closed() or by_loop is None or loop not in by_loop:
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_loop_clients(), loop).result(timeout=5)


atexit.register(_close_io_loop_clients)
