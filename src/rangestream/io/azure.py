"""Azure Blob Storage (``az://container/prefix``, ``abfs://``): adlfs for credentials.

adlfs turns the storage options into an azure-storage-blob service client with the
credential chain Azure users expect (``connection_string=``, ``account_name=`` with
``account_key=``, ``sas_token=``, ``credential=``, service principals, and
``DefaultAzureCredential``: environment, managed identity, Azure CLI); they go to it
unchanged. The requests themselves are made here, on that client, each with
``retry_total=0``: the SDK's own retry policy (three retries, exponential from 15 s) would
hide attempts from the range reader's counters and outlast its deadline; retries are the
range reader's and ``RetryingStore``'s, classified by ``retry.is_transient``.

- A range read is one ``Get Blob`` with ``x-ms-range`` (``download_blob(offset, length)``),
  its length checked against the range and the blob's size.
- The root is published with ``If-None-Match: *`` (a new dataset) or ``If-Match: <ETag>``
  (the version the commit read), once ``conditional_writes.proven`` has shown the endpoint
  honours them (Azurite does).
- Listings and deletes go through the container client too (no adlfs directory markers).
- The service client's aiohttp session is closed with the loop (``close_loop_clients``),
  so no "Unclosed client session" is left at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import TYPE_CHECKING, Any

from rangestream.errors import ConcurrentWriteError
from rangestream.io import conditional_writes
from rangestream.io.fsspec_store import FsspecStore
from rangestream.io.retry import ShortReadError

if TYPE_CHECKING:
    from rangestream.io.object_info import ObjectInfo

__all__ = ["AzureStore"]

#: Per-request options of every call: no retries of the SDK's own (see the module doc).
_NO_RETRIES: dict[str, Any] = {"retry_total": 0}
#: What Azure calls its conditions (named in a refusal).
_CONDITIONS = "If-None-Match: * / If-Match: <ETag>"
#: Deletes in flight at once for ``delete_prefix``.
_DELETE_CONCURRENCY = 16


class AzureStore(FsspecStore):
    """Blobs under ``az://container/prefix`` (also ``abfs://``, ``abfss://``)."""

    is_async = True

    def _make_filesystem(self, options: dict[str, Any]) -> Any:
        from adlfs import AzureBlobFileSystem

        fs = AzureBlobFileSystem(asynchronous=True, skip_instance_cache=True, **options)
        # adlfs arms finalizers that close its service client and credential through
        # fsspec's ``sync`` at exit, when this loop no longer runs ("Loop is not running"
        # tracebacks); they are closed with the loop instead (``close_loop_clients``).
        for finalizer in list(getattr(weakref.finalize, "_registry", {})):
            found = finalizer.peek()
            if found is not None and found[0] is fs:
                finalizer.detach()
        return fs

    def preload(self) -> None:
        import adlfs  # noqa: F401
        import azure.storage.blob.aio  # noqa: F401

    def container_blob(self, key: str) -> tuple[str, str]:
        container, _, blob = self._path(key).partition("/")
        return container, blob

    async def _blob(self, key: str) -> Any:
        fs = await self._fs()
        container, blob = self.container_blob(key)
        return fs.service_client.get_blob_client(container=container, blob=blob)

    async def _container(self) -> Any:
        fs = await self._fs()
        return fs.service_client.get_container_client(self.container_blob("")[0])

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        data, _, size = await self._download(key, start, end - start)
        expected = max(0, min(end, size) - start)
        if len(data) != expected:
            raise ShortReadError(
                f"{self.describe(key)}: asked for bytes {start}-{end - 1} of a {size}-byte "
                f"blob, got {len(data)} bytes"
            )
        return data

    async def _download(self, key: str, offset: int, length: int | None) -> tuple[bytes, str, int]:
        """Bytes from ``offset`` (``length`` of them, or to the end), the blob's ETag and
        size; ``b""`` for a range that starts past the end."""
        from azure.core.exceptions import HttpResponseError

        blob = await self._blob(key)
        async with blob:
            with _as_os_errors(self.describe(key)):
                try:
                    stream = await blob.download_blob(
                        offset=offset, length=length, max_concurrency=1, **_NO_RETRIES
                    )
                except HttpResponseError as error:
                    if error.status_code != 416:
                        raise
                    properties = await blob.get_blob_properties(**_NO_RETRIES)
                    return b"", str(properties.etag), int(properties.size)
                data = await stream.readall()
                return bytes(data), str(stream.properties.etag), _blob_size(stream, offset)

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        size = await self.size(key)
        return await self.get_range(key, max(0, size - nbytes), size)

    async def get(self, key: str) -> bytes:
        data, _, _ = await self._download(key, 0, None)
        return data

    async def _properties(self, key: str) -> Any:
        blob = await self._blob(key)
        async with blob:
            with _as_os_errors(self.describe(key)):
                return await blob.get_blob_properties(**_NO_RETRIES)

    async def size(self, key: str) -> int:
        return int((await self._properties(key)).size)

    async def exists(self, key: str) -> bool:
        try:
            await self._properties(key)
        except FileNotFoundError:
            return bool(await self.list(key))  # a "directory" with blobs under it
        return True

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._upload(key, bytes(data), overwrite=True)

    async def _upload(self, key: str, data: bytes, **condition: Any) -> str:
        """One ``Put Blob`` with ``condition`` (``upload_blob`` keywords); the new ETag.
        ``ConcurrentWriteError`` when Azure refuses the condition (409 or 412)."""
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        blob = await self._blob(key)
        async with blob:
            try:
                with _as_os_errors(self.describe(key)):
                    answer = await blob.upload_blob(
                        data, max_concurrency=1, **condition, **_NO_RETRIES
                    )
            except (ResourceExistsError, ResourceModifiedError) as error:
                raise ConcurrentWriteError(
                    f"{self.describe(key)} changed since it was read"
                ) from error
        return str(answer.get("etag", ""))

    async def list(self, prefix: str) -> list[str]:
        return [info.key for info in await self.list_details(prefix)]

    async def list_details(self, prefix: str) -> list[ObjectInfo]:
        from rangestream.io.object_info import ObjectInfo

        _, root = self.container_blob("")
        base = self.container_blob(prefix)[1].rstrip("/")
        start = len(root) + 1 if root else 0
        container = await self._container()
        infos = []
        async with container:
            with _as_os_errors(self.describe(prefix)):
                try:
                    async for blob in container.list_blobs(
                        name_starts_with=f"{base}/" if base else None, **_NO_RETRIES
                    ):
                        stamp = blob.last_modified.timestamp() if blob.last_modified else None
                        infos.append(ObjectInfo(blob.name[start:], int(blob.size), stamp))
                except FileNotFoundError:  # no such container: nothing under the prefix
                    return []
        return sorted(infos, key=lambda info: info.key)

    async def list_prefixes(self, prefix: str) -> list[str]:
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        rests = [key[len(base) :] for key in await self.list(prefix)]
        return sorted({base + rest.split("/", 1)[0] for rest in rests if "/" in rest})

    async def delete_prefix(self, prefix: str) -> None:
        keys = await self.list(prefix)
        if prefix and not prefix.endswith("/") and await self._is_blob(prefix):
            keys.append(prefix)
        gate = asyncio.Semaphore(_DELETE_CONCURRENCY)

        async def delete(key: str) -> None:
            async with gate:
                blob = await self._blob(key)
                async with blob:
                    with contextlib.suppress(FileNotFoundError), _as_os_errors(self.describe(key)):
                        await blob.delete_blob(**_NO_RETRIES)

        await asyncio.gather(*(delete(key) for key in keys))

    async def _is_blob(self, key: str) -> bool:
        try:
            await self._properties(key)
        except FileNotFoundError:
            return False
        return True

    # -- object versions, conditional writes (commit) ------------------------------------
    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        """At most ``max_nbytes`` bytes and the ETag of the blob they were read from (one
        request: the bytes and the version cannot disagree)."""
        data, etag, _ = await self._download(key, 0, max_nbytes)
        return data, etag

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """``If-None-Match: *`` or ``If-Match: version``, once the endpoint is proved to
        honour them; else refused, or checked then written for a declared single writer."""
        from azure.core import MatchConditions

        fs = await self._fs()
        container, _ = self.container_blob("")
        label = f"{fs.service_client.url.rstrip('/')}/{container}"
        # the probe object goes under the dataset's root (keys here are relative to it)
        refused = await conditional_writes.proven(label, _AzurePuts(self), "", _CONDITIONS)
        if refused is not None:
            if conditional_writes.single_writer_declared():
                await super().put_if_version(key, data, version, max_nbytes)
                return
            raise conditional_writes.unsupported_by("Azure Blob endpoint", label, refused)
        if version is None:
            await self._upload(key, bytes(data), overwrite=False)
            return
        try:
            await self._upload(key, bytes(data), overwrite=True, etag=version,
                               match_condition=MatchConditions.IfNotModified)  # fmt: skip
        except FileNotFoundError as error:
            raise ConcurrentWriteError(f"{self.describe(key)} was deleted") from error


