"""Google Cloud Storage (``gs://bucket/prefix``): gcsfs for credentials, sessions and listings.

gcsfs resolves credentials its own way (``token=`` a file, ``"google_default"``, ``"cloud"``,
``"anon"``, application default credentials) and owns the aiohttp session; the storage
options go to it unchanged. Reads and writes are issued here, through gcsfs's request
method without its own retry loop (six attempts with up to 32 s of sleep would hide
attempts from the range reader's counters and from its deadline), so that:

- a range read is one GET with ``Range: bytes=a-b``, its answer checked as S3's are
  (``range_answers``: a 206 whose ``Content-Range`` is the range asked for, or a 200 that
  is the whole object), never a whole-object download sliced here;
- the root is published with ``ifGenerationMatch`` (``0``: must not exist; otherwise the
  generation the commit read), once ``conditional_writes.proven`` has shown that the
  endpoint honours it. ``gcp-storage-emulator`` does not (it ignores the precondition):
  there a commit is refused unless one writer is declared (``RANGESTREAM_SINGLE_WRITER=1``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rangestream.errors import ConcurrentWriteError
from rangestream.io import conditional_writes
from rangestream.io.fsspec_store import FsspecStore
from rangestream.io.range_answers import needs_object_size, ranged_body

__all__ = ["GcsStore"]

#: What GCS calls its conditions (named in a refusal).
_CONDITIONS = "ifGenerationMatch"


def _unretried_request() -> Any:
    """gcsfs's request coroutine without its ``retry_request`` decorator."""
    from gcsfs.core import GCSFileSystem

    request = GCSFileSystem._request
    return getattr(request, "__wrapped__", request)


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


