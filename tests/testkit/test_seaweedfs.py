"""SeaweedFSServer: the local S3 server every real-S3 test and benchmark relies on."""

from __future__ import annotations

import os
import socket
import stat
import uuid
from pathlib import Path

import pytest
import s3fs

from testkit import S3Endpoint, SeaweedFSError, SeaweedFSServer, validate_bucket_name

MIB = 1024 * 1024


def _fs(endpoint: S3Endpoint | SeaweedFSServer, **overrides: object) -> s3fs.S3FileSystem:
    options = {**endpoint.storage_options, **overrides}
    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def _port_accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_storage_options_have_the_s3fs_shape(seaweedfs_server: SeaweedFSServer) -> None:
    assert seaweedfs_server.storage_options == {
        "key": "rangestream",
        "secret": "rangestream-secret",
        "client_kwargs": {
            "endpoint_url": seaweedfs_server.endpoint_url,
            "region_name": "us-east-1",
        },
    }
    assert seaweedfs_server.endpoint_url.startswith("http://127.0.0.1:")


def test_object_written_with_s3fs_reads_back_and_lists(
    seaweedfs_server: SeaweedFSServer, s3_bucket: str
) -> None:
    fs = _fs(seaweedfs_server)
    prefix = f"{s3_bucket}/roundtrip-{uuid.uuid4().hex[:8]}"
    fs.pipe(f"{prefix}/a.bin", b"alpha")
    fs.pipe(f"{prefix}/b.bin", b"beta")

    assert fs.cat(f"{prefix}/a.bin") == b"alpha"
    assert fs.ls(prefix, detail=False) == [f"{prefix}/a.bin", f"{prefix}/b.bin"]


def test_range_read_across_a_4mib_chunk_boundary_returns_exact_bytes(
    seaweedfs_server: SeaweedFSServer, s3_bucket: str
) -> None:
    # SeaweedFS splits objects into 4 MiB chunks (-filer.maxMB); a range straddling two chunks
    # is assembled server-side and must still be byte-exact.
    fs = _fs(seaweedfs_server)
    path = f"{s3_bucket}/chunked-{uuid.uuid4().hex[:8]}"
    data = os.urandom(9 * MIB + 123)
    fs.pipe(path, data)

    start, end = 4 * MIB - 17, 8 * MIB + 29
    assert fs.cat_file(path, start=start, end=end) == data[start:end]
    assert fs.cat_file(path, start=len(data) - 5) == data[-5:]


def test_wrong_secret_is_rejected(seaweedfs_server: SeaweedFSServer, s3_bucket: str) -> None:
    # Credentials must be enforced, otherwise tests would not notice unsigned or mis-signed
    # requests (e.g. through the proxy).
    fs = _fs(seaweedfs_server, secret="not-the-secret")
    with pytest.raises(PermissionError):
        fs.ls(s3_bucket)


def test_create_bucket_twice_is_idempotent(seaweedfs_server: SeaweedFSServer) -> None:
    name = f"idempotent-{uuid.uuid4().hex[:8]}"
    seaweedfs_server.create_bucket(name)
    seaweedfs_server.create_bucket(name)

    fs = _fs(seaweedfs_server)
    assert name in fs.ls("", detail=False)
    assert fs.ls(name, detail=False) == []  # the writability probe leaves nothing behind


@pytest.mark.parametrize("name", ["ab", "has.dot", "Upper", "-leading", "trailing-", "a" * 64])
def test_invalid_bucket_names_are_rejected_before_reaching_the_server(name: str) -> None:
    with pytest.raises(ValueError, match="invalid bucket name"):
        validate_bucket_name(name)


def test_stop_kills_the_process_and_removes_its_files(s3_bucket: str) -> None:
    # s3_bucket is requested only to order this after the session server is up, so the two
    # servers do not start at the same time on a small CI machine.
    server = SeaweedFSServer()
    with server:
        pid = server.pid
        root = server.root
        port = int(server.endpoint_url.rsplit(":", 1)[1])
        assert pid is not None and root is not None
        assert server.running
        assert (root / "weed.log").stat().st_size > 0
        grpc_sockets = list(Path("/tmp").glob("seaweedfs-*-grpc-*.sock"))
        assert any(str(port + 10000) in p.name for p in grpc_sockets)

    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not root.exists()
    assert not _port_accepts(port)
    assert not any(
        stat.S_ISSOCK(p.lstat().st_mode) and str(port + 10000) in p.name
        for p in Path("/tmp").glob("seaweedfs-*-grpc-*.sock")
    )
    server.stop()  # idempotent
    with pytest.raises(SeaweedFSError, match="not running"):
        _ = server.endpoint_url


def test_server_that_exits_at_startup_raises_with_its_log(tmp_path: Path) -> None:
    fake_weed = tmp_path / "weed"
    fake_weed.write_text("#!/bin/sh\necho 'fatal: simulated startup failure' >&2\nexit 3\n")
    fake_weed.chmod(0o755)
    server = SeaweedFSServer(weed_binary=fake_weed, startup_timeout=10.0)

    with pytest.raises(SeaweedFSError, match="status 3") as excinfo:
        server.start()

    assert "simulated startup failure" in str(excinfo.value)
    assert server.root is None and not server.running


def test_server_that_never_becomes_ready_times_out_and_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fake_weed = tmp_path / "weed"
    fake_weed.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    fake_weed.chmod(0o755)
    server = SeaweedFSServer(weed_binary=fake_weed, startup_timeout=1.0, stop_timeout=0.5)

    with pytest.raises(SeaweedFSError, match="timed out"):
        server.start()

    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
