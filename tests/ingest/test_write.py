"""write(fn, inputs, url, kind=...): every storage kind, in input order, resumable."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

import rangestream
from rangestream import (
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    StreamWithMetaStorage,
    TemporalArrayStorage,
)
from rangestream.errors import BucketNotFoundError, DatasetExistsError, ResumeError
from rangestream.formats.records import RecordFormat
from rangestream.types import StreamWithMetaStorageFormat

TOKENS = StreamNumpyFormat(np.dtype([("tokens", "<i4"), ("loss_mask", "u1")]))


def tokens_of(index: int) -> dict[str, np.ndarray]:
    n = 3 + index % 5
    return {"tokens": np.arange(n, dtype="<i4") + 100 * index, "loss_mask": np.ones(n, "u1")}


def two_records(index: int) -> Iterator[dict[str, np.ndarray]]:
    yield tokens_of(index)
    yield tokens_of(index + 1000)


class SpanFormat(StreamWithMetaStorageFormat[dict, dict, np.int32]):
    """Each record's elements reference one payload: the record's index as bytes."""

    def __init__(self) -> None:
        super().__init__(np.dtype("<i4"))

    def size(self, data: dict) -> int:
        return len(data["tokens"])

    def pack(self, data: dict) -> Any:
        payload = str(data["index"]).encode()
        for _ in range(len(data["tokens"])):
            yield data["index"], payload
        return np.asarray(data["tokens"], dtype="<i4")

    def unpack(
        self, stream_data: Any, document_shard: Any, document_index: Any, document_data: Any
    ) -> dict:
        return {
            "tokens": stream_data,
            "owner": [int(bytes(document_data[i])) for i in document_index],
        }


def span_record(index: int) -> dict[str, Any]:
    return {"tokens": np.arange(2 + index % 3, dtype="<i4") + index * 10, "index": index}


def document_of(index: int) -> dict[str, Any]:
    return {"ids": np.arange(index % 4, dtype=np.int64), "score": float(index) / 4, "tag": index}


def temporal_of(index: int) -> dict[str, np.ndarray]:
    frames = 2 + index % 3
    return {
        "pose": np.full((frames, 3), index, np.float32),
        "t": np.arange(frames, dtype=np.float64),
    }


def test_a_stream_is_written_in_input_order(location: Location) -> None:
    summary = rangestream.write(
        tokens_of, range(20), location.url, kind="stream", storage_format=TOKENS,
        items_per_split=3, workers=2, storage_options=location.storage_options, progress=False,
    )  # fmt: skip
    assert (summary.records, summary.shards, summary.splits) == (20, 7, 7)
    want = np.concatenate([tokens_of(i)["tokens"] for i in range(20)])
    with summary.storage.sync_reader() as reader:
        assert reader.read(0, len(want))["tokens"].tolist() == want.tolist()
    assert summary.nbytes == len(want) * 5 + 20 * 8  # rows of stream and record_ends


def test_a_write_to_a_missing_bucket_names_the_bucket_and_the_url(s3_url: Location) -> None:
    bucket = f"rangestream-missing-{uuid.uuid4().hex[:8]}"
    url = f"s3://{bucket}/ds"
    with pytest.raises(BucketNotFoundError, match=f"bucket '{bucket}' of {url} does not exist"):
        rangestream.write(tokens_of, range(4), url, kind="stream", storage_format=TOKENS,
                          workers=0, storage_options=s3_url.storage_options,
                          progress=False)  # fmt: skip


def test_a_generator_fn_writes_each_record_it_yields(tmp_path: Path) -> None:
    summary = rangestream.write(
        two_records, range(4), tmp_path / "ds", kind="stream", storage_format=TOKENS, workers=0,
        progress=False,
    )  # fmt: skip
    assert (summary.rows, summary.records) == (4, 8)
    want = np.concatenate([tokens_of(j)["tokens"] for i in range(4) for j in (i, i + 1000)])
    with StreamStorage(tmp_path / "ds", TOKENS).sync_reader() as reader:
        assert reader.read(0, len(want))["tokens"].tolist() == want.tolist()


def test_documents_default_to_a_record_format_inferred_and_stored(tmp_path: Path) -> None:
    summary = rangestream.write(document_of, range(9), tmp_path / "ds", workers=2, progress=False)
    fmt = summary.storage.storage_format
    assert isinstance(fmt, RecordFormat) and fmt.names == ("ids", "score", "tag")
    stored = json.loads((tmp_path / "ds" / "zarr.json").read_text())["attributes"]["rangestream"]
    assert RecordFormat.from_schema(stored["schema"]["format"]) == fmt
    with DocumentStorage(tmp_path / "ds", fmt).sync_reader() as reader:
        for i in range(9):
            got = reader.read(i)
            assert got["ids"].tolist() == list(range(i % 4))
            assert (float(got["score"]), int(got["tag"])) == (i / 4, i)


def test_streams_with_metadata_keep_their_payloads(tmp_path: Path) -> None:
    summary = rangestream.write(
        span_record, range(7), tmp_path / "ds", kind="stream_with_meta",
        storage_format=SpanFormat(), items_per_split=2, workers=0, progress=False,
    )  # fmt: skip
    assert isinstance(summary.storage, StreamWithMetaStorage)
    want = np.concatenate([span_record(i)["tokens"] for i in range(7)])
    owners = [i for i in range(7) for _ in range(len(span_record(i)["tokens"]))]
    with summary.storage.sync_reader() as reader:
        got = reader.read(0, len(want))
    assert got["tokens"].tolist() == want.tolist() and got["owner"] == owners


def test_temporal_records_are_one_case_of_write(tmp_path: Path) -> None:
    summary = rangestream.write(
        temporal_of, range(6), tmp_path / "ds", kind="temporal", field_groups=[["pose", "t"]],
        workers=2, progress=False,
    )  # fmt: skip
    storage = TemporalArrayStorage(tmp_path / "ds")
    assert storage.frame_counts.tolist() == [2 + i % 3 for i in range(6)]
    for i in range(6):
        assert np.array_equal(storage[i]["pose"], temporal_of(i)["pose"])
    assert summary.shards == 6


def fail_at(index: int) -> dict[str, np.ndarray]:
    if index == 7 and not Path(FLAG).exists():
        raise RuntimeError("input 7 is not ready")
    return tokens_of(index)


#: Path of a file whose existence lets input 7 load (set per test; workers=0 only).
FLAG = ""


def test_a_failed_write_resumes_from_the_splits_already_written(tmp_path: Path) -> None:
    global FLAG
    FLAG = str(tmp_path / "ready")
    kwargs = {"kind": "stream", "storage_format": TOKENS, "items_per_split": 3, "workers": 0,
              "progress": False}  # fmt: skip
    with pytest.raises(RuntimeError, match="not ready") as caught:
        rangestream.write(fail_at, range(12), tmp_path / "ds", **kwargs)
    assert "while writing input 7: 7" in caught.value.__notes__
    assert not StreamStorage(tmp_path / "ds", TOKENS).exists()
    Path(FLAG).write_text("")
    same_format = StreamNumpyFormat(np.dtype([("tokens", "<i4"), ("loss_mask", "u1")]))
    kwargs["storage_format"] = same_format  # an equal format object, as a new process has
    summary = rangestream.write(fail_at, range(12), tmp_path / "ds", resume=True, **kwargs)
    assert (summary.splits_skipped, summary.splits) == (2, 4)  # inputs 0-5 were kept
    assert summary.records == 12  # the whole dataset, and what this run added:
    assert summary.added is not None and (summary.added.records, summary.added.split) == (6, 2)
    want = np.concatenate([tokens_of(i)["tokens"] for i in range(12)])
    with StreamStorage(tmp_path / "ds", TOKENS).sync_reader() as reader:
        assert reader.read(0, reader.total_length)["tokens"].tolist() == want.tolist()


def test_a_rerun_without_resume_discards_the_abandoned_write(tmp_path: Path) -> None:
    global FLAG
    FLAG = str(tmp_path / "ready")
    kwargs = {"kind": "stream", "storage_format": TOKENS, "items_per_split": 3, "workers": 0,
              "progress": False}  # fmt: skip
    with pytest.raises(RuntimeError):
        rangestream.write(fail_at, range(12), tmp_path / "ds", **kwargs)
    abandoned = {p.name for p in (tmp_path / "ds" / "data").iterdir()}
    Path(FLAG).write_text("")
    rangestream.write(fail_at, range(12), tmp_path / "ds", **kwargs)
    kept = {p.name for p in (tmp_path / "ds" / "data").iterdir() if p.is_dir()}
    assert not abandoned & kept  # the abandoned commit's objects are gone
    with pytest.raises(DatasetExistsError):
        rangestream.write(fail_at, range(12), tmp_path / "ds", **kwargs)


def test_resuming_with_other_inputs_is_refused(tmp_path: Path) -> None:
    global FLAG
    FLAG = str(tmp_path / "ready")
    kwargs = {"kind": "stream", "storage_format": TOKENS, "items_per_split": 3, "workers": 0,
              "progress": False}  # fmt: skip
    with pytest.raises(RuntimeError):
        rangestream.write(fail_at, range(12), tmp_path / "ds", **kwargs)
    with pytest.raises(ResumeError):
        rangestream.write(fail_at, range(13), tmp_path / "ds", resume=True, **kwargs)


def test_the_progress_bar_shows_rows_records_and_megabytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rangestream.write(two_records, range(5), tmp_path / "ds", kind="stream", storage_format=TOKENS,
                      workers=0)  # fmt: skip
    err = capsys.readouterr().err
    assert "5/5" in err and "records=10" in err and "MB=" in err
