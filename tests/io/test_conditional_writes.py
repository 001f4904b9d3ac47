"""Conditional writes are proved, not assumed: a server that accepts ``If-Match`` /
``If-None-Match`` and ignores them (rclone serve s3) gets its commits refused with an error
naming what it did, unless one writer at a time is declared. Never a reported success that a
concurrent commit later replaces.

A loopback server (``support.fake_s3``) ignores the conditions, as rclone does, or honours
them; the suite's real servers run the commit races (tests/storage, tests/reliability).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_s3 import FakeS3, fake_s3

from rangestream.errors import ConcurrentWriteError
from rangestream.io import S3Store
from rangestream.io.conditional_writes import (
    PROBE_PREFIX,
    SINGLE_WRITER_ENV,
    ConditionalWritesUnsupportedError,
)
from rangestream.io.process import run_blocking


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeS3]:
    monkeypatch.delenv(SINGLE_WRITER_ENV, raising=False)
    with fake_s3(tmp_path) as served:
        yield served


def put_if_version(server: FakeS3, data: bytes, version: str | None) -> Any:
    store = S3Store(server.url("ds"), server.storage_options())

    async def run() -> Any:
        try:
            await store.put_if_version("zarr.json", data, version, 1 << 20)
            return (await store.get_versioned("zarr.json", 1 << 20))[1]
        finally:
            await store.aclose()

    return run_blocking(run())


def test_a_server_that_ignores_the_conditions_gets_its_commits_refused(server: FakeS3) -> None:
    with pytest.raises(ConditionalWritesUnsupportedError) as caught:
        put_if_version(server, b"root", None)
    message = str(caught.value)
    assert f"at {server.endpoint_url} (bucket 'fake-bucket')" in message
    assert "accepted a PUT with If-None-Match: * over an existing object" in message
    assert SINGLE_WRITER_ENV in message
    assert not (server.root / "ds" / "zarr.json").exists()  # nothing was published
    # the probe went under the dataset's prefix, and is gone
    assert {key.rsplit("/", 1)[0] for key in server.put_keys} == {f"ds/{PROBE_PREFIX}"}
    assert not list((server.root / "ds" / PROBE_PREFIX).iterdir())
    probes = len(server.put_keys)
    with pytest.raises(ConditionalWritesUnsupportedError):  # the verdict is remembered
        put_if_version(server, b"root", None)
    assert len(server.put_keys) == probes


def test_declaring_one_writer_lets_commits_check_then_write(
    server: FakeS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINGLE_WRITER_ENV, "1")
    first = put_if_version(server, b"root 1", None)
    assert (server.root / "ds" / "zarr.json").read_bytes() == b"root 1"
    with pytest.raises(ConcurrentWriteError):  # a stale version is still refused
        put_if_version(server, b"root 2", None)
    put_if_version(server, b"root 2", first)
    assert (server.root / "ds" / "zarr.json").read_bytes() == b"root 2"


def test_a_server_that_honours_them_is_probed_once_then_trusted(server: FakeS3) -> None:
    server.honour_conditions = True
    first = put_if_version(server, b"root 1", None)
    # the probe: created, two writes that must fail, one that must succeed; then the root
    assert len(server.put_keys) == 4 + 1
    assert server.put_headers[-1].get("If-None-Match") == "*"
    with pytest.raises(ConcurrentWriteError):
        put_if_version(server, b"root 2", None)
    put_if_version(server, b"root 2", first)
    assert server.put_headers[-1].get("If-Match") == first
    assert len(server.put_keys) == 4 + 3  # no second probe in this process
    assert (server.root / "ds" / "zarr.json").read_bytes() == b"root 2"
