"""The lean S3 read client: range GETs over aiohttp, SigV4-signed as botocore signs them.

Why this exists: a range GET through s3fs and aiobotocore runs botocore's whole request
pipeline (parameter validation, event hooks, response parsing) in Python, several times
the CPU of a bare aiohttp request, and making an s3fs client on a fresh event loop costs far
more while botocore loads its service models (figures in docs/design.md). On small machines
that CPU is what limits S3 reads and a DataLoader's time to first batch. ``S3Store`` sends
its reads (``get_range``, ``get_suffix``, ``get``, ``size``, ``exists``) and its listings
of keys (``list``) through ``S3ReadClient`` and keeps s3fs for writes, deletes and
listings with details; neither s3fs nor aiobotocore is imported for reads. Requests are
signed by ``rangestream.io.sigv4``.

Which storage options it takes, and credentials: ``rangestream.io.s3_options``. On AWS's
own endpoint a bucket in another region is followed once via the ``x-amz-bucket-region``
answer, as botocore does.

- Errors are those s3fs raises, so the range reader classifies them the same way:
  404 -> ``FileNotFoundError``, 403 -> ``PermissionError``, 5xx/throttling ->
  ``S3TransientError`` (a ``ConnectionError``), transport failures -> aiohttp's errors, a body
  shorter than announced -> ``ShortReadError``. A range starting past the end (416) reads as
  ``b""`` (the store contract: fewer bytes only if the object ends first).
- No retries here: ``RangeReader`` owns them, counts them and bounds their time.
"""

from __future__ import annotations

import errno
import re
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

from rangestream.io.process import ProcessLocal
from rangestream.io.range_answers import needs_object_size, ranged_body, suffix_body
from rangestream.io.retry import ShortReadError, WrongRangeError
from rangestream.io.s3_options import S3ReadConfig, chain_credentials, static_credentials
from rangestream.io.sigv4 import SigV4Signer

__all__ = [
    "S3ReadClient",
    "S3RequestError",
    "S3TransientError",
    "WrongRangeError",
]

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
    }
)
_ERROR_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_ERROR_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class S3TransientError(ConnectionError):
    """A 5xx or throttling answer: a later attempt of the same request may succeed."""


class S3RequestError(OSError):
    """Any other refusal (400 InvalidArgument, say): repeating the request will not help."""


# -- the client --------------------------------------------------------------------------


def _plain_http(endpoint_url: str | None) -> bool:
    """Whether every request goes to an ``http://`` endpoint, where no certificate is read."""
    return endpoint_url is not None and endpoint_url.lower().startswith("http://")


#: ca_bundle path -> its SSL context, made once per process (about 30 ms to load a bundle)
_contexts = ProcessLocal[dict[str, Any]]()


def _trusting(ca_bundle: str) -> Any:
    """An SSL context trusting ``ca_bundle``, shared by the process's clients.

    Each DataLoader worker opens its own client (one per loop): loading the system's bundle
    for each took about 30 ms of a worker's start, also for a plain ``http://`` endpoint
    (``AWS_CA_BUNDLE`` is set on many clusters), where no certificate is ever checked.
    """
    import ssl

    contexts = _contexts.get_or_make(dict)
    if ca_bundle not in contexts:
        contexts[ca_bundle] = ssl.create_default_context(cafile=ca_bundle)
    return contexts[ca_bundle]


