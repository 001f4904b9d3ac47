"""StreamWithMetaStorage: the reference example, reads against an independent ground truth,
the request contract, and refusal of records that break the packing contract."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.s3 import Location

from rangestream import StreamDataset, StreamStorage, StreamWithMetaStorage
from rangestream.errors import InvalidRecordError, SchemaMismatchError
from rangestream.formats import StreamNumpyFormat
from rangestream.types import StreamWithMetaStorageFormat

# The reference's whole example, verbatim but for its two import lines (the package name).
REFERENCE_EXAMPLE = """
import struct
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

from rangestream import StreamDataset, StreamWithMetaStorage
from rangestream.types import StreamWithMetaStorageFormat


class ConceptFormat(StreamWithMetaStorageFormat[dict, dict, np.int32]):
    prefix = struct.Struct("<II")
    concept_dtype = np.dtype("<i4")

    def __init__(self):
        super().__init__(np.dtype("<i4"))

    def size(self, data):
        return len(data["tokens"])

    def pack(self, data):
        tokens = np.asarray(data["tokens"], dtype=self.stream_dtype)
        assert len(data["chunk_ids"]) == len(tokens)
        for chunk_id in data["chunk_ids"]:
            payload = self.prefix.pack(data["document_id"], chunk_id)
            payload += np.asarray(data["concepts"][chunk_id], dtype=self.concept_dtype).tobytes()
            yield ((data["document_id"], chunk_id), payload)
        return tokens

    def unpack(self, stream_data, document_shard, document_index, document_data):
        annotations = []
        for shard, payload in zip(document_shard, document_data, strict=True):
            document_id, chunk_id = self.prefix.unpack_from(payload)
            annotations.append(
                {
                    "shard": int(shard),
                    "document_id": document_id,
                    "chunk_id": chunk_id,
                    "concepts": np.frombuffer(payload, dtype=self.concept_dtype, offset=self.prefix.size),
                }
            )
        return {"tokens": stream_data, "annotation_index": document_index, "annotations": annotations}


with TemporaryDirectory() as directory:
    storage = StreamWithMetaStorage(Path(directory), ConceptFormat())
    with storage.sync_writer() as writer:
        writer.append(
            0,
            {
                "document_id": 7,
                "tokens": [10, 11, 12],
                "chunk_ids": [0, 0, 1],
                "concepts": [[100, 101], [102]],
            },
        )
        writer.append(
            1,
            {
                "document_id": 8,
                "tokens": [13, 14, 15, 16, 17],
                "chunk_ids": [0, 0, 0, 0, 0],
                "concepts": [[200, 201, 202]],
            },
        )

    with StreamDataset(storage, sequence_length=4).sync_reader() as reader:
        sample = reader[0]
        assert sample["tokens"].tolist() == [10, 11, 12, 13]
        per_token = [sample["annotations"][i] for i in sample["annotation_index"]]
        assert [a["document_id"] for a in per_token] == [7, 7, 7, 8]
        assert per_token[-1]["shard"] == 1
        assert per_token[-1]["concepts"].tolist() == [200, 201, 202]
