"""S3 and S3-compatible stores (MinIO, SeaweedFS): lean reads, s3fs for the rest.

Reads go through one of two read paths, chosen once per store: the lean aiohttp client of
``s3_client`` (the default: a fraction of s3fs's CPU per request), or s3fs's own
``get_object`` when the storage options ask for something the lean client does not
reproduce (``requester_pays``, SSE-C, a ``profile``, ...) or ``RANGESTREAM_S3_READS=s3fs``
says so. Both check every answer to a range request the same way (``range_answers``): the
status, the ``Content-Range`` of a 206 (or of a 200 carrying only the range, as rclone
answers), and at most the bytes asked for of a 200 from a server that ignored the range,
sliced only once a HEAD says it is the whole object, so a wrong answer can never pass for
the bytes asked for.
Listings of keys (``list``, and so ``delete_prefix``'s) take the read path too: the lean
client's ListObjectsV2 reads only the keys. Writes, deletes and listings with sizes and
times (``list_details``) always go through s3fs (``FsspecStore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from typing import Any

from rangestream.io import conditional_writes
from rangestream.io.conditional_writes import s3_error_of
from rangestream.io.fsspec_store import FsspecStore, options_key, shared_client
from rangestream.io.process import ProcessLocal
from rangestream.io.range_answers import needs_object_size, ranged_body, suffix_body
from rangestream.io.request_cap import process_max_requests
from rangestream.io.s3_client import S3ReadClient
from rangestream.io.s3_options import (
    S3ReadConfig,
    aws_environment_key,
    lean_read_config,
    lean_reads_enabled,
)

__all__ = ["S3Store"]

#: botocore's checksum settings (config name, environment variable), "when_required" here.
_CHECKSUM_SETTINGS = (
    ("request_checksum_calculation", "AWS_REQUEST_CHECKSUM_CALCULATION"),
    ("response_checksum_validation", "AWS_RESPONSE_CHECKSUM_VALIDATION"),
)


class S3Store(FsspecStore):
    """Objects under ``s3://bucket/prefix``."""

    is_async = True  # s3fs: not imported until a write (or the s3fs read path) needs it

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(url, storage_options)
        config = lean_read_config(self._options()) if lean_reads_enabled() else None
        self._reads: _LeanReads | _S3fsReads = (
            _LeanReads(self, config) if config is not None else _S3fsReads(self)
        )

    def _options(self) -> dict[str, Any]:
        options = dict(self._storage_options)
        # The range reader owns retries, so it can count them and bound their time;
        # botocore's and s3fs's own retry loops would hide attempts from the counters.
        # (botocore's "max_attempts" counts retries after the first attempt, so 1 would
        # still retry once; "total_max_attempts" counts the first one too.)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        # botocore's pool sized to the process request cap, as the lean client's is
        config.setdefault("max_pool_connections", process_max_requests())
        config.setdefault("connect_timeout", 5)
        config.setdefault("read_timeout", 30)
        # botocore's default ("when_supported") adds CRC32 trailers to every upload and
        # validates any checksum header of a GET: servers that implement neither, or not
        # exactly (rclone serve s3: FlexibleChecksumError), then refuse or fail every call.
        # The dataset's own crc32c checks every chunk read, whatever the transport did.
        for name, env in _CHECKSUM_SETTINGS:
            if not os.environ.get(env):  # a setting in the environment is the user's own
                config.setdefault(name, "when_required")
        options["config_kwargs"] = config
        return options

    def _shared_key(self, options: dict[str, Any]) -> str:
        # botocore also reads the AWS_* environment (and the config files it names): two
        # stores with the same options may still go to different endpoints or regions
        return options_key(self.protocol, options) + aws_environment_key()

    def _prepare(self, fs: Any) -> None:
        fs.retries = 1  # s3fs retries some errors itself; ours are counted instead

    def bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, object_key = self._path(key).partition("/")
        return bucket, object_key

    async def connect(self, *, writes: bool = False) -> None:
        await self._reads.connect()
        if writes:
            await self._fs()

    def is_connected(self, *, writes: bool = False) -> bool:
        return self._reads.is_connected() and (not writes or super().is_connected())

    def preload(self) -> None:
        self._reads.preload()

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return await self._reads.get_range(key, start, end)

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        return await self._reads.get_suffix(key, nbytes)

    async def get(self, key: str) -> bytes:
        return await self._reads.get(key)

    async def size(self, key: str) -> int:
        with contextlib.suppress(FileNotFoundError):
            return await self._reads.size(key)
        # no such object: s3fs says what a "directory" prefix measures, or raises
        return await super().size(key)

    async def exists(self, key: str) -> bool:
        with contextlib.suppress(FileNotFoundError):
            await self._reads.size(key)
            return True
        # no such object: s3fs also counts a prefix with objects under it as existing
        return await super().exists(key)

    async def list(self, prefix: str) -> list[str]:
        if not isinstance(self._reads, _LeanReads):
            return await super().list(prefix)
        bucket, base = self.bucket_key(prefix)
        _, root = self.bucket_key("")
        base, root = base.rstrip("/"), root.rstrip("/")
        try:
            keys = await self._reads.list_keys(bucket, f"{base}/" if base else "")
        except FileNotFoundError:  # no such bucket: nothing under the prefix, as s3fs says
            return []
        start = len(root) + 1 if root else 0
        return sorted(key[start:] for key in keys)

    async def aclose(self) -> None:
        await super().aclose()
        self._reads.forget_loop()

    # -- object versions, conditional writes (commit) ------------------------------------
    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        fs, (bucket, object_key) = await self._fs(), self.bucket_key(key)
        try:  # one bounded GET: the ETag of a range names the whole object's version
            response = await fs._call_s3(
                "get_object", Bucket=bucket, Key=object_key, Range=f"bytes=0-{max_nbytes - 1}"
            )
        except OSError as error:
            if s3_error_of(error)[1] != 416:
                raise
            response = await fs._call_s3("get_object", Bucket=bucket, Key=object_key)  # empty
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), str(response["ETag"])

    def endpoint(self, fs: Any) -> str:
        """The endpoint s3fs's client resolved (what conditional writes are proved for)."""
        meta = getattr(getattr(fs, "s3", None), "meta", None)
        return str(getattr(meta, "endpoint_url", None) or "the configured S3 endpoint")

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """An ``If-Match`` / ``If-None-Match`` PUT, once the server is proved to honour them.

        Where it does not (``conditional_writes``), refused with
        ``ConditionalWritesUnsupportedError``, or, if the user declared one writer at a time,
        checked then written as ``ObjectStore.put_if_version`` does.
        """
        from rangestream.errors import ConcurrentWriteError

        fs, (bucket, object_key) = await self._fs(), self.bucket_key(key)
        endpoint = self.endpoint(fs)

        async def call(method: str, **kwargs: Any) -> Any:
            return await fs._call_s3(method, **kwargs)

        refused = await conditional_writes.refusal(
            lambda **kwargs: call("put_object", **kwargs),
            lambda **kwargs: call("delete_object", **kwargs),
            endpoint,
            bucket,
            self.bucket_key("")[1],
        )
        if refused is not None:
            if conditional_writes.single_writer_declared():
                await super().put_if_version(key, data, version, max_nbytes)
                return
            raise conditional_writes.unsupported(endpoint, bucket, refused)
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            await call("put_object", Bucket=bucket, Key=object_key, Body=bytes(data), **condition)
        except OSError as error:
            if conditional_writes.is_condition_refusal(error):
                raise ConcurrentWriteError(
                    f"{self.describe(key)} changed since it was read"
                ) from error
            if version is not None and isinstance(error, FileNotFoundError):
                raise ConcurrentWriteError(f"{self.describe(key)} was deleted") from error
            code, status = s3_error_of(error)
            if status != 501 and code != "NotImplemented":
                raise
            what = f"answers HTTP {status} {code} to conditional writes"
            conditional_writes.remember(endpoint, bucket, what)
            if not conditional_writes.single_writer_declared():
                raise conditional_writes.unsupported(endpoint, bucket, what) from error
            await super().put_if_version(key, data, version, max_nbytes)


