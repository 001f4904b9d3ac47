"""StreamStorage: writes, reads against a numpy ground truth, request contract, errors."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location
from support.streams import SMALL, TOKENS, ShardTagFormat, ground_truth, make_records, write

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import (
    DatasetExistsError,
    DatasetNotFoundError,
    InvalidRecordError,
    InvalidShardError,
    SchemaMismatchError,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.integers(1, 4),
    records=st.integers(1, 6),
    max_len=st.integers(2, 200),
    windows=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 300)), min_size=1, max_size=6),
)
def test_any_read_equals_the_ground_truth_and_its_segments_name_their_shards(
    location: Location,
    seed: int,
    shards: int,
    records: int,
    max_len: int,
    windows: list[tuple[float, int]],
) -> None:
    data = make_records(seed, shards, records, max_len)
    tokens, shard_of = ground_truth(data)
    url = location.child(f"prop-{seed}-{shards}-{records}-{max_len}")
    storage = StreamStorage(url, ShardTagFormat(), storage_options=location.storage_options,
                            **SMALL)  # fmt: skip
    order = list(np.random.default_rng(seed).permutation(np.repeat(np.arange(shards), records)))
    with storage.sync_writer(overwrite=True) as writer:
        for shard in order:
            writer.append(int(shard), data[int(shard)].pop(0))
    with storage.sync_reader() as reader:
        assert reader.total_length == len(tokens)
        for fraction, length in windows:
            length = min(length, len(tokens))
            start = int(fraction * (len(tokens) - length))
            window = reader.read(start, length)
            np.testing.assert_array_equal(window["tokens"], tokens[start : start + length])
            np.testing.assert_array_equal(window["shard"], shard_of[start : start + length])


def test_structured_fields_come_back_aligned_from_sync_and_async_readers(
    location: Location,
) -> None:
    records = make_records(1, 3, 4, 300)
    tokens = np.concatenate([r["tokens"] for s in range(3) for r in records[s]])
    masks = np.concatenate([r["loss_mask"] for s in range(3) for r in records[s]])
    storage = StreamStorage(location.child("ds"), StreamNumpyFormat(TOKENS),
                            storage_options=location.storage_options, **SMALL)  # fmt: skip
    write(storage, records, [2, 0, 1, 1, 0, 2])
    with storage.sync_reader() as raw:
        assert raw.num_shards == 3
        assert [raw.length(s) for s in range(3)] == [
            sum(len(r["tokens"]) for r in records[s]) for s in range(3)
        ]
        out = raw.read(37, 500)
        np.testing.assert_array_equal(out["tokens"], tokens[37:537])
        np.testing.assert_array_equal(out["loss_mask"], masks[37:537])

    async def read_async() -> dict[str, np.ndarray]:
        async with storage.async_reader() as reader:
            return await reader.read(11, 700)

    out = asyncio.run(read_async())
    np.testing.assert_array_equal(out["tokens"], tokens[11:711])
    np.testing.assert_array_equal(out["loss_mask"], masks[11:711])


def test_every_stored_array_is_a_zarr_v3_array_that_zarr_python_reads(tmp_path: Path) -> None:
    records = make_records(2, 2, 5, 400)
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), **SMALL)
    write(storage, records, [0, 1])
    group = zarr.open_group(tmp_path / "ds", mode="r")
    attributes = group.attrs["rangestream"]
    prefix = attributes["data_prefix"]
    for shard in range(2):
        stream = zarr.open_array(tmp_path / "ds" / prefix / "shards" / str(shard) / "stream")
        rows = stream[:].view(TOKENS).reshape(-1)
        np.testing.assert_array_equal(
            rows["tokens"], np.concatenate([r["tokens"] for r in records[shard]])
        )
        ends = zarr.open_array(tmp_path / "ds" / prefix / "shards" / str(shard) / "record_ends")
        np.testing.assert_array_equal(
            ends[:], np.cumsum([len(r["tokens"]) for r in records[shard]])
        )
    lengths = zarr.open_array(tmp_path / "ds" / prefix / "index" / "stream_length")
    np.testing.assert_array_equal(
        lengths[:], [sum(len(r["tokens"]) for r in records[s]) for s in range(2)]
    )


def test_opening_costs_one_request_whatever_the_record_count(tmp_path: Path) -> None:
    counts = []
    for records in (3, 300):
        storage = StreamStorage(tmp_path / f"ds{records}", ShardTagFormat(), **SMALL)
        with storage.sync_writer() as writer:
            for i in range(records):
                writer.append(i % 2, {"tokens": np.arange(5, dtype="<i4")})
        with storage.sync_reader() as reader:
            counts.append(reader.stats.requests)
    assert counts == [1, 1]


@pytest.mark.parametrize("dense_chunks", [True, False])
def test_a_window_inside_one_block_costs_one_request_once_the_block_is_known(
    location: Location, dense_chunks: bool
) -> None:
    storage = StreamStorage(
        location.child("ds"),
        ShardTagFormat(),
        storage_options=location.storage_options,
        chunk_bytes=64,
        block_bytes=4096,
        dense_chunks=dense_chunks,
    )
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(10_000, dtype="<i4")})
        writer.append(1, {"tokens": np.arange(10_000, 20_000, dtype="<i4")})
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        reader.read(100, 200)  # block 0 of shard 0: first touch
        first = reader.stats - before
        before = reader.stats.copy()
        window = reader.read(300, 200)  # same block
        warm = reader.stats - before
        np.testing.assert_array_equal(window["tokens"], np.arange(300, 500))
        assert first.requests == (1 if dense_chunks else 2)
        assert warm.requests == 1
        # bytes fetched <= the window's bytes + two inner chunks, plus the 4-byte crc32c
        # of every inner chunk the read touches (16 rows per chunk here)
        chunks_touched = -(-200 // 16) + 1
        assert warm.bytes <= 200 * 4 + 2 * (64 + 4) + 4 * chunks_touched
        before = reader.stats.copy()
        # crosses from shard 0 into shard 1, inside the last block of shard 0
        block_rows = reader.opened.manifest.arrays["stream"].block_rows
        assert 10_000 % block_rows >= 10, "the window must not cross a block of shard 0"
        crossing = reader.read(9_990, 20)
        np.testing.assert_array_equal(crossing["tokens"], np.arange(9_990, 10_010))
        np.testing.assert_array_equal(crossing["shard"], [0] * 10 + [1] * 10)
        spent = reader.stats - before
        assert spent.requests == (2 if dense_chunks else 4)


def test_an_exception_inside_the_writer_leaves_no_committed_dataset(location: Location) -> None:
    storage = StreamStorage(location.child("ds"), ShardTagFormat(),
                            storage_options=location.storage_options)  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"), storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(10, dtype="<i4")})
        raise RuntimeError("boom")
    assert not storage.exists()
    with pytest.raises(DatasetNotFoundError, match="ds"):
        storage.sync_reader().__enter__()


def test_writing_over_a_committed_dataset_needs_overwrite(location: Location) -> None:
    storage = StreamStorage(location.child("ds"), ShardTagFormat(),
                            storage_options=location.storage_options)  # fmt: skip
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(10, dtype="<i4")})
    with pytest.raises(DatasetExistsError, match="overwrite=True"):
        storage.sync_writer()
    with storage.sync_writer(overwrite=True) as writer:
        writer.append(0, {"tokens": np.arange(3, dtype="<i4")})
    with storage.sync_reader() as reader:
        assert reader.total_length == 3


def test_a_reader_of_the_old_version_keeps_reading_it_after_an_overwrite(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(100, dtype="<i4")})
    with storage.sync_reader() as old:
        with storage.sync_writer(overwrite=True) as writer:
            writer.append(0, {"tokens": np.arange(100, 300, dtype="<i4")})
        np.testing.assert_array_equal(old.read(90, 10)["tokens"], np.arange(90, 100))
    with storage.sync_reader() as new:
        np.testing.assert_array_equal(new.read(90, 10)["tokens"], np.arange(190, 200))


def _write_part(session: Any, shards: list[int]) -> None:
    with session.sync_writer() as writer:
        for shard in shards:
            for i in range(3):
                writer.append(shard, {"tokens": np.full(4, shard * 10 + i, dtype="<i4")})


@pytest.mark.parametrize("start_method", ["spawn"])
def test_two_processes_write_distinct_shards_and_one_commit_publishes_both(
    location: Location, start_method: str
) -> None:
    storage = StreamStorage(location.child("ds"), ShardTagFormat(),
                            storage_options=location.storage_options)  # fmt: skip
    session = storage.parallel_write()
    context = multiprocessing.get_context(start_method)
    workers = [
        context.Process(target=_write_part, args=(session, shards)) for shards in ([0, 2], [1])
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert not storage.exists()  # nothing visible before the commit
    session.commit()
    with storage.sync_reader() as reader:
        tokens = reader.read(0, reader.total_length)["tokens"]
    expected = np.concatenate([np.full(4, s * 10 + i) for s in range(3) for i in range(3)])
    np.testing.assert_array_equal(tokens, expected)


def test_two_writers_of_the_same_shard_make_the_commit_fail(tmp_path: Path) -> None:
    from rangestream.errors import CommitError

    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    session = storage.parallel_write()
    _write_part(session, [0])
    _write_part(session, [0])
    with pytest.raises(CommitError, match="shard 0"):
        session.commit()
    assert not storage.exists()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"tokens": np.arange(3, dtype="<i4")}, "fields"),
        ({"tokens": np.zeros((2, 2), "<i4"), "loss_mask": np.zeros((2, 2), "u1")}, "1-D"),
        ({"tokens": np.arange(3, dtype="<i4"), "loss_mask": np.ones(2, "u1")}, "elements"),
        ({"tokens": np.arange(0.5, 4, dtype="<f8"), "loss_mask": np.ones(4, "u1")}, "fit"),
        ([1, 2, 3], "mapping"),
    ],
)
def test_a_bad_record_is_refused_and_the_writer_stays_usable(
    tmp_path: Path, record: Any, message: str
) -> None:
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(2, dtype="<i4"), "loss_mask": np.ones(2, "u1")})
        with pytest.raises(InvalidRecordError, match=message):
            writer.append(0, record)
        writer.append(0, {"tokens": np.arange(5, 7, dtype="<i4"), "loss_mask": np.ones(2, "u1")})
    with storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, 4)["tokens"], [0, 1, 5, 6])


@pytest.mark.parametrize("shard", [-1, 1.5, "0", True, None])
def test_a_negative_or_non_integer_shard_is_refused(tmp_path: Path, shard: Any) -> None:
    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    with storage.sync_writer() as writer, pytest.raises(InvalidShardError):
        writer.append(shard, {"tokens": np.arange(2, dtype="<i4")})


def test_a_custom_format_returning_the_wrong_dtype_is_refused(tmp_path: Path) -> None:
    class Wrong(ShardTagFormat):
        def pack(self, data: dict) -> np.ndarray:
            return np.asarray(data["tokens"], dtype="<i8")

    storage = StreamStorage(tmp_path / "ds", Wrong())
    with storage.sync_writer() as writer, pytest.raises(InvalidRecordError, match="int64"):
        writer.append(0, {"tokens": [1, 2]})


def test_reading_past_the_end_raises_index_error(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(10, dtype="<i4")})
    with storage.sync_reader() as reader:
        with pytest.raises(IndexError, match="10 elements"):
            reader.read(5, 6)
        with pytest.raises(IndexError):
            reader.read(-1, 2)


def test_a_url_without_a_dataset_raises_an_error_naming_it(location: Location) -> None:
    url = location.child("nothing-here")
    with pytest.raises(DatasetNotFoundError, match="nothing-here"):
        StreamStorage(url, ShardTagFormat(), storage_options=location.storage_options
                      ).sync_reader().__enter__()  # fmt: skip


def test_a_format_with_another_dtype_than_the_stored_one_is_refused(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(10, dtype="<i4")})
    other = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS))
    with pytest.raises(SchemaMismatchError, match="stream_dtype"):
        other.sync_reader().__enter__()


@pytest.mark.parametrize("form", ["path", "str", "file", "memory"])
def test_every_url_form_reads_back_what_was_written(tmp_path: Path, form: str) -> None:
    url: Any = {
        "path": tmp_path / "p",
        "str": str(tmp_path / "s"),
        "file": f"file://{tmp_path}/f",
        "memory": f"memory://rangestream-test/{tmp_path.name}",
    }[form]
    storage = StreamStorage(url, ShardTagFormat(), **SMALL)
    with storage.sync_writer() as writer:
        writer.append(1, {"tokens": np.arange(50, dtype="<i4")})
        writer.append(0, {"tokens": np.arange(50, 80, dtype="<i4")})
    with storage.sync_reader() as reader:
        np.testing.assert_array_equal(
            reader.read(0, 80)["tokens"], np.r_[np.arange(50, 80), np.arange(50)]
        )


# -- every stored field is little-endian, whatever the format's byte order -------------------

BIG = np.dtype([("tokens", ">i4"), ("weight", ">f8")])
LITTLE = np.dtype([("tokens", "<i4"), ("weight", "<f8")])


def test_a_big_endian_format_is_stored_little_endian_and_reads_back_equal(tmp_path: Path) -> None:
    import json

    tokens = np.arange(-300, 700, dtype=">i4")
    weights = np.linspace(0, 1, 1000).astype(">f8")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(BIG), **SMALL)
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens, "weight": weights})
    root = json.loads((tmp_path / "ds" / "zarr.json").read_bytes())["attributes"]["rangestream"]
    assert root["schema"]["stream_dtype"] == [["tokens", "<i4"], ["weight", "<f8"]]
    assert root["arrays"]["stream"]["dtype"] == [["tokens", "<i4"], ["weight", "<f8"]]
    array = tmp_path / "ds" / root["data_prefix"] / "shards" / "0" / "stream"
    assert json.loads((array / "zarr.json").read_bytes())["attributes"][
        "rangestream_row_dtype"
    ] == [["tokens", "<i4"], ["weight", "<f8"]]
    stored = zarr.open_array(array, mode="r")[:].view(LITTLE).reshape(-1)  # raw little bytes
    np.testing.assert_array_equal(stored["tokens"], tokens)
    np.testing.assert_array_equal(stored["weight"], weights)
    reopened = StreamStorage(tmp_path / "ds", StreamNumpyFormat(BIG))  # the equality check
    with reopened.sync_reader() as reader:
        window = reader.read(100, 500)
    assert window["tokens"].dtype == np.dtype("<i4")  # reads return the stored byte order
    np.testing.assert_array_equal(window["tokens"], tokens[100:600])
    np.testing.assert_array_equal(window["weight"], weights[100:600])


class BigEndianIds:
    """A custom format whose stream dtype is a plain big-endian int32."""

    stream_dtype = np.dtype(">i4")

    def pack(self, data: Any) -> np.ndarray:
        return np.asarray(data, dtype=">i4")

    def unpack(self, stream: np.ndarray, shard_lengths: Any, shards: Any) -> np.ndarray:
        return stream


def test_a_plain_big_endian_stream_is_a_little_endian_zarr_int32(tmp_path: Path) -> None:
    import json

    storage = StreamStorage(tmp_path / "ds", BigEndianIds(), **SMALL)
    with storage.sync_writer() as writer:
        writer.append(0, np.arange(1000) * 70_000)
    root = json.loads((tmp_path / "ds" / "zarr.json").read_bytes())["attributes"]["rangestream"]
    array = tmp_path / "ds" / root["data_prefix"] / "shards" / "0" / "stream"
    document = json.loads((array / "zarr.json").read_bytes())
    inner = document["codecs"][0]["configuration"]["codecs"][0]
    assert document["data_type"] == "int32" and inner["configuration"] == {"endian": "little"}
    np.testing.assert_array_equal(zarr.open_array(array, mode="r")[:], np.arange(1000) * 70_000)
    with StreamStorage(tmp_path / "ds", BigEndianIds()).sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(990, 10), np.arange(990, 1000) * 70_000)


# -- self-describing datasets: read back without the format object --------------------------


def _root(path: Path) -> dict[str, Any]:
    import json

    return dict(json.loads((path / "zarr.json").read_bytes()))


def _set_stored_schema(path: Path, schema: dict[str, Any]) -> None:
    """Make the committed root record ``schema``, as an older writer or an attacker would."""
    import json

    root = _root(path)
    root["attributes"]["rangestream"]["schema"] = schema
    (path / "zarr.json").write_text(json.dumps(root))


def test_a_stream_numpy_dataset_reads_back_without_its_format(location: Location) -> None:
    records = make_records(5, shards=2, records=4, max_len=60)
    url = location.child("self")
    write(StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=location.storage_options,
                        **SMALL), records, [])  # fmt: skip
    tokens, _ = ground_truth(records)
    storage = StreamStorage(url, storage_options=location.storage_options)
    assert storage.storage_format is None
    with storage.sync_reader() as reader:
        window = reader.read(3, len(tokens) - 5)
        assert reader.total_length == len(tokens)
    np.testing.assert_array_equal(window["tokens"], tokens[3:-2])
    assert storage.stream_dtype == TOKENS


def test_the_schema_records_the_stream_numpy_format_beside_its_dtype(tmp_path: Path) -> None:
    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)), make_records(1, 1, 1, 5), [])
    schema = _root(tmp_path / "ds")["attributes"]["rangestream"]["schema"]
    assert schema["format"] == {"format": "stream_numpy", "version": 1}
    assert np.lib.format.descr_to_dtype([tuple(f) for f in schema["stream_dtype"]]) == TOKENS


def test_a_custom_format_records_nothing_and_must_be_passed_to_read(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", ShardTagFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": [1, 2, 3]})
    assert "format" not in _root(tmp_path / "ds")["attributes"]["rangestream"]["schema"]
    with pytest.raises(SchemaMismatchError, match=r"does not record its format.*pass the format"):
        StreamStorage(tmp_path / "ds").sync_reader().__enter__()
    with StreamStorage(tmp_path / "ds", ShardTagFormat()).sync_reader() as reader:
        assert reader.read(0, 3)["tokens"].tolist() == [1, 2, 3]


def test_a_dataset_written_before_formats_were_recorded_reads_with_its_format(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ds"
    records = make_records(2, shards=1, records=3, max_len=20)
    write(StreamStorage(path, StreamNumpyFormat(TOKENS)), records, [])
    schema = _root(path)["attributes"]["rangestream"]["schema"]
    _set_stored_schema(path, {"stream_dtype": schema["stream_dtype"]})  # what main wrote
    with pytest.raises(SchemaMismatchError, match="does not record its format"):
        StreamStorage(path).sync_reader().__enter__()
    tokens, _ = ground_truth(records)
    with StreamStorage(path, StreamNumpyFormat(TOKENS)).sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, len(tokens))["tokens"], tokens)


def test_a_converted_dataset_of_the_previous_layout_reads_without_a_format(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ds"
    records = make_records(3, shards=1, records=3, max_len=20)
    write(StreamStorage(path, StreamNumpyFormat(TOKENS)), records, [])
    schema = _root(path)["attributes"]["rangestream"]["schema"]
    # convert's stored schema before the kinds recorded formats themselves
    _set_stored_schema(path, {"stream_dtype": schema["stream_dtype"],
                              "format": {"format": "stream_numpy", "version": 1},
                              "ingest": {"preset": "sft", "tokenizer": "bytes"}})  # fmt: skip
    tokens, _ = ground_truth(records)
    with StreamStorage(path).sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, len(tokens))["tokens"], tokens)


def test_a_given_format_describing_another_format_is_refused(tmp_path: Path) -> None:
    class Renamed(StreamNumpyFormat[Any]):
        def schema(self) -> dict[str, Any]:
            return {"format": "stream_numpy", "version": 1, "variant": "mine"}

    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)), make_records(1, 1, 1, 5), [])
    with pytest.raises(SchemaMismatchError, match="written with the format"):
        StreamStorage(tmp_path / "ds", Renamed(TOKENS)).sync_reader().__enter__()


@pytest.mark.parametrize(
    "stored",
    [{"format": "x/../../y"}, {"format": "unknown-format"}, "stream_numpy", {"format": 3}],
)
def test_a_stored_format_that_names_nothing_readable_is_refused_on_open(
    tmp_path: Path, stored: Any
) -> None:
    from rangestream.errors import MetadataError

    path = tmp_path / "ds"
    write(StreamStorage(path, StreamNumpyFormat(TOKENS)), make_records(1, 1, 1, 5), [])
    schema = _root(path)["attributes"]["rangestream"]["schema"]
    _set_stored_schema(path, {**schema, "format": stored})
    with pytest.raises((MetadataError, SchemaMismatchError)):
        StreamStorage(path).sync_reader().__enter__()


def test_writing_without_a_format_says_a_format_is_needed(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds")
    with pytest.raises(TypeError, match="writing needs the storage_format"):
        storage.sync_writer().append(0, {"tokens": [1]})


def test_notes_are_recorded_beside_the_schema_and_may_not_replace_its_keys(
    tmp_path: Path,
) -> None:
    notes = {"ingest": {"preset": "seq", "tokenizer": "bytes"}}
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), notes=notes)
    write(storage, make_records(1, 1, 1, 5), [])
    schema = _root(tmp_path / "ds")["attributes"]["rangestream"]["schema"]
    assert schema["ingest"] == notes["ingest"]
    clashing = StreamStorage(tmp_path / "other", StreamNumpyFormat(TOKENS), notes={"format": 1})
    with pytest.raises(ValueError, match=r"notes \['format'\]"):
        write(clashing, make_records(1, 1, 1, 5), [])
    with pytest.raises(TypeError, match="JSON"):
        StreamStorage(tmp_path / "x", StreamNumpyFormat(TOKENS), notes={"a": object()})


def test_counts_have_one_name_per_item_per_shard_and_in_all(tmp_path: Path) -> None:
    records = make_records(4, shards=2, records=3, max_len=30)
    records[3] = records.pop(1)  # shards 0 and 3
    write(StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS)), records, [])
    lengths = {s: sum(len(r["tokens"]) for r in records.get(s, [])) for s in range(5)}
    with StreamStorage(tmp_path / "ds").sync_reader() as reader:
        assert reader.num_shards == 4
        assert [reader.num_elements(s) for s in range(5)] == [lengths[s] for s in range(5)]
        assert [reader.num_records(s) for s in range(5)] == [3, 0, 0, 3, 0]
        assert reader.num_elements() == sum(lengths.values()) == reader.total_length
        assert reader.num_records() == 6
        assert [reader.length(s) for s in range(5)] == [lengths[s] for s in range(5)]


class _DoubledTokens(StreamNumpyFormat[Any]):
    """A format of one field with its own ``unpack``: the mapped path must call it."""

    def unpack(self, stream: Any, shard_lengths: Any, shards: Any) -> Any:
        return {"tokens": stream["tokens"] * 2}


@pytest.mark.parametrize(
    ("dtype", "plain"),
    [
        (np.dtype([("tokens", "<u2")]), True),  # a token stream: one field, the whole element
        (np.dtype([("tokens", "<i4")]), True),
        (TOKENS, False),  # two fields: the structured array's field views
        (np.dtype({"names": ["tokens"], "formats": ["<u2"], "itemsize": 4}), False),  # padded
    ],
)
def test_a_local_window_of_a_lone_field_is_a_plain_array_owning_its_memory(
    tmp_path: Path, dtype: np.dtype[Any], plain: bool
) -> None:
    rng = np.random.default_rng(5)
    values = rng.integers(0, 60_000, 5_000)
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(dtype), chunk_bytes=512,
                            block_bytes=8192)  # fmt: skip
    with storage.sync_writer() as writer:
        for piece in np.array_split(values, 7):
            row = np.zeros(len(piece), dtype)
            row["tokens"] = piece
            writer.append(0, {name: row[name] for name in dtype.names})
    field = dtype.fields["tokens"][0]
    with StreamStorage(tmp_path / "ds", StreamNumpyFormat(dtype)).sync_reader() as reader:
        for start in [0, 3, 100, 2_000, 4_950]:
            got = reader.read(start, 50)
            window = got["tokens"]
            assert window.dtype == field and window.shape == (50,)
            np.testing.assert_array_equal(window, values[start : start + 50].astype(field))
            assert (window.base is None) is plain  # plain: no structured array behind it
            window[:] = 0  # writable; the stored data is untouched
            np.testing.assert_array_equal(
                reader.read(start, 50)["tokens"], values[start : start + 50].astype(field)
            )
        assert list(got) == list(dtype.names)


def test_a_format_with_its_own_unpack_is_used_by_local_windows(tmp_path: Path) -> None:
    dtype = np.dtype([("tokens", "<i4")])
    values = np.arange(3_000, dtype="<i4")
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(dtype), chunk_bytes=512)
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": values})
    with StreamStorage(tmp_path / "ds", _DoubledTokens(dtype)).sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(10, 20)["tokens"], values[10:30] * 2)
