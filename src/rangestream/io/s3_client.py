"""The lean S3 read client: range GETs over aiohttp, SigV4-signed as botocore signs them.

Why this exists: a range GET through s3fs and aiobotocore runs botocore's whole request
pipeline (parameter validation, event hooks, response parsing) in Python, several times
the CPU of a bare aiohttp request, and making an s3fs client on a fresh event loop costs far
more while botocore loads its service models (figures in docs/design.md). On small machines
that CPU is what limits S3 reads and a DataLoader's time to first batch. ``S3Store`` sends
its reads (``get_range``, ``get_suffix``, ``get``, ``size``, ``exists``) through
``S3ReadClient`` and keeps s3fs for writes, listings and deletes; neither s3fs nor
aiobotocore is imported for reads. Requests are signed by ``rangestream.io.sigv4``.

Only storage options whose meaning this module reproduces exactly are accepted
(``lean_read_config``); anything else (``requester_pays``, SSE-C in ``s3_additional_kwargs``,
``profile``, a botocore ``session``, unknown ``config_kwargs``...) keeps reads on s3fs, so
behaviour never changes silently.

- Credentials: ``key``/``secret``/``token`` (or ``username``/``password``, or
  ``client_kwargs.aws_access_key_id``/``aws_secret_access_key``/``aws_session_token``), else
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, else botocore's
  credential chain (profiles, SSO, instance roles...), resolved once per process and only
  when needed; refreshable credentials are frozen per request. ``anon=True``: unsigned.
- Endpoint: ``endpoint_url`` or ``client_kwargs.endpoint_url``, else ``AWS_ENDPOINT_URL_S3`` /
  ``AWS_ENDPOINT_URL``, else ``https://s3.<region>.amazonaws.com``. Region:
  ``client_kwargs.region_name`` / ``config_kwargs.region_name``, else ``AWS_REGION`` /
  ``AWS_DEFAULT_REGION``, else ``us-east-1``; on AWS's own endpoint a bucket in another region
  is followed once via the ``x-amz-bucket-region`` answer, as botocore does.
- Addressing: path-style on custom endpoints; virtual-hosted on AWS for DNS-compatible bucket
  names (``config_kwargs={"s3": {"addressing_style": "path" | "virtual"}}`` forces either).
- Errors are those s3fs raises, so the range reader classifies them the same way:
  404 -> ``FileNotFoundError``, 403 -> ``PermissionError``, 5xx/throttling ->
  ``S3TransientError`` (a ``ConnectionError``), transport failures -> aiohttp's errors, a body
  shorter than announced -> ``ShortReadError``. A range starting past the end (416) reads as
  ``b""`` (the store contract: fewer bytes only if the object ends first).
- No retries here: ``RangeReader`` owns them, counts them and bounds their time.

Opt out (reads through s3fs, as before): set ``RANGESTREAM_S3_READS=s3fs`` in the
environment (read when a store is made, and inherited by DataLoader workers).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from rangestream.io.process import ProcessLocal
from rangestream.io.retry import ShortReadError
from rangestream.io.sigv4 import SigV4Signer

#: Environment switch: ``s3fs`` sends S3 reads through s3fs; anything else (or unset) is lean.
READS_ENV = "RANGESTREAM_S3_READS"
DEFAULT_REGION = "us-east-1"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 128

#: Top-level s3fs options that do not change what a read sends or returns.
_NEUTRAL_OPTIONS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",
        "fixed_upload_size",
        "max_concurrency",
        "asynchronous",
        "use_ssl",  # True is the default; False is refused below
    }
)
_CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "username", "password", "anon"})
_CLIENT_KWARGS = frozenset(
    {
        "endpoint_url",
        "region_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    }
)
#: ``retries`` is accepted and ignored: RangeReader owns retries (the store turns botocore's off).
_CONFIG_KWARGS = frozenset(
    {"connect_timeout", "read_timeout", "max_pool_connections", "retries", "region_name", "s3"}
)
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
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


class S3TransientError(ConnectionError):
    """A 5xx or throttling answer: a later attempt of the same request may succeed."""


class S3RequestError(OSError):
    """Any other refusal (400 InvalidArgument, say): repeating the request will not help."""


def lean_reads_enabled() -> bool:
    """Whether the environment leaves S3 reads to ``S3ReadClient`` (the default)."""
    return os.environ.get(READS_ENV, "").strip().lower() != "s3fs"


@dataclass(frozen=True)
class S3ReadConfig:
    """What ``S3ReadClient`` needs from ``storage_options``; made by ``lean_read_config``.

    ``key``/``secret`` left ``None`` (and ``anon`` false) means the environment or botocore's
    credential chain supplies credentials when the first request is signed.
    """

    endpoint_url: str | None
    region: str
    anon: bool = False
    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    addressing_style: str = "auto"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def lean_read_config(storage_options: dict[str, Any]) -> S3ReadConfig | None:
    """The lean client's configuration, or ``None`` if s3fs must keep serving the reads.

    ``None`` whenever an option is present whose effect on reads this client does not
    reproduce, so choosing the lean path never changes what a read does.
    """
    options = dict(storage_options)
    for name in list(options):
        if name in _NEUTRAL_OPTIONS:
            value = options.pop(name)
            if name == "use_ssl" and value is not True:
                return None
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    config_kwargs = dict(options.pop("config_kwargs", None) or {})
    top_endpoint = options.pop("endpoint_url", None)
    credentials = {name: options.pop(name) for name in list(options) if name in _CREDENTIAL_OPTIONS}
    # requester_pays, version_aware and s3_additional_kwargs change nothing when off or empty
    for name in ("requester_pays", "version_aware", "s3_additional_kwargs"):
        if options.pop(name, None):
            return None
    if options:  # profile, session, loop, anything unknown
        return None
    if not set(client_kwargs) <= _CLIENT_KWARGS or not set(config_kwargs) <= _CONFIG_KWARGS:
        return None
    s3_config = dict(config_kwargs.get("s3") or {})
    addressing_style = s3_config.pop("addressing_style", "auto") or "auto"
    if s3_config or addressing_style not in {"auto", "path", "virtual"}:
        return None

    client_endpoint = client_kwargs.get("endpoint_url")
    if top_endpoint and client_endpoint and top_endpoint != client_endpoint:
        return None  # s3fs would refuse or pick one; let it
    endpoint_url = (
        top_endpoint
        or client_endpoint
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    if endpoint_url is not None and not str(endpoint_url).startswith(("http://", "https://")):
        return None
    region = (
        client_kwargs.get("region_name")
        or config_kwargs.get("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or DEFAULT_REGION
    )

    key = credentials.get("key") or credentials.get("username")
    secret = credentials.get("secret") or credentials.get("password")
    token = credentials.get("token")
    if credentials.get("key") and credentials.get("username"):
        return None
    if credentials.get("secret") and credentials.get("password"):
        return None
    key = key or client_kwargs.get("aws_access_key_id")
    secret = secret or client_kwargs.get("aws_secret_access_key")
    token = token or client_kwargs.get("aws_session_token")
    anon = bool(credentials.get("anon", False))
    if not anon and bool(key) != bool(secret):
        return None  # half a key pair: botocore's rules for that are its own
    if anon:
        key = secret = token = None

    retries = config_kwargs.get("retries")
    if retries is not None and not isinstance(retries, dict):
        return None
    try:
        return S3ReadConfig(
            endpoint_url=str(endpoint_url).rstrip("/") if endpoint_url else None,
            region=str(region),
            anon=anon,
            key=key,
            secret=secret,
            token=token,
            addressing_style=addressing_style,
            connect_timeout=float(config_kwargs.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)),
            read_timeout=float(config_kwargs.get("read_timeout", DEFAULT_READ_TIMEOUT)),
            max_connections=int(config_kwargs.get("max_pool_connections", DEFAULT_MAX_CONNECTIONS)),
        )
    except (TypeError, ValueError):
        return None


# -- credentials -------------------------------------------------------------------------

_chain = ProcessLocal[tuple[Any]]()  # (botocore credentials or None,)


def _chain_credentials() -> Any:
    """botocore's credential chain, resolved once per process (a few ms, plus any I/O)."""

    def resolve() -> tuple[Any]:
        import botocore.session

        return (botocore.session.get_session().get_credentials(),)

    return (_chain.value or _chain.get_or_make(resolve))[0]