class _AzurePuts:
    """``ConditionalPuts`` by ETag, for the probe of ``conditional_writes``."""

    wrong_version = '"0x8D000000000000F"'

    def __init__(self, store: AzureStore) -> None:
        self.store = store

    async def create(self, key: str, body: bytes) -> str:
        return await self.store._upload(key, body, overwrite=False)

    async def replace(self, key: str, body: bytes, version: str) -> str:
        from azure.core import MatchConditions

        return await self.store._upload(key, body, overwrite=True, etag=version,
                                        match_condition=MatchConditions.IfNotModified)  # fmt: skip

    async def remove(self, key: str) -> None:
        blob = await self.store._blob(key)
        async with blob:
            await blob.delete_blob(**_NO_RETRIES)


def _blob_size(stream: Any, offset: int) -> int:
    """The whole blob's size: the total of the answer's ``Content-Range`` (a ranged
    download's ``properties.size`` is the range's), or the size of a whole download."""
    from rangestream.io.range_answers import parse_content_range

    content_range = getattr(stream.properties, "content_range", None)
    if content_range:
        _, _, total = parse_content_range(content_range, "Azure Get Blob")
        if total is not None:
            return total
    return offset + int(stream.size)


@contextlib.contextmanager
def _as_os_errors(where: str) -> Any:
    """Azure's "no such blob/container" as ``FileNotFoundError``, a denied request as
    ``PermissionError`` (both permanent for the retry loop); other errors unchanged."""
    from azure.core.exceptions import ClientAuthenticationError, ResourceNotFoundError

    try:
        yield
    except ResourceNotFoundError as error:
        raise FileNotFoundError(where) from error
    except ClientAuthenticationError as error:
        raise PermissionError(f"{where}: {error.message}") from error
