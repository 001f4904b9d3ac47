"""StreamDataset windows and DocumentDataset readers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from support.s3 import Location

from rangestream import (
    DocumentDataset,
    DocumentPickleFormat,
    DocumentStorage,
    StreamDataset,
    StreamNumpyFormat,
    StreamStorage,
)

FIELDS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def build(url: str, options: dict, sizes: list[list[int]]) -> np.ndarray:
    storage = StreamStorage(url, StreamNumpyFormat(FIELDS), storage_options=options,
                            chunk_bytes=50, block_bytes=500)  # fmt: skip
    start = 0
    with storage.sync_writer() as writer:
        for shard, lengths in enumerate(sizes):
            for n in lengths:
                tokens = np.arange(start, start + n, dtype="<i4")
                writer.append(shard, {"tokens": tokens, "loss_mask": (tokens % 2).astype("u1")})
                start += n
    return np.arange(start)


@pytest.mark.parametrize(
    ("stride", "next_token"), [(None, False), (None, True), (7, False), (16, True)]
)
def test_windows_follow_stride_and_next_token_and_span_records_and_shards(
    tmp_path: Path, stride: int | None, next_token: bool
) -> None:
    truth = build(str(tmp_path / "ds"), {}, [[30, 5, 61], [1], [100, 3]])
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(FIELDS))
    dataset = StreamDataset(storage, 16, stride=stride, next_token=next_token)
    step, width = (stride or 16), 16 + int(next_token)
    expected_count = (len(truth) - width) // step + 1
    with dataset.sync_reader() as reader:
        assert len(reader) == expected_count
        for i in range(len(reader)):
            np.testing.assert_array_equal(reader[i]["tokens"], truth[i * step : i * step + width])
        np.testing.assert_array_equal(
            reader[-1]["tokens"], truth[(expected_count - 1) * step :][:width]
        )
        many = reader[2:5]
        assert [w["tokens"][0] for w in many] == [2 * step, 3 * step, 4 * step]
        with pytest.raises(IndexError):
            reader[expected_count]


def test_async_windows_equal_sync_windows(location: Location) -> None:
    truth = build(location.child("ds"), location.storage_options, [[500], [700]])
    storage = StreamStorage(location.child("ds"), StreamNumpyFormat(FIELDS),
                            storage_options=location.storage_options)  # fmt: skip
    dataset = StreamDataset(storage, sequence_length=128)

    async def read() -> list[np.ndarray]:
        async with dataset.async_reader() as reader:
            assert len(reader) == len(truth) // 128
            one = await reader[3]
            many = await reader.read_many([8, 0, 4])
            return [one["tokens"], *(w["tokens"] for w in many)]

    got = asyncio.run(read())
    for window, index in zip(got, [3, 8, 0, 4], strict=True):
        np.testing.assert_array_equal(window, truth[index * 128 : (index + 1) * 128])


def test_a_window_reader_needs_a_stream_storage(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="stream storage"):
        StreamDataset(DocumentStorage(tmp_path, DocumentPickleFormat()), 4)
    with pytest.raises(ValueError, match="sequence_length"):
        StreamDataset(StreamStorage(tmp_path, StreamNumpyFormat(FIELDS)), 0)


def test_document_dataset_reads_single_documents_and_slices(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for i in range(10):
            writer.append(i // 5, {"i": i})
    with DocumentDataset(storage).sync_reader() as reader:
        assert len(reader) == 10
        assert reader[4] == {"i": 4}
        assert reader[-1] == {"i": 9}
        assert reader[3:6] == [{"i": 3}, {"i": 4}, {"i": 5}]

    async def read() -> object:
        async with DocumentDataset(storage).async_reader() as reader:
            return await reader[8]

    assert asyncio.run(read()) == {"i": 8}


def test_a_sequence_longer_than_the_data_says_so(tmp_path: Path) -> None:
    from rangestream.errors import OutOfRangeError

    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(1000, dtype="<i4")})
    with StreamDataset(storage, 2048, next_token=True).sync_reader() as windows:
        assert len(windows) == 0
        with pytest.raises(
            OutOfRangeError, match="holds 1000 elements, fewer than one window of 2049"
        ):
            windows[0]
