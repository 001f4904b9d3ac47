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


def test_datasets_have_a_length_without_a_reader(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for i in range(7):
            writer.append(i % 2, i)
    dataset = DocumentDataset(storage)
    assert bool(dataset) and len(dataset) == 7
    truth = build(str(tmp_path / "ds"), {}, [[30, 5], [61]])
    windows = StreamDataset(StreamStorage(tmp_path / "ds"), 16, next_token=True)
    assert len(windows) == (len(truth) - 17) // 16 + 1


def test_negative_indexes_count_from_the_end_for_windows_and_documents(tmp_path: Path) -> None:
    truth = build(str(tmp_path / "ds"), {}, [[40, 9], [33]])
    dataset = StreamDataset(StreamStorage(tmp_path / "ds"), 10)
    with dataset.sync_reader() as reader:
        count = len(reader)
        np.testing.assert_array_equal(reader[-1]["tokens"], truth[(count - 1) * 10 :][:10])
        got = reader.read_many([-2, 0])
        np.testing.assert_array_equal(got[0]["tokens"], truth[(count - 2) * 10 :][:10])
    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for i in range(5):
            writer.append(0, i)
    with DocumentDataset(storage).sync_reader() as reader:
        assert reader.read_many([-1, -5, 2]) == [4, 0, 2]


# -- windows with record boundaries -----------------------------------------------------------

SIZES = [[30, 5, 0, 61, 1], [], [100, 3, 17]]  # an empty record, an unwritten shard


def expected_boundaries(sizes: list[list[int]], start: int, length: int) -> tuple[list, list]:
    """cu_seqlens and position ids of elements [start, start + length), from record sizes."""
    lengths = [n for shard in sizes for n in shard]
    ends = np.cumsum(lengths)
    record = np.repeat(np.arange(len(lengths)), lengths)  # the record of every element
    begins = ends - np.asarray(lengths)
    window = np.arange(start, start + length)
    positions = window - begins[record[window]]
    changes = [k for k in range(1, length) if record[window[k]] != record[window[k - 1]]]
    return [0, *changes, length], positions.tolist()


@pytest.mark.parametrize(("stride", "next_token"), [(None, False), (7, True)])
def test_windows_with_boundaries_give_cu_seqlens_and_positions_of_their_records(
    location: Location, stride: int | None, next_token: bool
) -> None:
    truth = build(location.child("ds"), location.storage_options, SIZES)
    storage = StreamStorage(location.child("ds"), storage_options=location.storage_options)
    dataset = StreamDataset(storage, 16, stride=stride, next_token=next_token, boundaries=True)
    step = stride or 16
    with dataset.sync_reader() as reader:
        windows = [reader[i] for i in range(len(reader))]
        last = reader[-1]
        sliced = reader[1:3]
    for i, window in enumerate([*windows, last, *sliced]):
        index = (i if i < len(windows) else [len(windows) - 1, 1, 2][i - len(windows)]) * step
        cu, positions = expected_boundaries(SIZES, index, 16)
        assert window["cu_seqlens"].dtype == np.int32
        assert window["cu_seqlens"].tolist() == cu
        assert window["position_ids"].tolist() == positions
        np.testing.assert_array_equal(window["tokens"], truth[index : index + 16 + next_token])


def test_boundaries_cost_one_record_ends_request_per_shard_and_none_per_window(
    location: Location,
) -> None:
    build(location.child("ds"), location.storage_options, SIZES)
    storage = StreamStorage(location.child("ds"), storage_options=location.storage_options)
    plain = StreamDataset(storage, 16).sync_reader()
    bounded = StreamDataset(storage, 16, boundaries=True).sync_reader()
    order = [0, 1, 5, 2, 9, 10, 3]  # shard 0, then 2 (window 6 crosses them), then back
    costs = []
    for reader in (plain, bounded):
        with reader:
            len(reader)
            before = reader.stats.copy()
            for i in order:
                reader[i]
            costs.append(reader.stats - before)
    assert costs[1].by_key_kind == {**costs[0].by_key_kind, "record_ends": 2}
    assert costs[1].requests == costs[0].requests + 2


def test_async_windows_with_boundaries_equal_the_sync_ones(location: Location) -> None:
    build(location.child("ds"), location.storage_options, SIZES)
    storage = StreamStorage(location.child("ds"), storage_options=location.storage_options)
    dataset = StreamDataset(storage, 16, boundaries=True)

    async def read() -> list[dict]:
        async with dataset.async_reader() as reader:
            return [await reader[5], *(await reader.read_many([-1, 2]))]

    got = asyncio.run(read())
    with dataset.sync_reader() as reader:
        expected = [reader[5], reader[-1], reader[2]]
    for window, want in zip(got, expected, strict=True):
        assert window["cu_seqlens"].tolist() == want["cu_seqlens"].tolist()
        assert window["position_ids"].tolist() == want["position_ids"].tolist()


def test_a_stored_position_ids_field_is_kept_and_other_windows_come_as_pairs() -> None:
    from rangestream.dataset.stream import with_boundaries

    starts = np.asarray([-3, 2, 5])
    stored = {"position_ids": np.arange(8) + 100}
    kept = with_boundaries(stored, starts, 8)
    assert kept["position_ids"].tolist() == stored["position_ids"].tolist()
    assert kept["cu_seqlens"].tolist() == [0, 2, 5, 8]
    window, bounds = with_boundaries(np.arange(8), starts, 6)
    assert window.tolist() == list(range(8))
    assert bounds["cu_seqlens"].tolist() == [0, 2, 5, 6]
    assert bounds["position_ids"].tolist() == [3, 4, 0, 1, 2, 0]
