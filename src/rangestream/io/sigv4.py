"""AWS Signature Version 4 for the lean S3 reads: botocore's headers at a fraction of its cost.

Why this exists: the reads of ``rangestream.io.s3_client`` signed every range GET with
botocore's ``S3SigV4Auth``, whose generic pipeline (an ``AWSRequest``, header maps, URL
parsing three times, the signing key derived anew with four HMACs) was a large share of the
client's CPU per request, several times this module's (figures in docs/design.md). On the
small machines this library targets, the client shares the CPU with the data loader, so
that time is read throughput.

Scope, deliberately narrow: requests without a body and without a query string (the range
GETs, suffix GETs, whole GETs and HEADs that ``s3_client`` sends), signed exactly as
botocore signs them (``x-amz-content-sha256`` is the empty body's SHA-256, as botocore sets
it for every request that carries no checksum header; the security token is signed when
there is one). ``S3ReadClient`` uses botocore's signer for anything else, and the tests
compare the two signers header for header. The signing key depends only on the secret, the
day, the region and the service, so it is derived once per day.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from hashlib import sha256
from typing import Any
from urllib.parse import urlsplit

__all__ = ["EMPTY_SHA256", "SigV4Signer"]

#: SHA-256 of an empty body: the payload hash of every request this module signs.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_ALGORITHM = "AWS4-HMAC-SHA256"
#: Headers botocore never signs (``botocore.auth.SIGNED_HEADERS_BLACKLIST``).
_NOT_SIGNED = frozenset(
    {
        "baggage",
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "traceparent",
        "tracestate",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
    }
)
#: Headers the signer sets (or, for ``date``, botocore would treat specially): a caller
#: passing one gets a ``ValueError`` and is signed by botocore instead.
_RESERVED = frozenset(
    {"authorization", "date", "x-amz-content-sha256", "x-amz-date", "x-amz-security-token"}
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


class SigV4Signer:
    """Signs bodyless, query-less requests for one set of credentials, region and service.

    Immutable credentials only: a caller with refreshable credentials makes a signer from
    each frozen copy (cheap: nothing is derived until the first ``sign``).
    """

    __slots__ = (
        "_access_key",
        "_clock",
        "_host_of",
        "_key",
        "_region",
        "_secret",
        "_service",
        "_token",
    )

    def __init__(
        self,
        access_key: str,
        secret_key: str,
        token: str | None,
        region: str,
        service: str = "s3",
    ) -> None:
        self._access_key = access_key
        self._secret = secret_key
        self._token = token or None
        self._region = region
        self._service = service
        self._key: tuple[str, Any] = ("", None)  # (day, HMAC keyed for it)
        self._host_of: dict[str, tuple[str, str]] = {}  # netloc -> (host header, scheme)
        self._clock = (-1, "")  # (second, its X-Amz-Date)

    def _keyed(self, day: str) -> Any:
        """An HMAC keyed with ``day``'s signing key, copied for each signature: the key is
        derived, and its padded blocks hashed, once a day instead of on every request."""
        keyed = self._key
        if keyed[0] != day:  # one tuple: a racing thread sees one day's pair or the other's
            key = _hmac(f"AWS4{self._secret}".encode(), day)
            for part in (self._region, self._service, "aws4_request"):
                key = _hmac(key, part)
            keyed = self._key = (day, hmac.new(key, digestmod=hashlib.sha256))
        return keyed[1]

    def sign(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        timestamp: str | None = None,
    ) -> list[tuple[str, str]]:
        """The request's headers with the signature headers added, in botocore's order.

        ``url`` must be already percent-encoded, without a query string, and ``headers``
        must not hold the headers signing sets (``ValueError`` otherwise: the caller signs
        such requests with botocore). ``timestamp`` (``YYYYMMDDTHHMMSSZ``, UTC) is for tests;
        by default it is now.
        """
        scheme, netloc, path, query, _ = urlsplit(url)
        if query:
            raise ValueError("SigV4Signer signs requests without a query string only")
        out = list(headers.items())
        for name, _ in out:
            if name.lower() in _RESERVED:
                raise ValueError(f"SigV4Signer sets the {name} header itself")
        if timestamp is None:
            timestamp = self._now()
        out.append(("X-Amz-Date", timestamp))
        if self._token is not None:
            out.append(("X-Amz-Security-Token", self._token))
        out.append(("X-Amz-Content-SHA256", EMPTY_SHA256))
        signed = {}
        for name, value in out:
            lower = name.lower()
            if lower not in _NOT_SIGNED:
                value = " ".join(value.split())
                signed[lower] = f"{signed[lower]},{value}" if lower in signed else value
        if "host" not in signed:
            signed["host"] = self._host(scheme, netloc, url)
        names = sorted(signed)
        signed_headers = ";".join(names)
        canonical = "".join(
            (
                method.upper(),
                "\n",
                path,
                "\n\n",  # no query string
                "".join([f"{name}:{signed[name]}\n" for name in names]),
                "\n",
                signed_headers,
                "\n",
                EMPTY_SHA256,
            )
        )
        day = timestamp[:8]
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        string_to_sign = (
            f"{_ALGORITHM}\n{timestamp}\n{scope}\n{sha256(canonical.encode()).hexdigest()}"
        )
        mac = self._keyed(day).copy()
        mac.update(string_to_sign.encode())
        signature = mac.hexdigest()
        out.append(
            (
                "Authorization",
                f"{_ALGORITHM} Credential={self._access_key}/{scope}, "
                f"SignedHeaders={signed_headers}, Signature={signature}",
            )
        )
        return out

    def _now(self) -> str:
        """This second's ``X-Amz-Date``, formatted once per second.

        ``time.time()``, as botocore's ``datetime.now()``: ``gmtime()`` without an argument
        reads C's time(), which glibc serves from the coarse clock (up to a tick behind), so
        near a second's start it named the second before the one botocore already shows.
        """
        second = int(time.time())
        clock = self._clock
        if clock[0] != second:  # one tuple: a racing thread sees one second or the next
            clock = self._clock = (second, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second)))
        return clock[1]

    def _host(self, scheme: str, netloc: str, url: str) -> str:
        """The ``host`` header value botocore signs: lowercase, no default port, no userinfo."""
        found = self._host_of.get(netloc)
        if found is None or found[1] != scheme:
            parts = urlsplit(url)
            host = parts.hostname or ""
            if ":" in host:  # an IPv6 literal keeps its brackets
                host = f"[{host}]"
            if parts.port is not None and parts.port != _DEFAULT_PORTS.get(scheme):
                host = f"{host}:{parts.port}"
            found = self._host_of[netloc] = (host, scheme)
        return found[0]
