"""DocumentStorage: documents in global shard order, read alone or in coalesced batches."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location, S3Location

from rangestream import DocumentPickleFormat, DocumentStorage, RecordField, RecordFormat
from rangestream.errors import InvalidRecordError
from rangestream.io import IOStats, request_cap
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.types import DocumentStorageFormat
from testkit import LatencyProxy

SMALL = {"chunk_bytes": 32, "block_bytes": 256}


class RawBytes(DocumentStorageFormat[bytes, tuple[int, bytes]]):
    """Stores bytes as they are; unpack also reports the shard it read from."""

    def pack(self, data: bytes) -> bytes:
        return data

    def unpack(self, encoded_data: Any, shard: int) -> tuple[int, bytes]:
        return shard, bytes(encoded_data)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    documents=st.lists(
        st.tuples(st.integers(0, 3), st.binary(max_size=300)), min_size=1, max_size=40
    ),
    picks=st.lists(st.floats(0, 1), min_size=1, max_size=10),
)
def test_documents_read_back_in_shard_order_with_their_shard(
    location: Location, documents: list[tuple[int, bytes]], picks: list[float]
) -> None:
    url = location.child(f"docs-{abs(hash((tuple(documents), tuple(picks))))}")
    storage = DocumentStorage(url, RawBytes(), storage_options=location.storage_options, **SMALL)
    with storage.sync_writer(overwrite=True) as writer:
        for shard, payload in documents:
            writer.append(shard, payload)
    expected = [(s, p) for shard in range(4) for s, p in documents if s == shard]
    indexes = [int(f * (len(expected) - 1)) for f in picks]
    with storage.sync_reader() as reader:
        assert len(reader) == len(expected)
        assert reader.read(indexes[0]) == expected[indexes[0]]
        assert reader.read_many(indexes) == [expected[i] for i in indexes]


def test_pickled_documents_round_trip_through_sync_and_async_readers(location: Location) -> None:
    documents = [
        {"id": i, "text": "x" * (i * 37 % 500), "values": list(range(i % 7))} for i in range(60)
    ]
    storage = DocumentStorage(location.child("docs"), DocumentPickleFormat(),
                              storage_options=location.storage_options, **SMALL)  # fmt: skip
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i % 3, document)
    in_order = [d for shard in range(3) for i, d in enumerate(documents) if i % 3 == shard]
    with storage.sync_reader() as reader:
        assert reader.read_many(range(60)) == in_order

    async def read_async() -> list[Any]:
        async with storage.async_reader() as reader:
            return [await reader.read(7), *(await reader.read_many([59, 0, 30]))]

    assert asyncio.run(read_async()) == [in_order[7], in_order[59], in_order[0], in_order[30]]


def test_after_a_shards_offsets_are_cached_a_batch_costs_one_heap_request(
    tmp_path: Path,
) -> None:
    storage = DocumentStorage(tmp_path / "docs", RawBytes(), chunk_bytes=64, block_bytes=1 << 16)
    with storage.sync_writer() as writer:
        for i in range(200):
            writer.append(0, bytes([i % 256]) * 50)
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        first = reader.read_many([10, 11, 12, 13])
        cold = reader.stats - before
        before = reader.stats.copy()
        second = reader.read_many([100, 101, 102])
        warm = reader.stats - before
    assert [payload for _, payload in first] == [bytes([i]) * 50 for i in (10, 11, 12, 13)]
    assert [payload for _, payload in second] == [bytes([i]) * 50 for i in (100, 101, 102)]
    assert cold.by_key_kind == {"payload_offsets": 1, "payload_heap": 1}
    assert warm.by_key_kind == {"payload_heap": 1}


def test_offsets_beyond_the_cache_budget_are_read_per_batch(tmp_path: Path) -> None:
    storage = DocumentStorage(
        tmp_path / "docs", RawBytes(), chunk_bytes=64, block_bytes=1 << 16, offsets_cache_bytes=0
    )
    with storage.sync_writer() as writer:
        for i in range(200):
            writer.append(0, bytes([i % 256]) * 50)
    with storage.sync_reader() as reader:
        for batch in ([10, 11, 12], [150, 151]):
            before = reader.stats.copy()
            got = reader.read_many(batch)
            spent = reader.stats - before
            assert [payload for _, payload in got] == [bytes([i]) * 50 for i in batch]
            assert spent.by_key_kind == {"payload_offsets": 1, "payload_heap": 1}


def test_a_pack_that_returns_no_bytes_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    class NotBytes(RawBytes):
        def pack(self, data: Any) -> Any:
            return data

    storage = DocumentStorage(tmp_path / "docs", NotBytes())
    with storage.sync_writer() as writer:
        writer.append(0, b"ok")
        with pytest.raises(InvalidRecordError, match="bytes"):
            writer.append(0, "a string")
        writer.append(0, b"fine")
    with storage.sync_reader() as reader:
        assert reader.read_many([0, 1]) == [(0, b"ok"), (0, b"fine")]


def test_document_index_out_of_range_raises_index_error(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", RawBytes())
    with storage.sync_writer() as writer:
        writer.append(0, b"a")
    with storage.sync_reader() as reader, pytest.raises(IndexError):
        reader.read(1)


def test_the_pickle_format_is_marked_trusted_only() -> None:
    doc = DocumentPickleFormat.__doc__ or ""
    assert "trusted" in doc
    assert DocumentPickleFormat().unpack(pickle.dumps({"a": np.int64(3)}), 0) == {"a": 3}


# -- the schema says how payloads are encoded, so a reader without the format can tell -------


def stored_schema(path: Path) -> dict[str, Any]:
    import json

    root = json.loads((path / "zarr.json").read_bytes())
    return dict(root["attributes"]["rangestream"]["schema"])


class Utf8Format:
    """A custom format that names its encoding."""

    payload_encoding = "utf-8"

    def pack(self, data: str) -> bytes:
        return data.encode()

    def unpack(self, encoded_data: Any, shard: int) -> str:
        return bytes(encoded_data).decode()


class UnnamedFormat(Utf8Format):
    payload_encoding = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("storage_format", "encoding"),
    [
        (DocumentPickleFormat(), "pickle"),
        (Utf8Format(), "utf-8"),
        (UnnamedFormat(), f"python:{__name__}.UnnamedFormat"),
    ],
)
def test_the_schema_records_the_payload_encoding(
    tmp_path: Path, storage_format: Any, encoding: str
) -> None:
    storage = DocumentStorage(tmp_path / "ds", storage_format)
    with storage.sync_writer() as writer:
        writer.append(0, "some text")
    assert stored_schema(tmp_path / "ds") == {"payload_encoding": encoding}


def _set_stored_schema(path: Path, schema: dict[str, Any]) -> None:
    import json

    root = json.loads((path / "zarr.json").read_bytes())
    root["attributes"]["rangestream"]["schema"] = schema
    (path / "zarr.json").write_text(json.dumps(root))


DPO = RecordFormat(
    [
        RecordField("chosen", np.dtype("<u2")),
        RecordField("rejected", np.dtype("<u2")),
        RecordField("reward", np.dtype("<f4"), ndim=0),
    ]
)


def dpo_records(count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(count)
    return [
        {
            "chosen": rng.integers(0, 60_000, rng.integers(1, 40), dtype="<u2"),
            "rejected": rng.integers(0, 60_000, rng.integers(1, 40), dtype="<u2"),
            "reward": np.float32(rng.normal()),
        }
        for _ in range(count)
    ]


def assert_records_equal(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)


def test_a_record_dataset_reads_back_without_its_format(location: Location) -> None:
    records = dpo_records(12)
    url = location.child("records")
    with DocumentStorage(url, DPO, storage_options=location.storage_options).sync_writer() as w:
        for i, record in enumerate(records):
            w.append(i % 2, record)
    in_order = [r for shard in (0, 1) for i, r in enumerate(records) if i % 2 == shard]
    storage = DocumentStorage(url, storage_options=location.storage_options)
    with storage.sync_reader() as reader:
        got = reader.read_many(range(len(records)))
        assert reader.format == DPO
    for record, expected in zip(got, in_order, strict=True):
        assert_records_equal(record, expected)
    assert stored_schema_of(url, location) == {"payload_encoding": "records",
                                               "format": DPO.schema()}  # fmt: skip


def stored_schema_of(url: str, location: Location) -> dict[str, Any]:
    import json

    import fsspec

    with fsspec.open(f"{url}/zarr.json", "rb", **location.storage_options) as handle:
        return dict(json.loads(handle.read())["attributes"]["rangestream"]["schema"])


def test_a_record_dataset_of_the_previous_layout_reads_with_or_without_its_format(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ds"
    records = dpo_records(3)
    with DocumentStorage(path, DPO).sync_writer() as writer:
        for record in records:
            writer.append(0, record)
    # what convert stored before the kinds recorded formats themselves
    _set_stored_schema(path, {"payload_encoding": "python:rangestream.formats.records.RecordFormat",
                              "format": DPO.schema(), "ingest": {"preset": "dpo"}})  # fmt: skip
    for storage in (DocumentStorage(path), DocumentStorage(path, DPO)):
        with storage.sync_reader() as reader:
            assert_records_equal(reader.read(2), records[2])


def test_a_record_format_with_other_fields_than_the_stored_ones_is_refused(
    tmp_path: Path,
) -> None:
    from rangestream.errors import SchemaMismatchError

    with DocumentStorage(tmp_path / "ds", DPO).sync_writer() as writer:
        writer.append(0, dpo_records(1)[0])
    other = RecordFormat([RecordField("chosen", np.dtype("<u4"))])
    with pytest.raises(SchemaMismatchError, match="written with the format"):
        DocumentStorage(tmp_path / "ds", other).sync_reader().__enter__()
    with pytest.raises(SchemaMismatchError, match=r"'records'.*'pickle'"):
        DocumentStorage(tmp_path / "ds", DocumentPickleFormat()).sync_reader().__enter__()


def test_pickled_documents_are_never_unpickled_on_the_word_of_the_store(tmp_path: Path) -> None:
    from rangestream.errors import SchemaMismatchError

    with DocumentStorage(tmp_path / "ds", DocumentPickleFormat()).sync_writer() as writer:
        writer.append(0, {"a": 1})
    with pytest.raises(SchemaMismatchError, match=r"pickled.*DocumentPickleFormat\(\)"):
        DocumentStorage(tmp_path / "ds").sync_reader().__enter__()
    with DocumentStorage(tmp_path / "ds", DocumentPickleFormat()).sync_reader() as reader:
        assert reader.read(0) == {"a": 1}


@pytest.mark.parametrize("encoding", ["utf-8", None])
def test_a_custom_format_must_be_passed_to_read_and_the_error_says_so(
    tmp_path: Path, encoding: str | None
) -> None:
    from rangestream.errors import SchemaMismatchError

    storage_format = Utf8Format() if encoding else UnnamedFormat()
    with DocumentStorage(tmp_path / "ds", storage_format).sync_writer() as writer:
        writer.append(0, "text")
    with pytest.raises(SchemaMismatchError, match=r"does not record its format.*pass the format"):
        DocumentStorage(tmp_path / "ds").sync_reader().__enter__()


def test_a_format_naming_another_encoding_is_refused_on_open(tmp_path: Path) -> None:
    from rangestream.errors import SchemaMismatchError

    with DocumentStorage(tmp_path / "ds", DocumentPickleFormat()).sync_writer() as writer:
        writer.append(0, "some text")
    with pytest.raises(SchemaMismatchError, match=r"'pickle'.*'utf-8'"):
        DocumentStorage(tmp_path / "ds", Utf8Format()).sync_reader().__enter__()
    with DocumentStorage(tmp_path / "ds", UnnamedFormat()).sync_reader() as reader:
        assert len(reader) == 1  # a format that names no encoding is not checked


# -- offsets read by range, kept in bounded memory ------------------------------------------


def test_a_cold_document_costs_one_offsets_chunk_and_the_heap_chunks_it_spans(
    tmp_path: Path,
) -> None:
    storage = DocumentStorage(tmp_path / "docs", RawBytes(), block_bytes=1 << 20)
    documents = [bytes([i % 256]) * (300 + 7 * i) for i in range(1000)]
    with storage.sync_writer() as writer:
        for document in documents:
            writer.append(0, document)
    ends = np.cumsum([0] + [len(d) for d in documents])
    with storage.sync_reader() as reader:
        heap = reader.opened.manifest.arrays["payload_heap"]
        offsets = reader.opened.manifest.arrays["payload_offsets"]
        assert (heap.chunk_rows, offsets.chunk_rows) == (512, 128)  # the defaults
        for j in (200, 201, 900):  # 200 and 201 share offsets chunk 1
            before = reader.stats.copy()
            assert reader.read(j) == (0, documents[j])
            spent = reader.stats - before
            first, last = ends[j] // 512, (ends[j + 1] - 1) // 512
            assert spent.bytes_by_key_kind["payload_heap"] == (last - first + 1) * 516
            if j == 201:
                assert spent.by_key_kind == {"payload_heap": 1}
            else:
                assert spent.by_key_kind == {"payload_offsets": 1, "payload_heap": 1}
                assert spent.bytes_by_key_kind["payload_offsets"] == 128 * 8 + 4


def test_the_last_document_of_an_offsets_chunk_reads_its_two_chunks_with_one_request(
    tmp_path: Path,
) -> None:
    storage = DocumentStorage(tmp_path / "docs", RawBytes())
    with storage.sync_writer() as writer:
        for i in range(300):
            writer.append(0, bytes([i % 256]) * 10)
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        assert reader.read(127) == (0, bytes([127]) * 10)  # rows 127 and 128: chunks 0, 1
        spent = reader.stats - before
        assert spent.by_key_kind["payload_offsets"] == 1
        assert spent.bytes_by_key_kind["payload_offsets"] == 2 * (128 * 8 + 4)
        before = reader.stats.copy()
        assert reader.read_many([0, 254]) == [(0, bytes([0]) * 10), (0, bytes([254]) * 10)]
        assert "payload_offsets" not in (reader.stats - before).by_key_kind


@pytest.mark.parametrize("shards", [3, 40])
def test_shuffled_reads_cost_a_request_per_document_and_one_per_offsets_chunk_first_needed(
    tmp_path: Path, shards: int
) -> None:
    rng = np.random.default_rng(shards)
    count = 6000
    sizes = rng.integers(1, 2000, count)
    documents = [bytes([i % 256]) * int(n) for i, n in enumerate(sizes)]
    storage = DocumentStorage(tmp_path / "docs", RawBytes(), block_bytes=1 << 22)
    per_shard = -(-count // shards)
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i // per_shard, document)
    # the model: document j of its shard needs offsets rows j and j + 1 (chunks of 128);
    # a first need of either chunk costs one request (adjacent chunks: one range) of the
    # chunks missing; its bytes are the 516-byte heap chunks its range touches
    seen: set[tuple[int, int]] = set()
    requests = offsets_bytes = heap_bytes = 0
    order = rng.permutation(count).tolist()
    for i in order:
        shard, j = divmod(i, per_shard)
        start = sum(len(d) for d in documents[shard * per_shard : i])
        missing = {(shard, row // 128) for row in (j, j + 1)} - seen
        requests += 1 + (1 if missing else 0)
        offsets_bytes += len(missing) * (128 * 8 + 4)
        seen |= missing
        heap_bytes += ((start + len(documents[i]) - 1) // 512 - start // 512 + 1) * 516
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        for i in order:
            assert reader.read(i) == (i // per_shard, documents[i])
        spent = reader.stats - before
    assert spent.requests == requests
    assert spent.bytes_by_key_kind == {"payload_offsets": offsets_bytes, "payload_heap": heap_bytes}
    assert requests / count < 1.2 and heap_bytes / sum(sizes) < 2


def test_kept_offsets_stay_within_their_budget_and_evicted_ones_are_read_again(
    tmp_path: Path,
) -> None:
    from rangestream.storage.document.offset_chunks import OffsetChunks

    budget = 5 * OffsetChunks(0, 128).slot_nbytes  # room for five chunks of offsets
    storage = DocumentStorage(tmp_path / "docs", RawBytes(), offsets_cache_bytes=budget)
    with storage.sync_writer() as writer:
        for i in range(128 * 20):
            writer.append(0, bytes([i % 256]))
    with storage.sync_reader() as reader:
        for chunk in range(20):
            reader.read(chunk * 128 + 5)
        kept = reader.opened.offsets
        assert len(kept) == 5 and kept.nbytes <= budget
        before = reader.stats.copy()
        reader.read(3 * 128 + 5)  # long evicted
        reader.read(19 * 128 + 6)  # the last one read: kept
        assert (reader.stats - before).by_key_kind == {"payload_offsets": 1, "payload_heap": 2}


def test_offsets_that_decrease_are_reported_not_kept(tmp_path: Path) -> None:
    from rangestream.errors import CorruptDataError
    from rangestream.storage.document.offset_chunks import OffsetChunks

    kept = OffsetChunks(1 << 20, 4)
    kept.put(1, np.asarray([10, 20, 15, 30], dtype=np.int64))  # damaged: not kept
    kept.put(2, np.asarray([0, 1 << 33, 1 << 33, 1 << 33], dtype=np.int64))  # over 4 GiB
    kept.put(3, np.asarray([5, 6, 7], dtype=np.int64))  # the last, short chunk of an array
    assert 1 not in kept and 2 not in kept and kept.value(3, 2) == 7
    storage = DocumentStorage(tmp_path / "docs", RawBytes(), block_bytes=1 << 16)
    with storage.sync_writer() as writer:
        for i in range(10):
            writer.append(0, bytes([i]) * 20)
    raw_root = tmp_path / "docs"
    root = json.loads((raw_root / "zarr.json").read_bytes())["attributes"]["rangestream"]
    key = next((raw_root / root["data_prefix"]).glob("shards/0/payload_offsets/c/0"))
    layout = ArrayLayout.from_json(root["arrays"]["payload_offsets"], "offsets").stored_for(11)
    offsets = np.arange(11, dtype="<i8") * 20
    offsets[4] = 200  # document 3 ends after document 4 starts: a decrease at row 5
    key.write_bytes(encode_block(layout, offsets.view(np.uint8)))
    with storage.sync_reader() as reader, pytest.raises(CorruptDataError, match="document 4"):
        reader.read_many([3, 4])


def test_negative_document_indexes_count_from_the_end_as_in_every_sequence(
    tmp_path: Path,
) -> None:
    from rangestream import DocumentDataset
    from rangestream.errors import OutOfRangeError

    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for number in range(5):
            writer.append(number % 2, {"n": number})
    order = [{"n": n} for n in (0, 2, 4, 1, 3)]  # shard 0, then shard 1
    with storage.sync_reader() as reader, DocumentDataset(storage).sync_reader() as dataset:
        assert reader.read(-1) == dataset[-1] == order[-1]
        assert reader.read_many([-5, -2]) == [order[0], order[3]]
        with pytest.raises(OutOfRangeError, match="document -6 is outside the 5 documents"):
            reader.read(-6)


# -- records: read(i, keys=[...]) reads only the keys' bytes ---------------------------------

WIDE = RecordFormat(
    [
        RecordField("a", np.dtype("u1")),
        RecordField("b", np.dtype("<u2")),
        RecordField("c", np.dtype("u1")),
        RecordField("d", np.dtype("<f4"), ndim=0),
    ]
)
CHUNK = 64  # rows (bytes) of one payload_heap inner chunk; stored with a 4-byte crc32c


def wide_record(i: int) -> dict[str, Any]:
    return {
        "a": np.full(4000, i, dtype="u1"),
        "b": np.arange(10, dtype="<u2") + i,
        "c": np.full(4000, 255 - i, dtype="u1"),
        "d": np.float32(i / 2),
    }


def wide_spans() -> dict[str, tuple[int, int]]:
    """Each field's byte range in a wide record, by docs/format.md's layout rules."""
    spans, position = {}, 8 + 8 * 4  # magic, count, four end offsets
    for name, nbytes in (("a", 8 + 4000), ("b", 8 + 20), ("c", 8 + 4000), ("d", 4)):
        start = (position + 7) & ~7
        spans[name] = (start, start + nbytes)
        position = start + nbytes
    return spans


RECORD_NBYTES = wide_spans()["d"][1]


def heap_bytes(start: int, stop: int) -> int:
    """Stored bytes of the inner chunks holding heap bytes [start, stop) (one block)."""
    return ((stop - 1) // CHUNK + 1 - start // CHUNK) * (CHUNK + 4)


def write_wide(url: str, location: Location, count: int, **options: Any) -> DocumentStorage:
    layout = {"chunk_bytes": CHUNK, "block_bytes": 1 << 20, "coalesce_gap": 0}
    storage = DocumentStorage(
        url, WIDE, storage_options=location.storage_options, **layout, **options
    )
    with storage.sync_writer() as writer:
        for i in range(count):
            writer.append(0, wide_record(i))
    return storage


def test_keys_of_a_large_record_cost_its_header_and_one_range_of_their_bytes(
    location: Location,
) -> None:
    storage = write_wide(location.child("wide"), location, 4, whole_record_bytes=0)
    spans = wide_spans()
    with storage.sync_reader() as reader:
        reader.read(0, keys=["d"])  # the shard's offsets are read and cached
        before = reader.stats.copy()
        got = reader.read(2, keys=["d", "c"])
        spent = reader.stats - before
    assert list(got) == ["d", "c"]
    assert got["d"] == np.float32(1.0)
    np.testing.assert_array_equal(got["c"], np.full(4000, 253, dtype="u1"))
    base = 2 * RECORD_NBYTES
    expected = heap_bytes(base, base + 8 + 8 * 4) + heap_bytes(
        base + spans["c"][0], base + spans["d"][1]
    )
    assert spent.by_key_kind == {"payload_heap": 2}
    assert spent.bytes_by_key_kind == {"payload_heap": expected}
    assert expected < heap_bytes(base, base + RECORD_NBYTES) // 2 + 200


def test_keys_of_many_records_share_two_rounds(location: Location) -> None:
    storage = write_wide(location.child("wide"), location, 6, whole_record_bytes=0)
    with storage.sync_reader() as reader:
        reader.read(0, keys=["b"])
        before = reader.stats.copy()
        got = reader.read_many([5, 1, -3], keys=["b"])
        spent = reader.stats - before
    for record, i in zip(got, [5, 1, 3], strict=True):
        np.testing.assert_array_equal(record["b"], np.arange(10, dtype="<u2") + i)
    spans = wide_spans()
    expected = sum(
        heap_bytes(i * RECORD_NBYTES, i * RECORD_NBYTES + 40)
        + heap_bytes(i * RECORD_NBYTES + spans["b"][0], i * RECORD_NBYTES + spans["b"][1])
        for i in (5, 1, 3)
    )
    assert spent.by_key_kind == {"payload_heap": 6}  # a header and a range per record
    assert spent.bytes_by_key_kind == {"payload_heap": expected}


@pytest.mark.parametrize("keys", [["a", "b", "c", "d"], ["b"]])
def test_a_small_record_or_every_key_is_read_whole_in_one_request(
    tmp_path: Path, keys: list[str]
) -> None:
    location = Location(str(tmp_path), {})
    # every key: read whole whatever its size; one key: whole below whole_record_bytes
    limit = 0 if len(keys) == 4 else RECORD_NBYTES
    storage = write_wide(str(tmp_path / "wide"), location, 3, whole_record_bytes=limit)
    with storage.sync_reader() as reader:
        reader.read(0)
        before = reader.stats.copy()
        got = reader.read(1, keys=keys)
        spent = reader.stats - before
    assert list(got) == keys
    for key in keys:
        np.testing.assert_array_equal(got[key], wide_record(1)[key])
    assert spent.by_key_kind == {"payload_heap": 1}
    assert spent.bytes_by_key_kind == {"payload_heap": heap_bytes(RECORD_NBYTES, 2 * RECORD_NBYTES)}


def test_keys_read_through_the_async_reader_and_a_dataset(location: Location) -> None:
    from rangestream import DocumentDataset

    storage = write_wide(location.child("wide"), location, 3, whole_record_bytes=0)

    async def read() -> list[Any]:
        async with storage.async_reader() as reader:
            return [await reader.read(2, ["b"]), *(await reader.read_many([0], keys=["d"]))]

    got = asyncio.run(read())
    np.testing.assert_array_equal(got[0]["b"], np.arange(10, dtype="<u2") + 2)
    assert got[1] == {"d": np.float32(0)}
    dataset = DocumentDataset(DocumentStorage(location.child("wide"),
                                              storage_options=location.storage_options),
                              keys=["d", "b"])  # fmt: skip
    with dataset.sync_reader() as reader:
        assert [record["d"] for record in reader[0:3]] == [0, 0.5, 1.0]
        assert list(reader[-1]) == ["d", "b"]


def test_unknown_or_malformed_keys_are_refused_before_reading(tmp_path: Path) -> None:
    from rangestream.errors import UnknownFieldError

    storage = write_wide(str(tmp_path / "wide"), Location(str(tmp_path), {}), 1)
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        with pytest.raises(UnknownFieldError, match=r"\['zz'\].*fields are \['a', 'b', 'c', 'd'\]"):
            reader.read(0, keys=["a", "zz"])
        with pytest.raises(TypeError, match="list of field names"):
            reader.read(0, keys="a")
        assert reader.read_many([0, -1], keys=[]) == [{}, {}]  # no keys: nothing read
        with pytest.raises(IndexError):
            reader.read(1, keys=[])
        assert reader.stats - before == IOStats()


def test_keys_of_pickled_mappings_are_selected_after_decoding(tmp_path: Path) -> None:
    from rangestream.errors import UnknownFieldError

    storage = DocumentStorage(tmp_path / "docs", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"x": 1, "y": [2], "z": "three"})
        writer.append(0, ["not", "a", "mapping"])
    with storage.sync_reader() as reader:
        assert reader.read(0, keys=["z", "x"]) == {"z": "three", "x": 1}
        with pytest.raises(UnknownFieldError, match="'w'"):
            reader.read(0, keys=["w"])
        with pytest.raises(TypeError, match="mappings"):
            reader.read(1, keys=["x"])


def test_batches_in_flight_over_s3_keep_every_wanted_request_in_flight(
    s3_url: S3Location, s3_proxy: LatencyProxy
) -> None:
    """64 ``read_many`` of 16 documents want 1,024 heap requests at once: the process cap
    (``io.request_cap``) admits them all and the lean client's pool is no smaller a cap."""
    url = s3_url.child("docs")
    documents = [bytes([i % 251]) * 1000 for i in range(64 * 16 * 2)]
    written = DocumentStorage(url, RawBytes(), storage_options=s3_url.storage_options)
    with written.sync_writer(overwrite=True) as writer:
        for document in documents:
            writer.append(0, document)
    storage = DocumentStorage(url, RawBytes(), storage_options=s3_proxy.storage_options,
                              coalesce_gap=0)  # fmt: skip
    batches = [list(range(b * 2, len(documents), 128)) for b in range(64)]  # no two adjacent
    assert request_cap.process_max_requests() >= 1024  # the default, where descriptors allow

    async def main() -> list[list[Any]]:
        reader = storage.async_reader()
        # opened, and every offset kept: each batch is one round of 16 heap requests
        assert len(await reader.read_many(list(range(len(documents))))) == len(documents)
        s3_proxy.reset_stats()
        s3_proxy.hold()
        tasks = [asyncio.ensure_future(reader.read_many(batch)) for batch in batches]
        while s3_proxy.in_flight < 1024 and not any(task.done() for task in tasks):
            await asyncio.sleep(0.01)
        s3_proxy.release()
        return list(await asyncio.gather(*tasks))

    got = asyncio.run(asyncio.wait_for(main(), 120))
    assert got == [[(0, documents[i]) for i in batch] for batch in batches]
    stats = s3_proxy.stats()
    assert (stats.range_gets, stats.max_in_flight) == (1024, 1024)
