"""``rangestream verify``: a clean dataset passes; each kind of damage is found and named."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream.cli.main import main
from rangestream.layout.block import encode_block
from rangestream.storage.maintenance.verify import verify_dataset

from .datasets import SMALL, RawObjects, tokens_storage, write_documents, write_tokens

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core

STORED_CHUNK = 68  # SMALL layout, 4-byte rows: 16 rows * 4 bytes + crc32c


def verify(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["verify", url, *extra])
    return code, capsys.readouterr().out


@pytest.fixture
def tokens(tmp_path: Path) -> RawObjects:
    write_tokens(str(tmp_path / "tokens"), seed=1, tokens_per_shard=3_000, **SMALL)
    return RawObjects(str(tmp_path / "tokens"))


@pytest.fixture
def documents(tmp_path: Path) -> RawObjects:
    write_documents(str(tmp_path / "docs"), seed=2, count=120, **SMALL)
    return RawObjects(str(tmp_path / "docs"))


def test_a_clean_dataset_passes_with_exit_code_0(
    tokens: RawObjects, documents: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    for raw, kind in ((tokens, "stream"), (documents, "document")):
        code, out = verify(raw.url, capsys)
        assert code == 0, out
        assert "OK" in out and kind in out
    report = verify_dataset(tokens.url)
    # 3 shards of 3000 tokens in blocks of 256: 12 blocks each; record_ends in 1 block each
    assert report.ok and report.blocks == 3 * 12 + 3 * 1
    assert report.chunks >= 3 * 3000 // 16


def test_a_flipped_byte_is_reported_with_its_object_and_byte_range(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tokens.block_key(1, "stream", 4)
    tokens.flip(key, 5 * STORED_CHUNK + 7)
    code, out = verify(tokens.url, capsys)
    assert code == 1
    assert f"{tokens.describe(key)} bytes [{5 * STORED_CHUNK}, {6 * STORED_CHUNK})" in out
    assert "checksum mismatch in inner chunk 5" in out
    assert "1 problem" in out


def test_a_damaged_chunk_index_is_reported(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tokens.block_key(0, "stream", 0)
    tokens.flip(key, len(tokens.get(key)) - 30)
    code, out = verify(tokens.url, capsys)
    assert code == 1 and "chunk index checksum mismatch" in out and tokens.describe(key) in out


def test_a_truncated_object_is_reported_with_its_expected_size(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tokens.block_key(2, "stream", 3)
    size = len(tokens.get(key))
    tokens.truncate(key, 100)
    code, out = verify(tokens.url, capsys)
    assert code == 1
    assert tokens.describe(key) in out
    assert f"object is {size - 100} bytes" in out and f"make {size}" in out


def test_a_missing_object_is_reported(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tokens.block_key(0, "stream", 7)
    tokens.delete(key)
    code, out = verify(tokens.url, capsys)
    assert code == 1 and f"{tokens.describe(key)}: block object is missing" in out


def test_document_offsets_that_decrease_or_leave_the_heap_are_reported(
    documents: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = documents.layout("payload_offsets")
    key = documents.block_key(1, "payload_offsets", 0)
    offsets = np.frombuffer(documents.get(key), dtype="<i8")  # first rows: the offsets
    rows = offsets[:61].copy()  # shard 1 holds 60 documents: 61 offsets
    rows[10], rows[11] = rows[11], rows[10]  # decrease at row 11; checksums stay valid
    documents.put(key, encode_block(layout, rows.view(np.uint8)))
    code, out = verify(documents.url, capsys)
    assert code == 1 and "payload_offsets decrease at row 11" in out
    rows = offsets[:61].copy()
    rows[-1] += 5  # the last document ends past the heap
    documents.put(key, encode_block(layout, rows.view(np.uint8)))
    code, out = verify(documents.url, capsys)
    assert code == 1 and "payload_offsets leave [0, " in out


def test_record_ends_that_do_not_end_at_the_stream_length_are_reported(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tokens.layout("record_ends")
    key = tokens.block_key(2, "record_ends", 0)
    length = tokens.root()["attributes"]["rangestream"]["shards"]["lengths"]["record_ends"][2]
    ends = np.frombuffer(tokens.get(key), dtype="<i8")[:length].copy()
    ends[-1] -= 1
    tokens.put(key, encode_block(layout, ends.view(np.uint8)))
    code, out = verify(tokens.url, capsys)
    assert code == 1 and "record_ends end at 2999, expected 3000" in out


def test_a_manifest_whose_lengths_disagree_with_the_objects_is_reported(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tokens.root()
    root["attributes"]["rangestream"]["shards"]["lengths"]["stream"][0] -= 600
    tokens.put_root(root)
    code, out = verify(tokens.url, capsys)
    assert code == 1
    assert "shape [3000, 4] disagrees with the manifest's length 2400" in out
    assert f"{tokens.describe(tokens.block_key(0, 'stream', 11))}: object lies past" in out
    assert "record_ends leave [0, 2400]" in out
    assert "index/stream_length: values [3000, 3000, 3000] differ" in out


def test_an_absent_dataset_exits_non_zero_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--url", str(tmp_path / "nothing")]) == 2
    assert "no dataset at" in capsys.readouterr().err


def test_a_damaged_dataset_on_s3_is_found_through_the_endpoint_option(
    s3_url: Location, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    options = s3_url.storage_options
    write_tokens(s3_url.url, options, seed=3, tokens_per_shard=2_000, **SMALL)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    endpoint = ["--endpoint-url", options["client_kwargs"]["endpoint_url"]]
    code, out = verify(s3_url.url, capsys, *endpoint)
    assert code == 0, out
    raw = RawObjects(s3_url.url, options)
    key = raw.block_key(1, "stream", 2)
    raw.flip(key, 3)
    code, out = verify(s3_url.url, capsys, *endpoint)
    assert code == 1 and f"{raw.describe(key)} bytes [0, {STORED_CHUNK})" in out


class _Spans:
    """A minimal stream-with-metadata format: int32 tokens, one payload per key run."""

    def __init__(self) -> None:
        self.stream_dtype = np.dtype("<i4")

    def size(self, data: dict[str, Any]) -> int:
        return len(data["tokens"])

    def pack(self, data: dict[str, Any]) -> Any:
        for key in data["keys"]:
            yield key, f"span-{key}".encode()
        return np.asarray(data["tokens"], dtype="<i4")

    def unpack(self, stream: Any, shards: Any, index: Any, payloads: Any) -> Any:
        return stream


def _write_spans(url: str) -> None:
    from rangestream import StreamWithMetaStorage

    storage = StreamWithMetaStorage(url, _Spans(), **SMALL)
    with storage.sync_writer() as writer:
        for record in range(12):
            tokens = np.arange(record * 40, record * 40 + 40, dtype="<i4")
            writer.append(record % 2, {"tokens": tokens, "keys": np.arange(40) // 7})


def _write_tracks(url: str) -> None:
    from rangestream import TemporalArrayStorage

    storage = TemporalArrayStorage(url, field_groups=[["clock", "pose"]])
    with storage.sync_writer() as writer:
        for record in range(6):
            frames = 20 + record
            writer.append(
                record % 2,
                {"clock": np.arange(frames, dtype="<f8"), "pose": np.ones((frames, 3), "<f4")},
            )


def test_clean_stream_with_meta_and_temporal_datasets_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_spans(str(tmp_path / "spans"))
    _write_tracks(str(tmp_path / "tracks"))
    for name in ("spans", "tracks"):
        code, out = verify(str(tmp_path / name), capsys)
        assert code == 0, out


def test_payload_runs_that_decrease_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_spans(str(tmp_path / "spans"))
    spans = RawObjects(str(tmp_path / "spans"))
    layout = spans.layout("runs", shard=0)
    key = spans.block_key(0, "runs", 0)
    length = spans.root()["attributes"]["rangestream"]["shards"]["lengths"]["runs"][0]
    runs = np.frombuffer(spans.get(key), dtype="<i8")[: 2 * length].copy().reshape(-1, 2)
    runs[3, 1], runs[4, 1] = runs[4, 1], runs[3, 1]  # payload ends swap; checksums stay valid
    spans.put(key, encode_block(layout, runs.view(np.uint8)))
    code, out = verify(spans.url, capsys)
    assert code == 1 and "runs[:, 1] decrease at row 4" in out


def test_record_rows_that_do_not_end_at_the_group_length_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_tracks(str(tmp_path / "tracks"))
    tracks = RawObjects(str(tmp_path / "tracks"))
    layout = tracks.layout("record_rows", shard=1)
    key = tracks.block_key(1, "record_rows", 0)
    rows = np.frombuffer(tracks.get(key), dtype="<i8")[:6].reshape(3, 2).copy()  # 3 records
    rows[-1, 1] -= 2
    tracks.put(key, encode_block(layout, rows.view(np.uint8)))
    code, out = verify(tracks.url, capsys)
    assert code == 1
    assert f"record_rows[:, 1] end at {rows[-1, 1]}, expected {rows[-1, 1] + 2}" in out


# -- every bad chunk, bounded memory, hostile layouts, orphans ------------------------------


def test_every_bad_inner_chunk_of_a_block_is_reported_in_runs(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tokens.block_key(1, "stream", 4)
    for chunk in (2, 3, 7):
        tokens.flip(key, chunk * STORED_CHUNK + 5)
    code, out = verify(tokens.url, capsys)
    assert code == 1 and "2 problem(s)" in out
    where = tokens.describe(key)
    assert f"{where} bytes [{2 * STORED_CHUNK}, {4 * STORED_CHUNK}): checksum mismatch in " \
        "inner chunks 2..3" in out  # fmt: skip
    assert f"{where} bytes [{7 * STORED_CHUNK}, {8 * STORED_CHUNK}): checksum mismatch in " \
        "inner chunk 7" in out  # fmt: skip


def test_the_manifest_read_is_bounded_by_the_metadata_cap(
    tokens: RawObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rangestream.storage.maintenance import verify as verify_module

    with open(Path(tokens.url) / "zarr.json", "r+b") as handle:
        handle.truncate(64 << 20)  # sparse: costs no disk
    cap = 1 << 20
    monkeypatch.setattr(verify_module, "MAX_ROOT_BYTES", cap)
    tracemalloc.start()
    try:
        report = verify_dataset(tokens.url)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * cap, f"the root was read whole: {peak:,} bytes at the peak"
    assert not report.ok and "metadata cap" in str(report.problems[0])


def largest_layout(tokens: RawObjects) -> str:
    """The dataset's record_ends relaid as the largest layout the parser accepts.

    Inner chunks of 2**28 int64 rows (2 GiB), blocks of 2**40 rows (4096 chunks), not
    dense, and one block object holding just a valid chunk index.
    """
    from rangestream.layout.block import CRC_NBYTES, crc32c

    root = tokens.root()
    attributes = root["attributes"]["rangestream"]
    attributes["arrays"]["record_ends"].update(
        {"chunk_rows": 1 << 28, "block_rows": 1 << 40, "dense_chunks": False}
    )
    attributes["shards"]["lengths"]["record_ends"] = [1 << 40] * 3
    tokens.put_root(root)
    index = np.full((4096, 2), 2**64 - 1, dtype="<u8")
    index[:3] = [[0, (1 << 31) + CRC_NBYTES]] * 3  # chunks that cannot fit in the object
    body = index.tobytes()
    key = tokens.block_key(0, "record_ends", 0)
    tokens.put(key, body + crc32c(body).to_bytes(CRC_NBYTES, "little"))
    return key


def test_the_largest_layout_the_parser_accepts_ends_in_a_report_with_bounded_work(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    key = largest_layout(tokens)
    tracemalloc.start()
    try:
        started = time.monotonic()
        report = verify_dataset(tokens.url)
        seconds = time.monotonic() - started
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20 and seconds < 60
    text = "\n".join(report.lines())
    assert f"{tokens.describe(key)}: chunk index entry 0..2 is (offset 0, {(1 << 31) + 4}" in text
    assert f"{tokens.describe(key)}: inner chunks 3..4095 missing from the chunk index" in text
    assert main(["verify", tokens.url]) == 1  # a report, not a traceback
    assert "DAMAGED" in capsys.readouterr().out


@pytest.mark.parametrize("chunk_bytes", [256, 4096], ids=["chunks-in-pieces", "chunk-by-pieces"])
def test_blocks_larger_than_a_piece_are_checked_piece_by_piece(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    chunk_bytes: int,
) -> None:
    from rangestream.storage.maintenance import verify_blocks

    layout = {"chunk_bytes": chunk_bytes, "block_bytes": 64 << 10}
    write_tokens(str(tmp_path / "ds"), seed=4, tokens_per_shard=40_000, **layout)
    raw = RawObjects(str(tmp_path / "ds"))
    monkeypatch.setattr(verify_blocks, "PIECE_BYTES", 1024)
    code, out = verify(raw.url, capsys)
    assert code == 0, out
    stored = chunk_bytes + 4
    key = raw.block_key(1, "stream", 2)
    raw.flip(key, 3 * stored + 1)
    ends_layout = raw.layout("record_ends", shard=0)
    ends_key = raw.block_key(0, "record_ends", 0)
    length = raw.attributes()["shards"]["lengths"]["record_ends"][0]
    ends = np.frombuffer(raw.get(ends_key), dtype="<i8")[:length].copy()
    ends[5], ends[6] = ends[6], ends[5]  # a decrease, checksums valid
    raw.put(ends_key, encode_block(ends_layout, ends.view(np.uint8)))
    code, out = verify(raw.url, capsys)
    assert code == 1 and "2 problem(s)" in out
    assert f"{raw.describe(key)} bytes [{3 * stored}, {4 * stored}): checksum mismatch" in out
    assert "record_ends decrease at row 6" in out


def test_orphaned_versions_are_reported_with_their_size_without_failing_the_check(
    tokens: RawObjects, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tokens_storage(tokens.url).parallel_write(overwrite=True)
    with session.sync_writer() as writer:  # written, never committed
        writer.append(0, {"tokens": np.arange(5000, dtype="<i4")})
    files = (Path(tokens.url) / session.prefix).rglob("*")
    size = sum(path.stat().st_size for path in files if path.is_file())
    code, out = verify(tokens.url, capsys)
    assert code == 0, out
    assert f"orphans   1 version(s) not part of the dataset, {size:,} bytes" in out
    assert f"{session.prefix}: {size:,} bytes" in out
