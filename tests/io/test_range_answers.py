"""Every shape of answer to a range GET, on both S3 read paths (the lean client and s3fs):
the exact bytes asked for, or an error that names what the server answered. No shifted
bytes, ever: rclone's 200 with a ``Content-Range`` and only the range once came back shifted
by the range's start.

A loopback server (``support.fake_s3``) answers each way on purpose; the object is random
bytes, so any offset error changes the bytes compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.fake_s3 import FakeS3, fake_s3

from rangestream import StreamDataset, StreamNumpyFormat, StreamStorage
from rangestream.io import S3Store
from rangestream.io.process import run_blocking
from rangestream.io.range_answers import parse_content_range, ranged_body, suffix_body
from rangestream.io.retry import ShortReadError, WrongRangeError
from rangestream.io.s3_options import READS_ENV

SIZE = 50_001
RANGES = [(0, 4096), (10, 4096), (1000, 1001), (SIZE - 100, SIZE), (SIZE - 100, SIZE + 500)]


@pytest.fixture(params=["lean", "s3fs"])
def reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "s3fs":
        monkeypatch.setenv(READS_ENV, "s3fs")
    return str(request.param)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FakeS3, bytes]]:
    data = np.random.default_rng(3).bytes(SIZE)
    (tmp_path / "obj").write_bytes(data)
    with fake_s3(tmp_path) as server:
        yield server, data


def read(server: FakeS3, *calls: tuple[str, tuple[int, ...]]) -> list[bytes | BaseException]:
    """Each ``(method, args)`` on a fresh store, errors returned rather than raised."""
    store = S3Store(server.url(""), server.storage_options())

    async def run() -> list[bytes | BaseException]:
        out: list[bytes | BaseException] = []
        try:
            for method, args in calls:
                try:
                    out.append(await getattr(store, method)("obj", *args))
                except Exception as error:
                    out.append(error)
        finally:
            await store.aclose()
        return out

    return run_blocking(run())


@pytest.mark.parametrize("mode", ["honest", "range_as_200", "ignore_range"])
def test_accepted_answers_give_exactly_the_bytes_asked_for(
    served: tuple[FakeS3, bytes], reads: str, mode: str
) -> None:
    server, data = served
    server.mode = mode
    got = read(server, *[("get_range", r) for r in RANGES], ("get_suffix", (300,)))
    assert got == [data[start:end] for start, end in RANGES] + [data[-300:]]


def test_a_whole_object_answer_costs_one_head_per_object_not_per_read(
    served: tuple[FakeS3, bytes], reads: str
) -> None:
    server, data = served
    server.mode = "ignore_range"
    got = read(server, ("get_range", (10, 20)), ("get_range", (30, 40)), ("get_range", (0, 5)))
    assert got == [data[10:20], data[30:40], data[0:5]]
    # the lean client remembers the size per ETag; s3fs's path asks each time
    assert server.heads == (1 if reads == "lean" else 2)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("shift", r"asked for bytes 10-4095, the server answered HTTP 206 with 'bytes 74-4159"),
        (
            "bare_range",
            r"answered HTTP 200 with 4086 bytes and no Content-Range, but the "
            r"object has 50001 bytes",
        ),
        ("no_content_range", r"HTTP 206 to a range request with an unusable Content-Range"),
        ("status_203", r"the server answered HTTP 203"),
    ],
)
def test_other_answers_are_errors_naming_what_the_server_answered(
    served: tuple[FakeS3, bytes], reads: str, mode: str, message: str
) -> None:
    server, _ = served
    server.mode = mode
    (error,) = read(server, ("get_range", (10, 4096)))
    assert isinstance(error, WrongRangeError), error
    assert "s3://fake-bucket/obj" in str(error)
    assert re.search(message, str(error)), str(error)


def test_the_checks_themselves_refuse_every_mismatch() -> None:
    where = "s3://b/k"
    assert ranged_body(206, "bytes 5-9/100", b"abcde", 5, 10, where) == b"abcde"
    assert ranged_body(200, "bytes 5-9/100", b"abcde", 5, 10, where) == b"abcde"
    assert ranged_body(206, "bytes 5-7/8", b"abc", 5, 10, where) == b"abc"  # the object ends
    assert ranged_body(416, None, b"", 500, 510, where) == b""
    whole = bytes(range(20))
    assert (
        ranged_body(200, None, whole[:10], 5, 10, where, announced=20, object_size=20)
        == (whole[5:10])
    )
    assert ranged_body(200, None, whole, 0, 30, where, announced=20) == whole
    with pytest.raises(WrongRangeError, match="another range"):
        ranged_body(206, "bytes 4-8/100", b"abcde", 5, 10, where)
    with pytest.raises(WrongRangeError, match="another range"):
        ranged_body(200, "bytes 5-10/100", b"abcdef", 5, 10, where)
    with pytest.raises(ShortReadError, match="with 4 bytes"):
        ranged_body(206, "bytes 5-9/100", b"abcd", 5, 10, where)
    with pytest.raises(ShortReadError, match="ends early"):
        ranged_body(206, "bytes 5-7/100", b"abc", 5, 10, where)
    with pytest.raises(WrongRangeError, match="neither the range nor the whole object"):
        ranged_body(200, None, b"abcde", 5, 10, where, announced=5, object_size=20)
    with pytest.raises(WrongRangeError, match="unusable Content-Range"):
        parse_content_range("bytes 9-5/100", where)
    assert suffix_body(206, "bytes 90-99/100", b"x" * 10, 10, where) == b"x" * 10
    assert suffix_body(200, None, whole, 3, where) == whole[-3:]
    with pytest.raises(WrongRangeError, match="another range"):
        suffix_body(206, "bytes 80-99/100", b"x" * 20, 10, where)


def test_stream_windows_read_through_an_rclone_style_server_are_exact(
    tmp_path: Path, reads: str
) -> None:
    tokens_dtype = np.dtype([("tokens", "<i4")])
    tokens = np.random.default_rng(5).integers(0, 1 << 30, 20_000, dtype="<i4")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(tokens_dtype), chunk_bytes=256,
                            block_bytes=16_384)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    with fake_s3(tmp_path) as server:
        server.mode = "range_as_200"
        remote = StreamStorage(server.url("ds"), StreamNumpyFormat(tokens_dtype),
                               storage_options=server.storage_options())  # fmt: skip
        with StreamDataset(remote, 513, stride=301).sync_reader() as windows:
            for i in range(len(windows)):
                np.testing.assert_array_equal(windows[i]["tokens"], tokens[i * 301 : i * 301 + 513])
        assert server.gets > 10