@dataclass(frozen=True)
class _Keys:
    """What botocore's signer reads from credentials (importing ``botocore.credentials``
    is slow, and static keys need none of it)."""

    access_key: str
    secret_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)


def _static_credentials(config: S3ReadConfig) -> _Keys | None:
    """Credentials from the options or the environment; ``None`` means ask the chain."""
    if config.key and config.secret:
        return _Keys(config.key, config.secret, config.token)
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return _Keys(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)
    return None


# -- the client --------------------------------------------------------------------------


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
        self._static = None if config.anon else _static_credentials(config)
        self._signers: dict[str, SigV4Signer] = {}
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=config.max_connections, limit_per_host=0, ttl_dns_cache=300
            ),
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

        A server that ignores the range answers 200 with the whole object: only its first
        ``end`` bytes are read (the connection is dropped, not drained), then sliced.
        """
        if end <= start:
            return b""
        status, headers, body = await self._send(
            "GET", bucket, key, {"Range": f"bytes={start}-{end - 1}"}, limit=end
        )
        return ranged_body(status, headers.get("Content-Range"), body, start, end,
                           f"s3://{bucket}/{key}")  # fmt: skip

    async def get_suffix(self, bucket: str, key: str, nbytes: int) -> bytes:
        """The last ``nbytes`` bytes (all of them if the object is shorter)."""
        if nbytes <= 0:
            return b""
        status, headers, body = await self._send("GET", bucket, key, {"Range": f"bytes=-{nbytes}"})
        if status == 416:  # an empty object has no last byte to count from
            return b""
        if status == 200:
            return body[-nbytes:]
        first, last, total = parse_content_range(
            headers.get("Content-Range"), f"s3://{bucket}/{key}"
        )
        if len(body) != last - first + 1 or (total is not None and last != total - 1):
            raise ShortReadError(
                f"s3://{bucket}/{key}: asked for the last {nbytes} bytes, got "
                f"{headers.get('Content-Range')!r} with {len(body)} bytes"
            )
        return body

    async def get(self, bucket: str, key: str) -> bytes:
        _, _, body = await self._send("GET", bucket, key, {})
        return body

    async def size(self, bucket: str, key: str) -> int:
        _, headers, _ = await self._send("HEAD", bucket, key, {})
        return int(headers["Content-Length"])

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
            chain = _chain_credentials()
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
    ) -> tuple[int, Any, bytes]:
        """(status, headers, body) of a 2xx or 416 answer; raises the s3fs-equivalent error.

        ``limit`` bounds the bytes read of a 200 answer (to a range request the server did
        not honour): the rest is never read, so a hostile object cannot exhaust memory.
        """
        aiohttp = self._aiohttp
        for redirects in range(2):
            url, region = self._url(bucket, key)
            signed = self._signed(method, url, region, headers)
            try:
                async with self._session.request(
                    method,
                    self._url_class(url, encoded=True),
                    headers=signed,
                    allow_redirects=False,
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


def parse_content_range(value: str | None, where: str) -> tuple[int, int, int | None]:
    """``(first, last, total)`` of a ``Content-Range: bytes a-b/n`` header (``n`` may be ``*``)."""
    match = _CONTENT_RANGE.fullmatch(value or "")
    if match is None:
        raise ShortReadError(f"{where}: a 206 answer without a usable Content-Range ({value!r})")
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def ranged_body(
    status: int, content_range: str | None, body: bytes, start: int, end: int, where: str
) -> bytes:
    """The bytes ``[start, end)`` of an answer to a range request, checked.

    Every S3 read path calls this: a 206 must carry the range asked for (a server that
    answers another range must never pass for the one asked); a 200 is the whole object,
    of which the caller read at most ``end`` bytes; a 416 means the range starts past the
    object's end (``b""``).
    """
    if status == 416:
        return b""
    if status == 200:  # the server ignored the range (or the object is empty)
        return body[start:end]
    first, last, total = parse_content_range(content_range, where)
    if first != start or last >= end or len(body) != last - first + 1:
        raise ShortReadError(
            f"{where}: asked for bytes {start}-{end - 1}, got {content_range!r} with "
            f"{len(body)} bytes"
        )
    if last != end - 1 and (total is None or last != total - 1):
        raise ShortReadError(
            f"{where}: asked for bytes {start}-{end - 1}, got {content_range!r}: the answer "
            "ends early although the object does not"
        )
    return body


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
