"""botocore's transport checksums are "when_required" on the s3fs path, for compatibility:
servers that implement them differently (rclone serve s3) made every s3fs read fail with
``FlexibleChecksumError``. The dataset's own crc32c still checks every chunk read.

The loopback server (``support.fake_s3``) sends a wrong ``x-amz-checksum-crc32`` with every
GET answer and keeps the headers of every PUT.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fake_s3 import FakeS3, fake_s3

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import CorruptDataError
from rangestream.io import S3Store
from rangestream.io.process import run_blocking
from rangestream.io.s3_options import READS_ENV

WRONG_CRC32 = "AAAAAA=="
TOKENS = np.dtype([("tokens", "<i4")])


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeS3]:
    monkeypatch.setenv(READS_ENV, "s3fs")  # the path botocore's checksums apply to
    for name in ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "obj").write_bytes(bytes(range(256)) * 40)
    with fake_s3(tmp_path) as served:
        served.checksum_header = WRONG_CRC32
        yield served


def call(server: FakeS3, method: str, *args: Any, **options: Any) -> Any:
    store = S3Store(server.url(""), server.storage_options(**options))

    async def run() -> Any:
        try:
            return await getattr(store, method)(*args)
        finally:
            await store.aclose()

    return run_blocking(run())


def test_reads_do_not_validate_the_transports_checksum(server: FakeS3) -> None:
    assert call(server, "get_range", "obj", 10, 500) == (bytes(range(256)) * 40)[10:500]
    assert call(server, "get", "obj") == bytes(range(256)) * 40


def test_a_users_own_checksum_setting_is_kept(server: FakeS3) -> None:
    from botocore.exceptions import FlexibleChecksumError

    strict = {"config_kwargs": {"response_checksum_validation": "when_supported"}}
    with pytest.raises(FlexibleChecksumError):
        call(server, "get", "obj", **strict)


def test_uploads_carry_no_checksum_the_server_did_not_ask_for(server: FakeS3) -> None:
    call(server, "put", "new", b"payload" * 100)
    (headers,) = server.put_headers
    names = {name.lower() for name in headers}
    assert not {name for name in names if name.startswith("x-amz-checksum")}, headers
    assert "x-amz-sdk-checksum-algorithm" not in names
    assert "aws-chunked" not in headers.get("Content-Encoding", "")
    assert (server.root / "new").read_bytes() == b"payload" * 100


def test_the_datasets_crc32c_still_checks_every_chunk(server: FakeS3) -> None:
    root = server.root
    tokens = np.arange(20_000, dtype="<i4")
    local = StreamStorage(root / "ds", StreamNumpyFormat(TOKENS), chunk_bytes=256)
    with local.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    remote = StreamStorage(server.url("ds"), StreamNumpyFormat(TOKENS),
                           storage_options=server.storage_options())  # fmt: skip
    with remote.sync_reader() as reader:  # chunks other than the damaged one read fine
        assert reader.read(3000, 1000)["tokens"].tolist() == tokens[3000:4000].tolist()
    blocks = [path for path in (root / "ds").rglob("c/0/0") if path.parent.parent.parent.name
              == "stream"]  # fmt: skip
    assert len(blocks) == 1, "the block holding the tokens"
    data = bytearray(blocks[0].read_bytes())
    data[5000] ^= 0x01  # one bit of a token, inside a chunk whose crc32c was kept
    blocks[0].write_bytes(bytes(data))
    with remote.sync_reader() as reader, pytest.raises(CorruptDataError):
        reader.read(0, 20_000)