"""  # noqa: E501

REFERENCE_STORAGE_LINE = "storage = StreamWithMetaStorage(Path(directory), ConceptFormat())"


def test_the_reference_example_runs_on_a_local_folder() -> None:
    namespace: dict[str, Any] = {"__name__": "reference_example"}
    exec(compile(REFERENCE_EXAMPLE, "reference_example", "exec"), namespace)
    assert namespace["sample"]["tokens"].tolist() == [10, 11, 12, 13]


def test_the_reference_example_runs_on_s3(s3_url: Location) -> None:
    # The only further change: the storage line points at S3 instead of the temporary folder.
    assert REFERENCE_EXAMPLE.count(REFERENCE_STORAGE_LINE) == 1
    on_s3 = REFERENCE_EXAMPLE.replace(
        REFERENCE_STORAGE_LINE,
        "storage = StreamWithMetaStorage(S3_URL, ConceptFormat(), storage_options=S3_OPTIONS)",
    )
    namespace: dict[str, Any] = {
        "__name__": "reference_example",
        "S3_URL": s3_url.url,
        "S3_OPTIONS": s3_url.storage_options,
    }
    exec(compile(on_s3, "reference_example_s3", "exec"), namespace)
    assert namespace["storage"].url.startswith("s3://")
    assert namespace["sample"]["tokens"].tolist() == [10, 11, 12, 13]


class RunFormat(StreamWithMetaStorageFormat[dict, dict, np.int32]):
    """Records are ``{"tokens", "keys", "payloads"}`` lists with one entry per element.

    ``payloads[i]`` is what ``pack`` yields for element ``i`` (bytes, None or anything a
    test wants to be refused). Optional entries break the contract on purpose: ``size``
    overrides ``size(data)``, ``returned`` replaces the returned array, ``yield_array``
    yields the array after the pairs (returning None), ``not_a_generator`` makes ``pack``
    return the array directly. ``unpack`` hands back what storage gave it.
    """

    def __init__(self) -> None:
        super().__init__(np.dtype("<i4"))

    def size(self, data: dict) -> int:
        return data.get("size", len(data["tokens"]))

    def pack(self, data: dict) -> Any:
        if data.get("not_a_generator"):
            return np.asarray(data["tokens"], dtype=self.stream_dtype)
        return self._pairs(data)

    def _pairs(self, data: dict) -> Any:
        tokens = np.asarray(data["tokens"], dtype=self.stream_dtype)
        yield from zip(data["keys"], data["payloads"], strict=True)
        if data.get("yield_array"):
            yield tokens
            return None
        return data.get("returned", tokens)

    def unpack(
        self,
        stream_data: np.ndarray,
        document_shard: np.ndarray,
        document_index: np.ndarray,
        document_data: Any,
    ) -> dict:
        return {
            "tokens": stream_data,
            "document_shard": document_shard,
            "document_index": document_index,
            "document_data": list(document_data),
        }


def make_record(
    rng: np.random.Generator, max_runs: int, max_run: int, max_payload: int, omit_repeats: bool
) -> dict:
    """A record of random runs: each run has its own key and a random payload (maybe empty)."""
    tokens, keys, payloads = [], [], []
    for run in range(int(rng.integers(1, max_runs + 1))):
        payload = rng.integers(0, 256, int(rng.integers(0, max_payload + 1)), np.uint8).tobytes()
        key = ("chunk", int(rng.integers(0, 1000)), run)  # any hashable key
        for position in range(int(rng.integers(1, max_run + 1))):
            tokens.append(int(rng.integers(0, 2**31 - 1)))
            keys.append(key)
            payloads.append(None if omit_repeats and position else payload)
    return {"tokens": tokens, "keys": keys, "payloads": payloads}


class GroundTruth:
    """Per element, built from the records alone: token, payload bytes, shard and run number.

    Elements are in global order (shard by shard, each shard's records in append order).
    Runs are numbered consecutively in that order; a run never spans two records.
    """

    def __init__(self, records: dict[int, list[dict]]) -> None:
        tokens: list[int] = []
        payloads: list[bytes] = []
        shards: list[int] = []
        runs: list[int] = []
        run = -1
        for shard in sorted(records):
            for record in records[shard]:
                previous: Any = object()
                current = b""
                for token, key, payload in zip(
                    record["tokens"], record["keys"], record["payloads"], strict=True
                ):
                    if key != previous:
                        run += 1
                        previous = key
                        current = bytes(payload)
                    tokens.append(token)
                    payloads.append(current)
                    shards.append(shard)
                    runs.append(run)
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.payloads = payloads
        self.shards = np.asarray(shards, dtype=np.int64)
        self.runs = np.asarray(runs, dtype=np.int64)

    def check(self, window: dict, start: int, length: int) -> None:
        stop = start + length
        np.testing.assert_array_equal(window["tokens"], self.tokens[start:stop])
        index = window["document_index"]
        assert index.dtype == np.int32
        assert window["document_shard"].dtype == np.int64
        assert len(index) == length
        data = window["document_data"]
        assert [bytes(data[i]) for i in index] == self.payloads[start:stop]
        np.testing.assert_array_equal(window["document_shard"][index], self.shards[start:stop])
        # Exactly the runs the window touches, numbered in order of first appearance.
        if length:
            np.testing.assert_array_equal(index, self.runs[start:stop] - self.runs[start])
            assert len(data) == self.runs[stop - 1] - self.runs[start] + 1
        else:
            assert data == [] and len(window["document_shard"]) == 0


def write_records(
    storage: StreamWithMetaStorage, records: dict[int, list[dict]], seed: int
) -> None:
    order = np.random.default_rng(seed).permutation(
        np.concatenate([np.full(len(r), s) for s, r in records.items()])
    )
    cursors = dict.fromkeys(records, 0)
    with storage.sync_writer(overwrite=True) as writer:
        for shard in order.tolist():  # shards interleaved, each keeping its record order
            writer.append(shard, records[shard][cursors[shard]])
            cursors[shard] += 1


SMALL = {"chunk_bytes": 16, "block_bytes": 128}  # many chunks and blocks from little data


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.integers(1, 4),
    records=st.integers(1, 4),
    max_runs=st.integers(1, 12),
    max_run=st.integers(1, 30),
    max_payload=st.integers(0, 40),
    omit_repeats=st.booleans(),
    small_cache=st.booleans(),
    dense=st.booleans(),
    windows=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6),
)
def test_any_window_returns_its_elements_with_exactly_the_payloads_and_shards_they_reference(
    location: Location,
    seed: int,
    shards: int,
    records: int,
    max_runs: int,
    max_run: int,
    max_payload: int,
    omit_repeats: bool,
    small_cache: bool,
    dense: bool,
    windows: list[tuple[float, float]],
) -> None:
    rng = np.random.default_rng(seed)
    data = {
        shard: [
            make_record(rng, max_runs, max_run, max_payload, omit_repeats) for _ in range(records)
        ]
        for shard in range(shards)
    }
    truth = GroundTruth(data)
    total = len(truth.tokens)
    cache = {"run_cache_bytes": 0, "run_index_cache_bytes": 0} if small_cache else {}
    storage = StreamWithMetaStorage(
        location.child(f"prop-{seed}-{shards}-{records}"),
        RunFormat(),
        storage_options=location.storage_options,
        dense_chunks=dense,  # False: readers fetch and cache block chunk indexes
        **SMALL,
        **cache,
    )
    write_records(storage, data, seed)
    spans = []
    for fraction, length_fraction in windows:
        length = int(length_fraction * total)
        spans.append((int(fraction * (total - length)), length))
    with storage.sync_reader() as reader:
        assert reader.total_length == total
        assert [reader.length(s) for s in range(shards)] == [
            int((truth.shards == s).sum()) for s in range(shards)
        ]
        assert [reader.num_records(s) for s in range(shards)] == [records] * shards
        for start, length in spans:  # one by one: caches warm up and get evicted
            truth.check(reader.read(start, length), start, length)
        for (start, length), window in zip(spans, reader.read_many(spans), strict=True):
            truth.check(window, start, length)


def test_windows_inside_runs_crossing_records_and_shards_and_their_async_reads(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(7)
    data = {
        shard: [make_record(rng, 6, 40, 30, shard % 2 == 0) for _ in range(5)] for shard in (0, 2)
    }  # shard 1 is never written: it has length 0
    truth = GroundTruth(data)
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat(), **SMALL)
    write_records(storage, data, 3)
    total = len(truth.tokens)
    boundary = int((truth.shards == 0).sum())
    # Positions p where elements p - 1 and p share a run: a window edge there is inside it.
    inside = np.flatnonzero(truth.runs[1:] == truth.runs[:-1]) + 1
    before, after = inside[inside < boundary], inside[inside > boundary]
    run_starts = np.flatnonzero(np.diff(truth.runs)) + 1
    one_run = inside[np.isin(inside + 1, inside)][2]  # p and p + 1 both inside one run
    spans = [
        (int(before[-2]), int(after[1] - before[-2])),  # crosses the shard boundary
        (int(one_run), 1),  # inside one run
        (int(run_starts[4] - 1), 2),  # the last element of a run and the first of the next
        (0, total),  # everything
        (total, 0),  # empty, at the end
    ]
    assert truth.shards[spans[0][0]] == 0 and truth.shards[sum(spans[0]) - 1] == 2
    with storage.sync_reader() as reader:
        assert reader.num_shards == 3 and reader.length(1) == 0
        for start, length in spans:
            truth.check(reader.read(start, length), start, length)

    async def read_async() -> list[dict]:
        async with storage.async_reader() as reader:
            return await reader.read_many(spans, max_concurrency=4)

    for (start, length), window in zip(spans, asyncio.run(read_async()), strict=True):
        truth.check(window, start, length)


def test_stream_dataset_sync_and_async_readers_serve_the_same_windows(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    data = {shard: [make_record(rng, 5, 20, 16, True) for _ in range(4)] for shard in range(3)}
    truth = GroundTruth(data)
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat(), **SMALL)
    write_records(storage, data, 5)
    dataset = StreamDataset(storage, 17)
    with dataset.sync_reader() as reader:
        count = len(reader)
        assert count == len(truth.tokens) // 17
        windows = reader[0:count]
    for i, window in enumerate(windows):
        truth.check(window, i * 17, 17)

    async def read_async() -> list[dict]:
        async with dataset.async_reader() as reader:
            return await reader.read_many(list(range(count)), max_concurrency=3)

    for i, window in enumerate(asyncio.run(read_async())):
        truth.check(window, i * 17, 17)


# -- the request contract ---------------------------------------------------------------------

RUN = 10  # elements per run in the contract dataset
RECORD_RUNS = 100  # runs per record


def contract_records(shard: int, records: int) -> list[dict]:
    """Records of fixed 10-element runs with payloads of 20..59 bytes."""
    rng = np.random.default_rng(shard)
    out = []
    for record in range(records):
        tokens, keys, payloads = [], [], []
        for run in range(RECORD_RUNS):
            payload = rng.integers(0, 256, int(rng.integers(20, 60)), np.uint8).tobytes()
            for position in range(RUN):
                tokens.append(record * 10_000 + run * RUN + position)
                keys.append(run)
                payloads.append(payload if position == 0 else None)
        out.append({"tokens": tokens, "keys": keys, "payloads": payloads})
    return out


def read_counting_rounds(reader: Any, start: int, length: int) -> tuple[Any, Any, int]:
    """Read one window; return it, the requests it cost and its rounds of requests.

    A round is one batch of requests the read program issues together (one latency on an
    object store); the program is wrapped to count the batches it yields.
    """
    rounds = 0

    def counted(program: Any) -> Any:
        nonlocal rounds
        try:
            requests = next(program)
            while True:
                rounds += 1
                requests = program.send((yield requests))
        except StopIteration as stop:
            return stop.value

    before = reader.stats.copy()
    window = reader.opened.run_sync(counted(reader.opened.read(start, length)))
    return window, reader.stats - before, rounds


def test_a_window_inside_one_shard_costs_one_stream_and_one_heap_request_once_warm(
    location: Location,
) -> None:
    # Defaults: 1 KiB inner chunks, 4 MiB blocks, so every array of a shard is one block;
    # a runs inner chunk holds 256 runs = 2560 elements here.
    data = {0: contract_records(0, 150), 1: contract_records(1, 10)}  # 150_000 + 10_000
    truth = GroundTruth(data)
    sizes = np.asarray([len(p) for p in truth.payloads])
    storage = StreamWithMetaStorage(
        location.child("contract"), RunFormat(), storage_options=location.storage_options
    )
    write_records(storage, data, 0)
    stream_chunk = 1024 // 4  # int32 elements per stream inner chunk
    stored_chunk = 1024 + 4  # an inner chunk and its crc32c
    with storage.sync_reader() as reader:
        assert reader.stats.by_key_kind == {"zarr.json": 1}

        def read(start: int, length: int) -> tuple[dict[str, int], int]:
            window, spent, rounds = read_counting_rounds(reader, start, length)
            truth.check(window, start, length)
            assert spent.requests == sum(spent.by_key_kind.values())
            return spent.by_key_kind, rounds

        # Cold shard: its coarse run index (once), then stream + runs, then heap.
        assert read(1_000, 256) == (
            {"run_index": 1, "stream": 1, "runs": 1, "payload_heap": 1},
            3,
        )
        # Warm shard, runs chunk not cached yet: stream + runs, then heap.
        assert read(100_005, 256) == ({"stream": 1, "runs": 1, "payload_heap": 1}, 2)
        # Warm: the runs chunk is cached: one stream and one heap request, in one round.
        start, length = 100_301, 1_000  # starts and ends inside runs (runs are 10 long)
        window, spent, rounds = read_counting_rounds(reader, start, length)
        truth.check(window, start, length)
        assert (spent.by_key_kind, spent.requests, rounds) == (
            {"stream": 1, "payload_heap": 1},
            2,
            1,
        )
        first, last = start // stream_chunk, (start + length - 1) // stream_chunk
        stream_bytes = (last - first + 1) * stored_chunk
        heap_bytes = spent.bytes - stream_bytes
        runs = np.unique(truth.runs[start : start + length])
        referenced = int(sizes[np.searchsorted(truth.runs, runs)].sum())
        assert referenced <= heap_bytes <= 1.1 * referenced + 2 * stored_chunk
        # Across the shard boundary: per shard, one stream and one heap request (shard 1's
        # coarse index and both runs chunks are cold the first time).
        boundary = 150_000
        assert read(boundary - 50, 100) == (
            {"run_index": 1, "runs": 2, "stream": 2, "payload_heap": 2},
            3,
        )
        assert read(boundary - 40, 100) == ({"stream": 2, "payload_heap": 2}, 1)
        # The public read path costs the same as the counted one.
        before = reader.stats.copy()
        truth.check(reader.read(100_700, 300), 100_700, 300)
        assert (reader.stats - before).by_key_kind == {"stream": 1, "payload_heap": 1}


def test_a_window_whose_runs_have_empty_payloads_fetches_no_heap_bytes(tmp_path: Path) -> None:
    record = {"tokens": list(range(40)), "keys": [i // 10 for i in range(40)],
              "payloads": [b"" if i % 10 == 0 else None for i in range(40)]}  # fmt: skip
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat())
    write_records(storage, {0: [record]}, 0)
    with storage.sync_reader() as reader:
        before = reader.stats.copy()
        window = reader.read(5, 30)
        assert (reader.stats - before).by_key_kind == {"run_index": 1, "stream": 1, "runs": 1}
    assert window["document_data"] == [b"", b"", b"", b""]
    assert window["document_index"].tolist() == [0] * 5 + [1] * 10 + [2] * 10 + [3] * 5


# -- on-store format ----------------------------------------------------------------------------


def test_every_stored_array_is_a_zarr_v3_array_holding_runs_not_elements(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    data = {0: [make_record(rng, 8, 9, 12, False) for _ in range(3)]}
    truth = GroundTruth(data)
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat(), chunk_bytes=16)
    write_records(storage, data, 0)
    with storage.sync_reader() as reader:
        prefix = reader.opened.manifest.array_key(0, "")
    root = zarr.open_group(str(tmp_path / "meta" / prefix), mode="r")
    starts = np.flatnonzero(np.r_[True, np.diff(truth.runs) != 0])
    ends = np.r_[starts[1:], len(truth.runs)]
    heap = b"".join(truth.payloads[i] for i in starts)
    np.testing.assert_array_equal(root["stream"][:], truth.tokens)
    runs = root["runs"][:]
    assert runs.shape == (len(starts) + 1, 2)  # one row per run, not one per element
    np.testing.assert_array_equal(runs[1:, 0], ends)
    np.testing.assert_array_equal(runs[1:, 1], np.cumsum([len(truth.payloads[i]) for i in starts]))
    assert root["payload_heap"][:].tobytes() == heap
    stride = root["run_index"].attrs["rangestream_runs_row_stride"]
    assert stride == 4  # 4 x 16-byte chunks hold 4 rows of two int64
    np.testing.assert_array_equal(root["run_index"][:], runs[::stride])
    np.testing.assert_array_equal(
        root["record_ends"][:], np.cumsum([len(r["tokens"]) for r in data[0]])
    )


def test_a_format_with_another_dtype_or_a_plain_stream_dataset_is_refused(tmp_path: Path) -> None:
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat())
    write_records(storage, {0: [make_record(np.random.default_rng(0), 2, 2, 2, False)]}, 0)

    class Wide(RunFormat):
        def __init__(self) -> None:
            StreamWithMetaStorageFormat.__init__(self, np.dtype("<i8"))

    with pytest.raises(SchemaMismatchError, match="stream_dtype"):
        StreamWithMetaStorage(tmp_path / "meta", Wide()).sync_reader().__enter__()
    plain = StreamStorage(tmp_path / "plain", StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with plain.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(3, dtype="<i4")})
    with pytest.raises(SchemaMismatchError, match="stream"):
        StreamWithMetaStorage(tmp_path / "plain", RunFormat()).sync_reader().__enter__()


def test_reading_past_the_end_raises_index_error(tmp_path: Path) -> None:
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat())
    write_records(storage, {0: [make_record(np.random.default_rng(0), 2, 3, 2, False)]}, 0)
    with storage.sync_reader() as reader, pytest.raises(IndexError, match="outside"):
        reader.read(reader.total_length - 1, 2)


# -- bad input ----------------------------------------------------------------------------------


def good(first: int) -> dict:
    """A valid record of three runs whose tokens start at ``first``."""
    return {
        "tokens": list(range(first, first + 5)),
        "keys": ["a", "a", "b", "c", "c"],
        "payloads": [b"A" * 3, None, b"B", b"C" * 7, b"C" * 7],
    }


BAD_TOKENS = [9001, 9002, 9003]
BAD_RECORDS = {
    "non_contiguous_keys": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 0], "payloads": [b"x", b"y", b"x"]},
        "reappears",
    ),
    "run_without_payload": (
        {"tokens": BAD_TOKENS, "keys": [0, 0, 1], "payloads": [b"x", None, None]},
        "has no payload",
    ),
    "first_element_without_payload": (
        {"tokens": BAD_TOKENS, "keys": [0, 0, 0], "payloads": [None, b"x", None]},
        "has no payload",
    ),
    "payload_of_wrong_type": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 2], "payloads": [b"x", "text", b"z"]},
        "must be bytes.*got str",
    ),
    "payload_array_of_ints": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 2], "payloads": [b"x", b"y", [1, 2]]},
        "got list",
    ),
    "fewer_pairs_than_size": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 2], "payloads": [b"x", b"y", b"z"], "size": 4},
        "yielded 3 .* size\\(data\\) is 4",
    ),
    "more_pairs_than_size": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 2], "payloads": [b"x", b"y", b"z"], "size": 2},
        "more than size",
    ),
    "returned_array_too_long": (
        {
            "tokens": BAD_TOKENS,
            "keys": [0, 1, 2],
            "payloads": [b"x", b"y", b"z"],
            "returned": np.arange(4, dtype="<i4"),
        },
        "returned 4 stream elements",
    ),
    "returned_array_of_wrong_dtype": (
        {
            "tokens": BAD_TOKENS,
            "keys": [0, 1, 2],
            "payloads": [b"x", b"y", b"z"],
            "returned": np.arange(3, dtype="<i8"),
        },
        "dtype int64",
    ),
    "returned_a_list": (
        {
            "tokens": BAD_TOKENS,
            "keys": [0, 1, 2],
            "payloads": [b"x", b"y", b"z"],
            "returned": [1, 2, 3],
        },
        "numpy array",
    ),
    "yields_the_array_instead_of_returning_it": (
        {
            "tokens": BAD_TOKENS,
            "keys": [0, 1, 2],
            "payloads": [b"x", b"y", b"z"],
            "yield_array": True,
        },
        "do not yield it",
    ),
    "not_a_generator": (
        {
            "tokens": BAD_TOKENS,
            "keys": [0, 1, 2],
            "payloads": [b"x", b"y", b"z"],
            "not_a_generator": True,
        },
        "must be a generator",
    ),
    "different_payload_inside_a_run": (
        {"tokens": BAD_TOKENS, "keys": [0, 0, 1], "payloads": [b"x", b"q", b"z"]},
        "differs",
    ),
    "negative_size": (
        {"tokens": BAD_TOKENS, "keys": [0, 1, 2], "payloads": [b"x", b"y", b"z"], "size": -1},
        "non-negative int",
    ),
    "unhashable_key": (
        {"tokens": BAD_TOKENS, "keys": [[0], [0], [1]], "payloads": [b"x", None, b"z"]},
        "not hashable",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_is_refused_writes_nothing_and_leaves_the_writer_usable(
    tmp_path: Path, case: str
) -> None:
    bad, message = BAD_RECORDS[case]
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat(), **SMALL)
    with storage.sync_writer() as writer:
        with pytest.raises(InvalidRecordError, match=message):
            writer.append(1, bad)  # the first record of a shard: the shard is not created
        writer.append(0, good(0))
        with pytest.raises(InvalidRecordError, match=message):
            writer.append(0, bad)  # after a good record: the shard keeps only the good one
        writer.append(0, good(100))
    expected = GroundTruth({0: [good(0), good(100)]})
    with storage.sync_reader() as reader:
        assert reader.num_shards == 1 and reader.length(1) == 0
        assert reader.num_records(0) == 2
        assert reader.total_length == len(expected.tokens)
        window = reader.read(0, reader.total_length)
    expected.check(window, 0, len(expected.tokens))
    assert not set(BAD_TOKENS) & set(window["tokens"].tolist())


def test_an_empty_record_adds_a_record_but_no_elements_or_runs(tmp_path: Path) -> None:
    empty = {"tokens": [], "keys": [], "payloads": []}
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat(), **SMALL)
    write_records(storage, {0: [good(0), empty, good(100)]}, 0)
    expected = GroundTruth({0: [good(0), good(100)]})
    with storage.sync_reader() as reader:
        assert reader.num_records(0) == 3
        assert reader.opened.shard_length("runs", 0) == 1 + 3 + 3  # the leading row + runs
        expected.check(reader.read(0, 10), 0, 10)


def test_an_error_raised_inside_pack_propagates_and_writes_nothing(tmp_path: Path) -> None:
    class Failing(RunFormat):
        def _pairs(self, data: dict) -> Any:
            yield 0, b"x"
            raise KeyError("missing field")

    storage = StreamWithMetaStorage(tmp_path / "meta", Failing(), **SMALL)
    with storage.sync_writer() as writer, pytest.raises(KeyError, match="missing field"):
        writer.append(0, good(0))
    with storage.sync_reader() as reader:
        assert reader.num_shards == 0 and reader.total_length == 0


# -- self-describing: a format that has a schema() and a registered factory ------------------


class DescribedRunFormat(RunFormat):
    def schema(self) -> dict[str, Any]:
        return {"format": "test-described-runs", "version": 1}


def _described_runs(value: dict[str, Any], dtype: Any, where: str) -> DescribedRunFormat:
    return DescribedRunFormat()


def test_a_registered_self_describing_format_reads_back_without_the_format_object(
    location: Location,
) -> None:
    from rangestream.formats import register_format

    register_format("test-described-runs", _described_runs, replace=True)
    rng = np.random.default_rng(11)
    records = {s: [make_record(rng, 4, 5, 20, True) for _ in range(3)] for s in range(2)}
    url = location.child("meta")
    writer_storage = StreamWithMetaStorage(url, DescribedRunFormat(),
                                           storage_options=location.storage_options)  # fmt: skip
    with writer_storage.sync_writer() as writer:
        for shard, recs in records.items():
            for record in recs:
                writer.append(shard, record)
    truth = GroundTruth(records)
    storage = StreamWithMetaStorage(url, storage_options=location.storage_options)
    with storage.sync_reader() as reader:
        assert isinstance(reader.format, DescribedRunFormat)
        window = reader.read(1, len(truth.tokens) - 2)
    np.testing.assert_array_equal(window["tokens"], truth.tokens[1:-1])


def test_a_meta_format_without_a_schema_must_be_passed_to_read(tmp_path: Path) -> None:
    with StreamWithMetaStorage(tmp_path / "ds", RunFormat()).sync_writer() as writer:
        writer.append(0, {"tokens": [1, 2], "keys": [0, 0], "payloads": [b"x", None]})
    with pytest.raises(SchemaMismatchError, match="does not record its format"):
        StreamWithMetaStorage(tmp_path / "ds").sync_reader().__enter__()


def test_read_record_returns_a_records_elements_and_exactly_its_payloads(
    location: Location,
) -> None:
    rng = np.random.default_rng(21)
    records = {s: [make_record(rng, 4, 5, 20, True) for _ in range(3)] for s in (0, 2)}
    url = location.child("meta")
    storage = StreamWithMetaStorage(url, RunFormat(), storage_options=location.storage_options)
    with storage.sync_writer() as writer:
        for shard, recs in records.items():
            for record in recs:
                writer.append(shard, record)
    in_order = [r for shard in sorted(records) for r in records[shard]]
    with storage.sync_reader() as reader:
        for i in (0, 4, -1):
            got = reader.read_record(i)
            record = in_order[i]
            assert got["tokens"].tolist() == record["tokens"]
            runs = [p for p in record["payloads"] if p is not None]
            assert got["document_data"] == runs
            shard = 0 if i % len(in_order) < 3 else 2
            assert got["document_shard"].tolist() == [shard] * len(runs)


def test_windows_with_boundaries_carry_their_payloads_too(tmp_path: Path) -> None:
    storage = StreamWithMetaStorage(tmp_path / "meta", RunFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": [1, 2, 3], "keys": [0, 0, 1], "payloads": [b"a", None, b"b"]})
        writer.append(0, {"tokens": [4, 5], "keys": [2, 2], "payloads": [b"c", None]})
    with StreamDataset(storage, 4, stride=1, boundaries=True).sync_reader() as reader:
        window = reader[1]  # elements 1..4: the end of record 0, then record 1
    assert window["tokens"].tolist() == [2, 3, 4, 5]
    assert window["document_data"] == [b"a", b"b", b"c"]
    assert window["cu_seqlens"].tolist() == [0, 2, 4]
    assert window["position_ids"].tolist() == [1, 2, 0, 1]
