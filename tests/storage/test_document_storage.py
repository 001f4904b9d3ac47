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
from support.s3 import Location

from rangestream import DocumentPickleFormat, DocumentStorage
from rangestream.errors import InvalidRecordError
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.types import DocumentStorageFormat

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
    from rangestream.storage.document import OffsetChunks

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
    from rangestream.storage.document import OffsetChunks

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
