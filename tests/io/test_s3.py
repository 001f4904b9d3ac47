"""S3Store against a server that misbehaves: both read paths (the lean client and s3fs)
slice a 200 with the whole object correctly, refuse a 206 for another range, and read at
most the bytes asked for of a whole object, whatever its size."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from support.fake_s3 import FakeS3, fake_s3

from rangestream import StreamDataset, StreamNumpyFormat, StreamStorage
from rangestream.errors import RangestreamError
from rangestream.io import RetryPolicy, S3Store
from rangestream.io.process import run_blocking
from rangestream.io.s3 import _LeanReads
from rangestream.io.s3_options import READS_ENV

TOKENS = np.dtype([("tokens", "<i4")])
FAST = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.002, total_timeout=10)


@pytest.fixture(params=["lean", "s3fs"])
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each S3 read path: the lean client, and s3fs (``RANGESTREAM_S3_READS=s3fs``)."""
    if request.param == "s3fs":
        monkeypatch.setenv(READS_ENV, "s3fs")
    return str(request.param)


def written(root: Path) -> np.ndarray:
    """A local dataset under ``root/ds`` (served as ``s3://fake-bucket/ds``): its tokens."""
    tokens = np.random.default_rng(5).integers(0, 1 << 30, 20_000, dtype="<i4")
    storage = StreamStorage(root / "ds", StreamNumpyFormat(TOKENS), chunk_bytes=256,
                            block_bytes=16_384)  # fmt: skip
    with storage.sync_writer() as writer:
        for record, at in enumerate(range(0, len(tokens), 900)):
            writer.append(record % 2, {"tokens": tokens[at : at + 900]})
    shard = [tokens[at : at + 900] for at in range(0, len(tokens), 900)]
    return np.concatenate(shard[0::2] + shard[1::2])  # global order: shard 0, then shard 1


def storage_on(server: FakeS3, reads: str) -> StreamStorage:
    storage = StreamStorage(server.url("ds"), StreamNumpyFormat(TOKENS), retry=FAST,
                            storage_options=server.storage_options())  # fmt: skip
    store = storage.new_store()
    assert isinstance(store, S3Store) and isinstance(store._reads, _LeanReads) == (reads == "lean")
    return storage


def test_a_server_that_ignores_ranges_still_gives_the_exact_windows(
    tmp_path: Path, reads: str
) -> None:
    truth = written(tmp_path)
    with fake_s3(tmp_path) as server:
        server.mode = "ignore_range"
        storage = storage_on(server, reads)
        with StreamDataset(storage, 513, stride=301).sync_reader() as windows:
            for i in range(0, len(windows), 7):
                np.testing.assert_array_equal(windows[i]["tokens"], truth[i * 301 : i * 301 + 513])
        assert server.gets > 10  # every window was a GET the server answered whole


def test_a_server_that_answers_another_range_is_refused_never_believed(
    tmp_path: Path, reads: str
) -> None:
    written(tmp_path)
    with fake_s3(tmp_path) as server:
        storage = storage_on(server, reads)
        with storage.sync_reader() as reader:  # opened honestly
            server.mode = "shift"  # then answers 64 bytes further on, with valid chunks
            with pytest.raises(RangestreamError, match=r"another range|ignored the range"):
                reader.read(1000, 200)


def test_a_whole_object_answer_is_read_only_up_to_the_range_asked_for(
    tmp_path: Path, reads: str
) -> None:
    (tmp_path / "big").write_bytes(np.random.default_rng(1).bytes(48 << 20))
    with fake_s3(tmp_path) as server:
        server.mode = "ignore_range"
        store = S3Store(server.url(""), server.storage_options())

        async def read() -> bytes:
            try:
                return await store.get_range("big", 1000, 5000)
            finally:
                await store.aclose()

        run_blocking(read())  # clients made, imports done: not measured below
        tracemalloc.start()
        try:
            data = run_blocking(read())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert data == (tmp_path / "big").read_bytes()[1000:5000]
    assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB held to read 4 KB of a 48 MiB answer"