class GcsStore(FsspecStore):
    """Objects under ``gs://bucket/prefix`` (also ``gcs://``)."""

    is_async = True

    def _make_filesystem(self, options: dict[str, Any]) -> Any:
        # gcsfs's core filesystem, not the experimental one ``gs://`` maps to by default
        # (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT): that one asks a gRPC control API for each
        # bucket's layout, which a custom endpoint (an emulator) never answers (60 s per
        # bucket); every request here is a JSON API request either way.
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(asynchronous=True, skip_instance_cache=True, **options)

    def preload(self) -> None:
        import gcsfs.core  # noqa: F401

    def bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, object_key = self._path(key).partition("/")
        return bucket, object_key

    async def _request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None,
        data: bytes | None = None, **params: Any,
    ) -> tuple[int, Any, bytes]:  # fmt: skip
        """One request (no retries of gcsfs's): status, headers, body; errors as gcsfs
        raises them (404: ``FileNotFoundError``, 412: ``FileExistsError``, ``HttpError``)."""
        fs = await self._fs()
        status, answer_headers, _, contents = await _unretried_request()(
            fs, method, url, headers=headers, data=data, **params
        )
        return status, answer_headers, contents

    async def _media_url(self, key: str) -> str:
        fs, (bucket, object_key) = await self._fs(), self.bucket_key(key)
        return f"{fs._location}/download/storage/v1/b/{_quote(bucket)}/o/{_quote(object_key)}"

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        try:
            status, headers, body = await self._request(
                "GET", await self._media_url(key), headers={"Range": f"bytes={start}-{end - 1}"},
                alt="media",
            )  # fmt: skip
        except (ValueError, OSError) as error:
            if _is_invalid_range(error):
                return b""  # the range starts past the object's end
            raise
        content_range = headers.get("Content-Range")
        if status == 206 and not body and _past_the_end(content_range, start):
            return b""  # gcp-storage-emulator's answer where GCS answers 416
        object_size = None
        if needs_object_size(status, content_range, start):
            object_size = await self.size(key)
        announced = headers.get("Content-Length")
        return ranged_body(
            status,
            content_range,
            body[:end] if status == 200 and not content_range else body,
            start,
            end,
            self.describe(key),
            announced=int(announced) if announced is not None else None,
            object_size=object_size,
        )

    async def get_suffix(self, key: str, nbytes: int) -> bytes:
        # the size first: gcp-storage-emulator answers no suffix range (``bytes=-n``)
        size = await self.size(key)
        return await self.get_range(key, max(0, size - nbytes), size)

    async def get(self, key: str) -> bytes:
        _, _, body = await self._request("GET", await self._media_url(key), alt="media")
        return body

    async def _metadata(self, key: str) -> dict[str, Any]:
        fs = await self._fs()
        bucket, object_key = self.bucket_key(key)
        _, _, body = await self._request(
            "GET", f"{fs._location}/storage/v1/b/{_quote(bucket)}/o/{_quote(object_key)}"
        )
        return dict(json.loads(body))

    async def size(self, key: str) -> int:
        try:
            return int((await self._metadata(key))["size"])
        except FileNotFoundError:
            return await super().size(key)  # gcsfs measures a "directory" or raises

    async def exists(self, key: str) -> bool:
        try:
            await self._metadata(key)
        except FileNotFoundError:
            return await super().exists(key)
        return True

    async def put(self, key: str, data: bytes | memoryview) -> None:
        await self._upload(key, bytes(data), None)

    async def _upload(self, key: str, data: bytes, generation: str | None) -> str:
        """One multipart upload (``ifGenerationMatch=generation`` if given); the new
        object's generation. ``FileExistsError`` when GCS refuses the precondition."""
        fs = await self._fs()
        bucket, object_key = self.bucket_key(key)
        boundary = f"rangestream-{uuid.uuid4().hex}"
        body = b"".join((
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps({"name": object_key}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--".encode(),
        ))  # fmt: skip
        params: dict[str, Any] = {"uploadType": "multipart"}
        if generation is not None:
            params["ifGenerationMatch"] = generation
        _, _, answer = await self._request(
            "POST",
            f"{fs._location}/upload/storage/v1/b/{_quote(bucket)}/o",
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
            data=body,
            **params,
        )
        return str(json.loads(answer).get("generation", ""))

    # -- object versions, conditional writes (commit) ------------------------------------
    async def get_versioned(self, key: str, max_nbytes: int) -> tuple[bytes, str]:
        """The bytes and the generation they are of.

        GCS names the generation of a download in ``x-goog-generation``: one request, so
        the bytes and the version cannot disagree. A server that does not send it (the
        emulator) is asked for the object's metadata first and then for that generation.
        """
        url = await self._media_url(key)
        try:
            _, headers, body = await self._request(
                "GET", url, headers={"Range": f"bytes=0-{max_nbytes - 1}"}, alt="media"
            )
        except (ValueError, OSError) as error:
            if not _is_invalid_range(error):
                raise
            _, headers, body = await self._request("GET", url, alt="media")  # empty
        generation = headers.get("x-goog-generation")
        if generation is None:
            generation = str((await self._metadata(key))["generation"])
            _, headers, body = await self._request(
                "GET", url, headers={"Range": f"bytes=0-{max_nbytes - 1}"}, alt="media",
                generation=generation,
            )  # fmt: skip
        return bytes(body[:max_nbytes]), str(generation)

    async def put_if_version(
        self, key: str, data: bytes, version: str | None, max_nbytes: int
    ) -> None:
        """An upload with ``ifGenerationMatch`` (0 for a new object), once the endpoint is
        proved to honour it; else refused, or checked then written for a declared single
        writer (``conditional_writes``)."""
        fs = await self._fs()
        bucket, _ = self.bucket_key("")
        label = f"{fs._location}/{bucket}"
        # the probe object goes under the dataset's root (keys here are relative to it)
        refused = await conditional_writes.proven(label, _GcsPuts(self), "", _CONDITIONS)
        if refused is not None:
            if conditional_writes.single_writer_declared():
                await super().put_if_version(key, data, version, max_nbytes)
                return
            raise conditional_writes.unsupported_by("Google Cloud Storage endpoint", label, refused)
        try:
            await self._upload(key, bytes(data), "0" if version is None else version)
        except FileExistsError as error:
            raise ConcurrentWriteError(f"{self.describe(key)} changed since it was read") from error


class _GcsPuts:
    """``ConditionalPuts`` by ``ifGenerationMatch``, for the probe of ``conditional_writes``."""

    wrong_version = "1"  # generations are microsecond timestamps: none is 1

    def __init__(self, store: GcsStore) -> None:
        self.store = store

    async def create(self, key: str, body: bytes) -> str:
        return await self._put(key, body, "0")

    async def replace(self, key: str, body: bytes, version: str) -> str:
        return await self._put(key, body, version)

    async def _put(self, key: str, body: bytes, generation: str) -> str:
        try:
            return await self.store._upload(key, body, generation)
        except FileExistsError as error:
            raise ConcurrentWriteError(self.store.describe(key)) from error

    async def remove(self, key: str) -> None:
        fs = await self.store._fs()
        bucket, object_key = self.store.bucket_key(key)
        await self.store._request(
            "DELETE", f"{fs._location}/storage/v1/b/{_quote(bucket)}/o/{_quote(object_key)}"
        )


def _past_the_end(content_range: str | None, start: int) -> bool:
    """Whether ``Content-Range`` is ``bytes start-(total-1)/total`` with ``start >= total``."""
    import re

    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", (content_range or "").strip())
    return match is not None and int(match.group(1)) == start >= int(match.group(3))


def _is_invalid_range(error: BaseException) -> bool:
    """gcsfs's form of an HTTP 416 (a range past the end): an ``HttpError`` with code 416,
    or the ``ValueError`` it raises for messages that contain "invalid"."""
    code = getattr(error, "code", None)
    return code == 416 or (isinstance(error, ValueError) and "range" in str(error).lower())