class S3ReadClient:
    """Signed range GETs and HEADs over one aiohttp session, bound to the loop that made it.

    Make it inside the running loop that will use it and ``await aclose()`` before that loop
    ends; never use it in another loop or in a forked child (``S3Store`` shares one per
    process, loop and options, through ``fsspec_store.shared_client``).
    """

    def __init__(self, config: S3ReadConfig) -> None:
        import aiohttp
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from yarl import URL

        self.config = config
        self._aiohttp = aiohttp
        self._signer_class = S3SigV4Auth
        self._request_class = AWSRequest
        self._url_class = URL
        self._aws_endpoint = config.endpoint_url is None
        self._bucket_regions: dict[str, str] = {}
        self._sizes: dict[tuple[str, str, str], int] = {}
        self._static = None if config.anon else static_credentials(config)
        self._signers: dict[str, SigV4Signer] = {}
        #: (scheme, host) -> (proxy URL, proxy auth) from the environment, once per host
        self._proxies: dict[tuple[str, str | None], tuple[Any, Any]] = {}
        ssl: Any = True
        if config.ca_bundle and not _plain_http(config.endpoint_url):
            ssl = _trusting(config.ca_bundle)  # the certificates botocore trusts there
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=config.max_connections, limit_per_host=0, ttl_dns_cache=300, ssl=ssl
            ),
            # Not aiohttp's trust_env: it looks up ~/.netrc in a thread-pool executor and the
            # proxy environment in another thread (``asyncio.to_thread``) for every request,
            # two thread handoffs per GET (about a third of a token window's client CPU, and
            # the loop waits on both). The proxies are resolved once per host (``_proxy``).
            trust_env=False,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
            ),
            auto_decompress=False,  # the stored bytes, as botocore returns them
            skip_auto_headers=("Accept-Encoding",),
        )

    @property
    def closed(self) -> bool:
        return bool(self._session.closed)

    async def aclose(self) -> None:
        await self._session.close()

    # -- reads -----------------------------------------------------------------------
    async def get_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; fewer only if the object ends first (``b""`` past its end).

        The answer is checked (``range_answers``). A server that ignores the range answers
        200 with the whole object: only its first ``end`` bytes are read (the connection is
        dropped, not drained), then sliced if a HEAD confirms it is the whole object.
        """
        if end <= start:
            return b""
        status, headers, body = await self._send(
            "GET", bucket, key, {"Range": f"bytes={start}-{end - 1}"}, limit=end
        )
        content_range = headers.get("Content-Range")
        if status == 206 and content_range is not None and len(body) == end - start:
            # the answer of nearly every read: exactly the range asked for (what
            # ``ranged_body`` accepts first, without its regular expression and messages)
            prefix = f"bytes {start}-{end - 1}/"
            if content_range.startswith(prefix):
                total = content_range[len(prefix) :]
                if total == "*" or (total.isdigit() and total.isascii()):
                    return body
        announced = headers.get("Content-Length")
        object_size = None
        if needs_object_size(status, content_range, start):
            object_size = await self._whole_size(bucket, key, headers.get("ETag"))
        return ranged_body(
            status,
            content_range,
            body,
            start,
            end,
            f"s3://{bucket}/{key}",
            announced=int(announced) if announced is not None else None,
            object_size=object_size,
        )

    async def _whole_size(self, bucket: str, key: str, etag: str | None) -> int:
        """The size of the object, known per version (ETag): one HEAD per object of a
        server that ignores ranges, not one per read."""
        if etag is not None and (bucket, key, etag) in self._sizes:
            return self._sizes[bucket, key, etag]
        _, headers, _ = await self._send("HEAD", bucket, key, {})
        size = int(headers["Content-Length"])
        if etag is not None and headers.get("ETag") == etag:
            if len(self._sizes) >= 4096:
                self._sizes.clear()
            self._sizes[bucket, key, etag] = size
        return size

    async def get_suffix(self, bucket: str, key: str, nbytes: int) -> bytes:
        """The last ``nbytes`` bytes (all of them if the object is shorter)."""
        if nbytes <= 0:
            return b""
        status, headers, body = await self._send("GET", bucket, key, {"Range": f"bytes=-{nbytes}"})
        if status == 416 and (headers.get("Content-Range") or "").strip() != "bytes */0":
            # a suffix longer than a non-empty object: S3 answers the whole object, rclone
            # answers 416; the whole object is what was asked for
            status, headers, body = await self._send("GET", bucket, key, {})
        return suffix_body(status, headers.get("Content-Range"), body, nbytes,
                           f"s3://{bucket}/{key}")  # fmt: skip

    async def get(self, bucket: str, key: str) -> bytes:
        _, _, body = await self._send("GET", bucket, key, {})
        return body

    async def size(self, bucket: str, key: str) -> int:
        _, headers, _ = await self._send("HEAD", bucket, key, {})
        return int(headers["Content-Length"])

    async def list_keys(self, bucket: str, prefix: str, page_size: int | None = None) -> list[str]:
        """Keys of the objects whose keys start with ``prefix``: ListObjectsV2, every page.

        Only the keys are read from the answer: s3fs parses each entry's timestamp (with
        dateutil) and builds an info dict per key, ~0.15 ms a key of CPU, which a commit
        pays for each of its 10^3 or more parts, and again for the objects of the version
        it retires. ``page_size`` (``max-keys``) is the server's (1,000) unless given.
        """
        keys: list[str] = []
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if page_size is not None:
                query["max-keys"] = str(page_size)
            if token is not None:
                query["continuation-token"] = token
            _, _, body = await self._send("GET", bucket, "", {}, query=query)
            page = _listing(body, f"s3://{bucket}/{prefix}")
            keys += page.keys
            if not page.truncated:
                return keys
            if not page.token:
                raise S3RequestError(
                    errno.EIO,
                    f"s3://{bucket}/{prefix}: a truncated listing without a continuation token",
                )
            token = page.token

    # -- one request -----------------------------------------------------------------
    def _url(self, bucket: str, key: str) -> tuple[str, str]:
        """(URL, region to sign for) of an object."""
        region = self._bucket_regions.get(bucket, self.config.region)
        path = quote(key, safe="/~")
        style = self.config.addressing_style
        if self._aws_endpoint:
            virtual = style == "virtual" or (
                style == "auto" and _DNS_BUCKET.match(bucket) is not None and ".." not in bucket
            )
            if virtual:
                return f"https://{bucket}.s3.{region}.amazonaws.com/{path}", region
            return f"https://s3.{region}.amazonaws.com/{quote(bucket)}/{path}", region
        endpoint = self.config.endpoint_url
        assert endpoint is not None
        if style == "virtual":
            scheme, host = endpoint.split("://", 1)
            return f"{scheme}://{bucket}.{host}/{path}", region
        return f"{endpoint}/{quote(bucket)}/{path}", region

    def _proxy(self, url: Any) -> tuple[Any, Any]:
        """(proxy URL, its credentials) for ``url``, or ``(None, None)``: ``HTTP_PROXY`` /
        ``HTTPS_PROXY`` / ``NO_PROXY`` (and a proxy's ``~/.netrc`` entry) as aiohttp's
        ``trust_env`` reads them, once per scheme and host of this client, as botocore
        reads them once per client. The target host's own ``~/.netrc`` entry is not used:
        botocore does not use it, and its Basic auth cannot go with a SigV4 signature."""
        key = (url.scheme, url.host)
        found = self._proxies.get(key)
        if found is None:
            from aiohttp.helpers import get_env_proxy_for_url

            try:
                found = get_env_proxy_for_url(url)
            except LookupError:  # no proxy for this URL, or NO_PROXY names its host
                found = (None, None)
            self._proxies[key] = found
        return found

    def _signed(self, method: str, url: str, region: str, headers: dict[str, str]) -> Any:
        """``headers`` plus the SigV4 headers, as botocore's ``S3SigV4Auth`` would add them.

        ``SigV4Signer`` (``rangestream.io.sigv4``) signs the requests this client sends at a
        tenth of botocore's cost; a URL it does not handle (one with a query string) is
        signed by botocore.
        """
        if self.config.anon:
            return headers
        credentials: Any = self._static
        if credentials is None:
            chain = chain_credentials()
            if chain is None:
                from botocore.exceptions import NoCredentialsError

                raise NoCredentialsError()
            credentials = chain.get_frozen_credentials()  # refreshed here when due
            signer = SigV4Signer(
                credentials.access_key, credentials.secret_key, credentials.token, region
            )
        else:
            signer = self._signers.get(region)
            if signer is None:
                signer = self._signers[region] = SigV4Signer(
                    credentials.access_key, credentials.secret_key, credentials.token, region
                )
        try:
            return signer.sign(method, url, headers)
        except ValueError:
            pass  # outside the fast signer's scope
        request = self._request_class(method=method, url=url, headers=headers)
        self._signer_class(credentials, "s3", region).add_auth(request)
        return request.headers.items()

    async def _send(
        self,
        method: str,
        bucket: str,
        key: str,
        headers: dict[str, str],
        *,
        limit: int | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, Any, bytes]:
        """(status, headers, body) of a 2xx or 416 answer; raises the s3fs-equivalent error.

        ``limit`` bounds the bytes read of a 200 answer (to a range request the server did
        not honour): the rest is never read, so a hostile object cannot exhaust memory.
        ``query`` is sent URI-encoded as SigV4 signs it (a listing's parameters).
        """
        aiohttp = self._aiohttp
        for redirects in range(2):
            url, region = self._url(bucket, key)
            if query:
                url += "?" + "&".join(
                    f"{quote(name, safe='-_.~')}={quote(value, safe='-_.~')}"
                    for name, value in sorted(query.items())
                )
            signed = self._signed(method, url, region, headers)
            target = self._url_class(url, encoded=True)
            proxy, proxy_auth = self._proxy(target)
            try:
                async with self._session.request(
                    method,
                    target,
                    headers=signed,
                    allow_redirects=False,
                    proxy=proxy,
                    proxy_auth=proxy_auth,
                ) as response:
                    status = response.status
                    answer_headers = response.headers
                    if status == 200 and limit is not None:
                        body = await _read_at_most(response, limit)
                        if len(body) == limit:
                            response.close()  # more may follow: drop, do not drain
                            return status, answer_headers, body
                    else:
                        body = await response.read()
            except aiohttp.ConnectionTimeoutError as error:
                from botocore.exceptions import ConnectTimeoutError

                # botocore's name for it, which the retry policy knows as "unreachable"
                raise ConnectTimeoutError(endpoint_url=url, error=error) from error
            if 200 <= status < 300 or status == 416:
                expected = answer_headers.get("Content-Length")
                if method != "HEAD" and expected is not None and int(expected) != len(body):
                    raise ShortReadError(
                        f"s3://{bucket}/{key}: got {len(body)} of {expected} bytes"
                    )
                return status, answer_headers, body
            moved = answer_headers.get("x-amz-bucket-region")
            if (
                redirects == 0
                and self._aws_endpoint
                and moved
                and moved != region
                and status in {301, 307, 400}
            ):
                self._bucket_regions[bucket] = moved  # the bucket lives elsewhere: follow once
                continue
            raise _error(status, body, f"s3://{bucket}/{key}")
        raise AssertionError("unreachable")  # pragma: no cover


class _ListingPage:
    """One page of a ListObjectsV2 answer: its keys, and whether (and where) it goes on."""

    def __init__(self, keys: list[str], truncated: bool, token: str | None) -> None:
        self.keys = keys
        self.truncated = truncated
        self.token = token


def _listing(body: bytes, where: str) -> _ListingPage:
    """The keys of a ListObjectsV2 page (``Contents/Key``), namespaced or not.

    Every key, "directory" markers ending in ``/`` included, as s3fs's ``find`` lists them
    (so ``delete_prefix`` deletes them too).
    """
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise S3RequestError(errno.EIO, f"{where}: an unreadable listing ({error})") from error
    keys, truncated, token = [], False, None
    for child in root:
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "Contents":
            for field in child:
                if field.tag.rsplit("}", 1)[-1] == "Key" and field.text:
                    keys.append(field.text)
                    break
        elif tag == "IsTruncated":
            truncated = (child.text or "").strip() == "true"
        elif tag == "NextContinuationToken":
            token = child.text
    return _ListingPage(keys, truncated, token)


async def _read_at_most(response: Any, limit: int) -> bytes:
    parts = []
    remaining = limit
    while remaining > 0:
        part = await response.content.read(min(remaining, 1 << 20))
        if not part:
            break
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)


def _error(status: int, body: bytes, where: str) -> OSError:
    """The exception s3fs raises for the same answer (its ``translate_boto_error``)."""
    match = _ERROR_CODE.search(body)
    code = match.group(1).decode(errors="replace") if match else ""
    match = _ERROR_MESSAGE.search(body)
    message = match.group(1).decode(errors="replace") if match else ""
    text = f"{where}: HTTP {status} {code or 'error'}" + (f": {message}" if message else "")
    if status == 404 or code in {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}:
        return FileNotFoundError(errno.ENOENT, text)
    if status == 403 or code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
        return PermissionError(errno.EACCES, text)
    if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
        return S3TransientError(text)
    return S3RequestError(errno.EIO, text)