class _LeanReads:
    """Reads through the shared ``S3ReadClient`` of this process, loop and options."""

    def __init__(self, store: S3Store, config: S3ReadConfig) -> None:
        self.store = store
        self.config = config
        self.key = "lean-reads:" + store._shared_key(store._options())
        self._clients = ProcessLocal[weakref.WeakKeyDictionary[Any, S3ReadClient]]()
        #: the last loop asked for (weakly) and its client: every range GET asks, and a
        #: weak-keyed lookup makes a weak reference each time
        self._last = ProcessLocal[tuple[weakref.ref[Any], S3ReadClient]]()

    async def client(self) -> S3ReadClient:
        loop = asyncio.get_running_loop()
        last = self._last.value
        if last is not None and last[0]() is loop:
            return last[1]
        clients = self._clients.get_or_make(weakref.WeakKeyDictionary)
        client = clients.get(loop)
        if client is None:

            async def make() -> S3ReadClient:
                return S3ReadClient(self.config)

            client = clients[loop] = await shared_client(self.key, make)
        self._last.value = (weakref.ref(loop), client)
        return client

    async def connect(self) -> None:
        await self.client()

    def is_connected(self) -> bool:
        loop = asyncio.get_running_loop()
        last = self._last.value
        if last is not None and last[0]() is loop:
            return True
        clients = self._clients.value
        return clients is not None and loop in clients

    def forget_loop(self) -> None:
        self._last.value = None
        clients = self._clients.value
        if clients is not None:
            with contextlib.suppress(RuntimeError):
                clients.pop(asyncio.get_running_loop(), None)

    def preload(self) -> None:
        import aiohttp  # noqa: F401
        import botocore.auth
        import botocore.awsrequest  # noqa: F401

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await (await self.client()).get_range(*self.store.bucket_key(key), start, end)

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        return await (await self.client()).get_suffix(*self.store.bucket_key(key), nbytes)

    async def get(self, key: str) -> bytes:
        return await (await self.client()).get(*self.store.bucket_key(key))

    async def size(self, key: str) -> int:
        return await (await self.client()).size(*self.store.bucket_key(key))

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        return await (await self.client()).list_keys(bucket, prefix)


