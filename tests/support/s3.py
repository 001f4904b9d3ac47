"""Real-S3 pytest fixtures: one S3 endpoint per session, a fresh prefix per test.

By default a local SeaweedFS is started once per session (about 4-8 s). Setting
``RANGESTREAM_TEST_S3_ENDPOINT`` points every S3 test at an external S3-compatible endpoint
instead, with credentials from ``RANGESTREAM_TEST_S3_KEY`` / ``RANGESTREAM_TEST_S3_SECRET``
(falling back to ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``), region from
``AWS_DEFAULT_REGION`` (default us-east-1) and bucket from ``RANGESTREAM_TEST_S3_BUCKET``
(default ``rangestream-tests``).

The ``s3_core`` tests also run against moto server and rclone ``serve s3``, one process
each per session, started only when such a case runs (``support.s3_matrix``).

Nothing here ever skips: if no S3 endpoint can be had, the tests that need one error out, so a
CI run cannot pass green with its S3 coverage silently missing.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import s3fs

from support.s3_matrix import NO_SERVER, SEAWEEDFS
from testkit import DEFAULT_REGION, LatencyProxy, S3Endpoint, SeaweedFSServer
from testkit.s3_servers import LocalS3Server, server_of_kind

__all__ = [
    "DEFAULT_TEST_BUCKET",
    "ENV_BUCKET",
    "ENV_ENDPOINT",
    "Location",
    "S3Location",
    "bucket_name_from_env",
    "external_endpoint_from_env",
    "location",
    "moto_s3_server",
    "rclone_s3_server",
    "s3_bucket",
    "s3_proxy",
    "s3_server",
    "s3_url",
    "seaweedfs_server",
]

ENV_ENDPOINT = "RANGESTREAM_TEST_S3_ENDPOINT"
ENV_KEY = "RANGESTREAM_TEST_S3_KEY"
ENV_SECRET = "RANGESTREAM_TEST_S3_SECRET"
ENV_BUCKET = "RANGESTREAM_TEST_S3_BUCKET"
DEFAULT_TEST_BUCKET = "rangestream-tests"


@dataclass(frozen=True)
class Location:
    """Where a test may write a dataset: a URL plus the fsspec options needed to open it.

    Local locations are plain filesystem paths with empty options, so code under test goes
    through exactly the argument shapes a user would pass.
    """

    url: str
    storage_options: dict[str, Any]

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    def child(self, name: str) -> str:
        """URL of ``name`` under this location, for tests that need several datasets."""
        return f"{self.url.rstrip('/')}/{name}"


@dataclass(frozen=True)
class S3Location(Location):
    """A ``Location`` under ``s3://<bucket>/<unique prefix>`` (nothing exists there yet)."""


def external_endpoint_from_env() -> S3Endpoint | None:
    """The endpoint named by the environment, or None to use a local SeaweedFS."""
    endpoint_url = os.environ.get(ENV_ENDPOINT)
    if not endpoint_url:
        return None
    key = os.environ.get(ENV_KEY) or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = os.environ.get(ENV_SECRET) or os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise RuntimeError(
            f"{ENV_ENDPOINT} is set but no credentials were found: set {ENV_KEY} and "
            f"{ENV_SECRET} (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    region = os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    return S3Endpoint(endpoint_url=endpoint_url, access_key=key, secret_key=secret, region=region)


def bucket_name_from_env() -> str:
    return os.environ.get(ENV_BUCKET) or DEFAULT_TEST_BUCKET


def _sanitise(name: str) -> str:
    """Turn a pytest node name into a readable S3 key segment."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return cleaned[:80] or "test"


@pytest.fixture(scope="session")
def seaweedfs_server() -> Iterator[SeaweedFSServer]:
    """A local SeaweedFS for the whole session, even when an external endpoint is configured.

    Tests of SeaweedFSServer itself use this directly; everything else should use
    ``s3_server`` so it also runs against external endpoints. Like S3 and MinIO, it creates
    no bucket on upload (SeaweedFS does by default), so a write to a missing bucket fails
    here as it does there.
    """
    with SeaweedFSServer(extra_args=["-s3.autoCreateBucket=false"]) as server:
        yield server


@pytest.fixture(scope="session")
def moto_s3_server() -> Iterator[LocalS3Server]:
    """moto's server for the session (the ``s3_core`` tests' "moto" case)."""
    with server_of_kind("moto") as server:
        yield server


@pytest.fixture(scope="session")
def rclone_s3_server() -> Iterator[LocalS3Server]:
    """rclone ``serve s3`` for the session (the ``s3_core`` tests' "rclone" case)."""
    with server_of_kind("rclone") as server:
        yield server


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> S3Endpoint:
    """The session's S3 endpoint: external if configured, else the local SeaweedFS; for
    ``s3_core`` tests also moto's and rclone's (``support.s3_matrix`` parametrises them)."""
    kind = getattr(request, "param", SEAWEEDFS)
    if kind == NO_SERVER:  # the "local" case of a matrix test: nothing is started
        return None  # type: ignore[return-value]
    if kind != SEAWEEDFS:
        server: LocalS3Server = request.getfixturevalue(f"{kind}_s3_server")
        return server.endpoint
    external = external_endpoint_from_env()
    if external is not None:
        return external
    seaweedfs: SeaweedFSServer = request.getfixturevalue("seaweedfs_server")
    return seaweedfs.endpoint


_created_buckets: set[tuple[str, str]] = set()


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Endpoint) -> str:
    """Name of the session's test bucket, created once per endpoint and ready for writes."""
    name = bucket_name_from_env()
    if s3_server is not None and (s3_server.endpoint_url, name) not in _created_buckets:
        s3_server.create_bucket(name)
        _created_buckets.add((s3_server.endpoint_url, name))
    return name


@pytest.fixture
def s3_url(
    request: pytest.FixtureRequest, s3_server: S3Endpoint, s3_bucket: str
) -> Iterator[S3Location]:
    """A fresh, empty prefix for this test; it is not created (S3 has no directories).

    The prefix is deleted afterwards only on external endpoints, where leftovers would
    accumulate; the local server's data disappears with the session anyway.
    """
    url = f"s3://{s3_bucket}/{_sanitise(request.node.name)}-{uuid.uuid4().hex[:8]}"
    location = S3Location(url=url, storage_options=s3_server.storage_options)
    yield location
    if external_endpoint_from_env() is not None:
        fs = s3fs.S3FileSystem(**location.storage_options, skip_instance_cache=True)
        if fs.exists(url):
            fs.rm(url, recursive=True)


@pytest.fixture(params=["local", "s3"], ids=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """The same test on both backends: a local directory, then a fresh S3 prefix.

    The S3 server is only started when an "s3" case runs, so ``-k local`` stays fast. The
    local directory exists (fsspec's local filesystem does not create parent directories on
    write), while the S3 prefix does not: S3 has no empty directories.
    """
    if request.param == "local":
        path = tmp_path / "dataset"
        path.mkdir()
        return Location(url=str(path), storage_options={})
    s3_location: S3Location = request.getfixturevalue("s3_url")
    return s3_location


@pytest.fixture
def s3_proxy(s3_server: S3Endpoint) -> Iterator[LatencyProxy]:
    """A LatencyProxy in front of the session's S3 endpoint, with no delay and no faults.

    Point code under test at ``s3_proxy.storage_options`` to count its requests; set
    ``s3_proxy.delay`` or faults as the test needs. A new proxy per test keeps counts clean.
    """
    with LatencyProxy(s3_server, delay=0.0) as proxy:
        yield proxy
