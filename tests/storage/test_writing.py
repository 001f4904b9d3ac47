"""Writes and commits: hostile inputs end in library errors with bounded memory."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.s3 import Location

from rangestream import RetryPolicy, StreamNumpyFormat, StreamStorage
from rangestream.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    StorageError,
)
from rangestream.storage.maintenance.gc import collect_garbage
from testkit import FaultConfig, FaultKind, LatencyProxy, S3Endpoint

TOKENS = np.dtype([("t", "<i4")])


def tokens_storage(url: str) -> StreamStorage:
    return StreamStorage(url, StreamNumpyFormat(TOKENS))


def write(storage: StreamStorage, values: np.ndarray, *, overwrite: bool = False) -> None:
    with storage.sync_writer(overwrite=overwrite) as writer:
        writer.append(0, {"t": values})


# -- every error a user can cause on the write path is a library error ------------------------

FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02, request_timeout=5)


def test_writing_with_a_wrong_secret_is_an_access_denied_library_error(s3_url: Location) -> None:
    options = {**s3_url.storage_options, "secret": "not-the-secret"}
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS), storage_options=options)
    with pytest.raises(AccessDeniedError) as caught:
        write(storage, np.arange(4, dtype="<i4"))
    assert isinstance(caught.value, PermissionError)  # code written for builtins still works
    assert s3_url.url in str(caught.value)


def test_writing_to_a_missing_bucket_names_the_bucket_and_the_url(s3_url: Location) -> None:
    bucket = f"rangestream-missing-{uuid.uuid4().hex[:8]}"
    url = f"s3://{bucket}/ds"
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=s3_url.storage_options)
    with pytest.raises(BucketNotFoundError) as caught:
        write(storage, np.arange(4, dtype="<i4"))
    assert isinstance(caught.value, FileNotFoundError)  # code written for builtins still works
    assert f"bucket {bucket!r} of {url} does not exist" in str(caught.value)


def test_a_dataset_path_under_a_regular_file_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    storage = tokens_storage(str(tmp_path / "file" / "ds"))
    with pytest.raises(StorageError, match="file/ds"):
        write(storage, np.arange(4, dtype="<i4"))


@pytest.fixture
def denying_proxy(s3_server: S3Endpoint) -> Iterator[LatencyProxy]:
    with LatencyProxy(s3_server, delay=0.0) as proxy:
        yield proxy


def proxied(url: str, proxy: LatencyProxy) -> StreamStorage:
    # small blocks: a few appended KiB are uploaded before the with block ends
    return StreamStorage(
        url,
        StreamNumpyFormat(TOKENS),
        storage_options=proxy.storage_options,
        retry=FAST,
        chunk_bytes=256,
        block_bytes=4096,
    )


def test_a_refused_commit_is_an_access_denied_library_error(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    # only the root document's PUT is refused: blocks and parts go through
    denying_proxy.set_faults(
        FaultConfig(
            access_denied=1.0, methods={"PUT"}, path_regex=r"/[^/]+-[0-9a-f]{8}/zarr\.json$"
        )
    )
    with pytest.raises(AccessDeniedError, match=r"zarr\.json"):
        write(proxied(s3_url.url, denying_proxy), np.arange(4, dtype="<i4"))
    assert denying_proxy.stats().fault(FaultKind.ACCESS_DENIED) >= 1


def test_a_refused_abort_is_an_access_denied_library_error(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    session = proxied(s3_url.url, denying_proxy).parallel_write()
    with session.sync_writer() as writer:
        writer.append(0, {"t": np.arange(4, dtype="<i4")})
    denying_proxy.set_faults(FaultConfig(access_denied=1.0, methods={"POST", "DELETE"}))
    with pytest.raises(AccessDeniedError):
        session.abort()


# -- a failed write whose clean-up fails too raises its own failure ---------------------------


class WriteFailed(Exception):
    """The failure of the user's code inside a writer's ``with`` block."""


def test_a_write_whose_clean_up_fails_raises_its_own_failure_with_the_clean_up_as_context(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    storage = proxied(s3_url.url, denying_proxy)
    with pytest.raises(WriteFailed) as caught, storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(16384, dtype="<i4")})  # 16 blocks, 8 at most pending
        denying_proxy.set_faults(FaultConfig(access_denied=1.0, methods={"POST", "DELETE"}))
        raise WriteFailed("the data source broke")
    failure = caught.value
    assert isinstance(failure.__context__, AccessDeniedError)
    assert any("rangestream gc" in note for note in getattr(failure, "__notes__", []))
    denying_proxy.clear_faults()
    (leftover,) = collect_garbage(s3_url.url, s3_url.storage_options, grace=0).orphans
    assert leftover.objects >= 8 and leftover.prefix in failure.__notes__[-1]


def test_a_commit_whose_clean_up_fails_raises_the_commit_failure(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    denying_proxy.set_faults(
        FaultConfig(
            access_denied=1.0,
            methods={"PUT", "POST", "DELETE"},
            # the root's PUT and the bulk delete (a POST to the bucket) are refused
            path_regex=r"(/[^/]+-[0-9a-f]{8}/zarr\.json$)|(^/[^/]+/?$)",
        )
    )
    storage = proxied(s3_url.url, denying_proxy)
    with pytest.raises(AccessDeniedError, match=r"zarr\.json") as caught:
        write(storage, np.arange(4, dtype="<i4"))
    assert isinstance(caught.value.__context__, AccessDeniedError)
    assert "zarr.json" not in str(caught.value.__context__)


# -- writers keep a budget; short shards stay small -------------------------------------------


_PEAK_WRITING = """
import sys, tracemalloc
import numpy as np
from rangestream import StreamNumpyFormat, StreamStorage
path, shards, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) or None
storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("b", "u1")])), block_bytes=1 << 16)
session = storage.parallel_write()
record = {"b": np.zeros(16 * 1024, dtype="u1")}
tracemalloc.start()
with session.sync_writer(max_buffered_bytes=budget) as writer:
    for _ in range(3):  # 48 KiB per shard: no 64 KiB block ever fills
        for shard in range(shards):
            writer.append(shard, record)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