class _S3fsReads:
    """Reads through s3fs's ``get_object``, with the answer checked as the lean client does."""

    def __init__(self, store: S3Store) -> None:
        self.store = store

    async def connect(self) -> None:
        await self.store._fs()

    def is_connected(self) -> bool:
        return FsspecStore.is_connected(self.store)

    def forget_loop(self) -> None:
        """Nothing beyond the store's own filesystem (forgotten by ``FsspecStore.aclose``)."""

    def preload(self) -> None:
        FsspecStore.preload(self.store)

    async def _get_object(
        self, key: str, limit: int | None, **kwargs: Any
    ) -> tuple[int, dict[str, Any], bytes]:
        """(status, the answer's fields, body): at most ``limit`` bytes of a 200."""
        fs = await self.store._fs()
        bucket, object_key = self.store.bucket_key(key)
        answer = await fs._call_s3("get_object", Bucket=bucket, Key=object_key, **kwargs)
        status = int(answer.get("ResponseMetadata", {}).get("HTTPStatusCode", 200))
        body = answer["Body"]
        try:
            if status == 200 and limit is not None:
                # a server that may have ignored the range: no more than asked for; one
                # read(n) returns what has arrived, up to n, so read until there is enough
                pieces, remaining = [], limit
                while remaining > 0 and (piece := await body.read(remaining)):
                    pieces.append(piece)
                    remaining -= len(piece)
                data = b"".join(pieces)
            else:
                data = await body.read()
        finally:
            body.close()
        return status, answer, data

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            status, answer, body = await self._get_object(
                key, end, Range=f"bytes={start}-{end - 1}"
            )
        except OSError as error:
            if _is_invalid_range(error):
                return b""  # the range starts past the object's end
            raise
        content_range = answer.get("ContentRange")
        object_size = None
        if needs_object_size(status, content_range, start):
            fs, (bucket, object_key) = await self.store._fs(), self.store.bucket_key(key)
            head = await fs._call_s3("head_object", Bucket=bucket, Key=object_key)
            object_size = int(head["ContentLength"])
        announced = answer.get("ContentLength")
        return ranged_body(
            status,
            content_range,
            body,
            start,
            end,
            self.store.describe(key),
            announced=int(announced) if announced is not None else None,
            object_size=object_size,
        )

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        if nbytes <= 0:
            return b""
        try:
            status, answer, body = await self._get_object(key, None, Range=f"bytes=-{nbytes}")
        except OSError as error:
            if not _is_invalid_range(error):
                raise
            # an empty object (no last byte to count from), or a suffix longer than the
            # object on a server that refuses it (rclone): the whole object is the answer
            status, answer, body = await self._get_object(key, None)
        return suffix_body(status, answer.get("ContentRange"), body, nbytes,
                           self.store.describe(key))  # fmt: skip

    async def get(self, key: str) -> bytes:
        return bytes(await self.store._call("cat_file", self.store._path(key)))

    async def size(self, key: str) -> int:
        info = await self.store._call("info", self.store._path(key))
        return int(info["size"])


def _is_invalid_range(error: BaseException) -> bool:
    from rangestream.io.retry import is_range_not_satisfiable

    return is_range_not_satisfiable(error) or "InvalidRange" in str(error)
