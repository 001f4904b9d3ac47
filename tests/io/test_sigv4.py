"""The lean SigV4 signer: header for header what botocore's ``S3SigV4Auth`` produces."""

from __future__ import annotations

import datetime
import time

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from rangestream.io.sigv4 import SigV4Signer

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

URLS = [
    "http://127.0.0.1:9000/bucket/data/0/features/c/3/0",  # path style, custom port
    "http://localhost:80/bucket/key",  # the scheme's default port is not signed
    "https://bucket.s3.eu-west-1.amazonaws.com/a%20b/%C3%A9t%C3%A9~x",  # virtual host
    "https://s3.us-east-1.amazonaws.com:443/bucket/k",
    "https://S3.Example.COM/bucket/K",  # the host is signed lowercase, the path as given
    "http://[::1]:9000/bucket/key",  # IPv6 literal
    "https://minio.internal/prefix/bucket/a/b%2Bc",  # endpoint with a path
]


def botocore_headers(
    monkeypatch: pytest.MonkeyPatch,
    when: datetime.datetime,
    credentials: Credentials,
    region: str,
    method: str,
    url: str,
    headers: dict[str, str],
) -> list[tuple[str, str]]:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: when)
    request = AWSRequest(method=method, url=url, headers=dict(headers))
    botocore.auth.S3SigV4Auth(credentials, "s3", region).add_auth(request)
    return list(request.headers.items())


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("token", [None, "session/token+=="])
@pytest.mark.parametrize(
    "headers", [{}, {"Range": "bytes=100-65635"}, {"Range": "bytes=-4096", "User-Agent": "x  y"}]
)
def test_signed_headers_equal_botocores(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    method: str,
    token: str | None,
    headers: dict[str, str],
) -> None:
    when = datetime.datetime(2026, 11, 29, 23, 59, 59)
    credentials = Credentials("AKIDEXAMPLE", SECRET, token)
    want = botocore_headers(monkeypatch, when, credentials, "eu-west-1", method, url, headers)
    signer = SigV4Signer("AKIDEXAMPLE", SECRET, token, "eu-west-1")
    assert signer.sign(method, url, headers, "20261129T235959Z") == want


def test_the_signing_key_follows_the_day(monkeypatch: pytest.MonkeyPatch) -> None:
    """One signer over midnight: each day's requests carry that day's scope and key."""
    credentials = Credentials("AKIDEXAMPLE", SECRET)
    signer = SigV4Signer("AKIDEXAMPLE", SECRET, None, "us-east-1")
    url = URLS[0]
    for when in (
        datetime.datetime(2026, 11, 29, 23, 59, 59),
        datetime.datetime(2026, 11, 30, 0, 0, 1),
        datetime.datetime(2026, 11, 29, 12, 0, 0),  # a clock set back is signed right too
    ):
        want = botocore_headers(monkeypatch, when, credentials, "us-east-1", "GET", url, {})
        got = signer.sign("GET", url, {}, when.strftime("%Y%m%dT%H%M%SZ"))
        assert got == want


def test_without_a_timestamp_it_signs_for_now() -> None:
    signer = SigV4Signer("AKIDEXAMPLE", SECRET, None, "us-east-1")
    before = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    stamp = dict(signer.sign("GET", URLS[0], {}))["X-Amz-Date"]
    after = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    assert before <= stamp[:-1] <= after and stamp.endswith("Z")


def test_now_is_read_from_the_clock_botocore_reads_not_the_coarse_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second just begun, as ``time.time()`` and ``datetime.now()`` show it.

    ``time.gmtime()`` without an argument reads C's ``time()``, served by glibc from the
    coarse clock: for a few milliseconds after each second begins it still names the second
    before, which made the test above fail now and then. The instant is pinned here, so a
    signer reading any other clock fails every time.
    """
    instant = datetime.datetime(2026, 11, 29, 23, 59, 59, 1000, tzinfo=datetime.UTC)
    monkeypatch.setattr(time, "time", lambda: instant.timestamp())
    stamp = dict(SigV4Signer("AKIDEXAMPLE", SECRET, None, "us-east-1").sign("GET", URLS[0], {}))
    assert stamp["X-Amz-Date"] == "20261129T235959Z"
    assert "/20261129/us-east-1/s3/aws4_request" in stamp["Authorization"]


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        ("http://127.0.0.1:9000/bucket/key?versionId=3", {}),
        (URLS[0], {"Authorization": "x"}),
        (URLS[0], {"x-amz-date": "20260101T000000Z"}),
        (URLS[0], {"Date": "Sun, 29 Nov 2026 23:59:59 GMT"}),
    ],
)
def test_requests_outside_its_scope_are_refused_for_botocore_to_sign(
    url: str, headers: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="SigV4Signer"):
        SigV4Signer("AKIDEXAMPLE", SECRET, None, "us-east-1").sign("GET", url, headers)