session.commit()
with storage.sync_reader() as reader:
    assert reader.total_length == shards * 3 * 16 * 1024
print(peak)
"""


def _peak_writing(path: Path, shards: int, budget: int | None) -> int:
    """The traced peak of a writer's appends and close, in a process of its own."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _PEAK_WRITING, str(path), str(shards), str(budget or 0)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def test_a_writers_memory_is_bounded_by_its_budget_not_by_its_shards(tmp_path: Path) -> None:
    budget = 256 * 1024
    bounded = [_peak_writing(tmp_path / f"b{n}", n, budget) for n in (150, 300)]
    unbounded = _peak_writing(tmp_path / "u", 150, None)  # the default budget is not reached
    assert unbounded > 150 * 48 * 1024  # every shard's partial block in memory
    # the budget, each shard's bookkeeping, and the interpreter's own (a resize of its
    # table of interned strings, which local paths go through, showed up as 0.9 MiB)
    assert bounded[0] < budget + 3 * 1024 * 1024
    # 150 more shards add their bookkeeping, not their 7 MiB of rows
    assert bounded[1] - bounded[0] < 150 * 12 * 1024


def test_a_short_shard_is_stored_in_kilobytes_with_one_block_per_array(tmp_path: Path) -> None:
    storage = tokens_storage(str(tmp_path / "ds"))
    write(storage, np.arange(3, dtype="<i4"))
    with storage.sync_reader() as reader:
        stream = reader.opened.manifest.arrays["stream"]
        ends = reader.opened.manifest.arrays["record_ends"]
        prefix = tmp_path / "ds" / "data" / reader.opened.manifest.commit_id / "shards" / "0"
    # one inner chunk and a chunk index of one entry (16 bytes and its 4-byte crc32c)
    assert (prefix / "stream" / "c" / "0" / "0").stat().st_size == stream.chunk_nbytes + 4 + 20
    assert (prefix / "record_ends" / "c" / "0").stat().st_size == ends.chunk_nbytes + 4 + 20
    document = json.loads((prefix / "stream" / "zarr.json").read_bytes())
    assert document["chunk_grid"]["configuration"]["chunk_shape"][0] == stream.chunk_rows
    total = sum(p.stat().st_size for p in prefix.rglob("*") if p.is_file())
    assert total < 12 * 1024  # 86 KB when every block carried a 4 MiB block's chunk index
