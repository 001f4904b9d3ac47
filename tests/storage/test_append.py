"""mode="append": new shards as a new version; the old shards are read where they were written.

(``storage/core/appending.py``'s append checks and ``storage/core/commit.py``'s append commits,
with ``layout/manifest.py``'s ``inherited``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from support.s3 import Location

from rangestream import (
    DocumentStorage,
    RecordField,
    RecordFormat,
    StreamDataset,
    StreamNumpyFormat,
    StreamStorage,
    TemporalArrayStorage,
)
from rangestream.errors import CommitConflictError, DatasetExistsError, SchemaMismatchError
from rangestream.storage.maintenance.gc import collect_garbage
from rangestream.storage.maintenance.verify import verify_dataset

TOKENS = np.dtype([("t", "<i4")])
SMALL = {"chunk_bytes": 64, "block_bytes": 1024}


def storage_at(location: Location, name: str = "ds", **options: Any) -> StreamStorage:
    options = {**SMALL, **options}
    return StreamStorage(
        location.child(name), StreamNumpyFormat(TOKENS), storage_options=location.storage_options,
        **options,
    )  # fmt: skip


def write(storage: StreamStorage, shards: dict[int, list[np.ndarray]], **kwargs: Any) -> None:
    with storage.sync_writer(**kwargs) as writer:
        for shard, records in shards.items():
            for values in records:
                writer.append(shard, {"t": values})


def read_all(storage: StreamStorage) -> np.ndarray:
    with storage.sync_reader() as reader:
        return np.asarray(reader.read(0, reader.total_length)["t"])


def root(location: Location, name: str = "ds") -> dict[str, Any]:
    with fsspec.open(f"{location.child(name)}/zarr.json", "rb", **location.storage_options) as f:
        return dict(json.loads(f.read())["attributes"]["rangestream"])


def keys_under(location: Location, prefix: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(f"{location.child('ds')}/{prefix}", **location.storage_options)
    return [key[len(path) + 1 :] for key in fs.find(path)]


def test_an_append_adds_shards_as_a_new_version_without_copying_the_old_ones(
    location: Location,
) -> None:
    first = {0: [np.arange(0, 300, dtype="<i4")], 1: [np.arange(300, 350, dtype="<i4")]}
    later = {0: [np.arange(350, 400, dtype="<i4")], 1: [np.arange(400, 700, dtype="<i4")] * 1}
    write(storage_at(location), first)
    old = root(location)
    write(storage_at(location), later, mode="append")
    new = root(location)
    np.testing.assert_array_equal(read_all(storage_at(location)), np.arange(700))
    assert new["format_version"] == 2
    assert new["shards"]["ids"] == [0, 1, 2, 3]
    assert new["inherited"] == {old["commit_id"]: [0, 1]}
    assert new["extra"]["previous_commit_id"] == old["commit_id"]
    new_shards = keys_under(location, f"{new['data_prefix']}/shards")
    assert {key.split("/")[0] for key in new_shards} == {"2", "3", "zarr.json"}
    with storage_at(location).sync_reader() as reader:
        assert [reader.num_records(s) for s in range(4)] == [1, 1, 1, 1]
        np.testing.assert_array_equal(reader.read_record(1)["t"], np.arange(300, 350))


def test_a_reader_of_the_old_version_is_unaffected_by_an_append(location: Location) -> None:
    write(storage_at(location), {0: [np.arange(100, dtype="<i4")]})
    with storage_at(location).sync_reader() as before:
        assert before.total_length == 100
        write(storage_at(location), {0: [np.arange(100, 150, dtype="<i4")]}, mode="append")
        np.testing.assert_array_equal(before.read(0, 100)["t"], np.arange(100))
        assert before.total_length == 100 and before.num_shards == 1
    assert len(read_all(storage_at(location))) == 150


def test_appends_chain_and_every_referenced_version_survives_commits_gc_and_verify(
    location: Location,
) -> None:
    values = [np.arange(k * 100, (k + 1) * 100, dtype="<i4") for k in range(4)]
    write(storage_at(location), {0: [values[0]]})
    commits = [root(location)["commit_id"]]
    for k in (1, 2, 3):  # each commit deletes the version before the previous one, if unused
        write(storage_at(location), {0: [values[k]]}, mode="append")
        commits.append(root(location)["commit_id"])
    manifest = root(location)
    assert manifest["inherited"] == {commits[0]: [0], commits[1]: [1], commits[2]: [2]}
    np.testing.assert_array_equal(read_all(storage_at(location)), np.concatenate(values))
    report = verify_dataset(location.child("ds"), location.storage_options)
    assert report.ok, report.lines()
    assert report.blocks > 0 and not report.orphans
    garbage = collect_garbage(location.child("ds"), location.storage_options, grace=0,
                              delete=True)  # fmt: skip
    assert garbage.orphans == []
    np.testing.assert_array_equal(read_all(storage_at(location)), np.concatenate(values))


def test_an_overwrite_keeps_the_appended_version_it_replaced_until_the_next_commit(
    tmp_path: Path,
) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location), {0: [np.arange(10, dtype="<i4")]})
    base = root(location)["commit_id"]
    write(storage_at(location), {0: [np.arange(10, 20, dtype="<i4")]}, mode="append")
    appended = root(location)["commit_id"]
    with storage_at(location).sync_reader() as old_reader:
        assert old_reader.total_length == 20
        write(storage_at(location), {0: [np.arange(5, dtype="<i4")]}, overwrite=True)
        garbage = collect_garbage(location.child("ds"), grace=0, delete=True)
        assert garbage.orphans == []  # the replaced version and the data it inherited live
        np.testing.assert_array_equal(old_reader.read(0, 20)["t"], np.arange(20))
    assert root(location)["extra"]["previous_inherited"] == [base]
    write(storage_at(location), {0: [np.arange(3, dtype="<i4")]}, overwrite=True)
    data = tmp_path / "ds" / "data"
    assert not (data / base).exists() and not (data / appended).exists()


def test_appending_to_a_url_without_a_dataset_creates_it(location: Location) -> None:
    write(storage_at(location), {0: [np.arange(7, dtype="<i4")]}, mode="append")
    np.testing.assert_array_equal(read_all(storage_at(location)), np.arange(7))
    assert root(location)["format_version"] == 2 and "inherited" not in root(location)


def test_an_append_that_another_commit_overtook_fails_and_publishes_nothing(
    location: Location,
) -> None:
    write(storage_at(location), {0: [np.arange(5, dtype="<i4")]})
    session = storage_at(location).parallel_write(mode="append")
    with session.sync_writer() as writer:
        writer.append(0, {"t": np.arange(5, 8, dtype="<i4")})
    write(storage_at(location), {0: [np.arange(100, 103, dtype="<i4")]}, mode="append")
    with pytest.raises(CommitConflictError, match="extends version"):
        session.commit()
    np.testing.assert_array_equal(
        read_all(storage_at(location)), np.r_[np.arange(5), 100, 101, 102]
    )


def test_create_mode_refuses_an_existing_dataset_and_names_append(tmp_path: Path) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location), {0: [np.arange(5, dtype="<i4")]})
    with pytest.raises(DatasetExistsError, match="mode='append'"):
        write(storage_at(location), {0: [np.arange(5, dtype="<i4")]})
    with pytest.raises(ValueError, match="contradicts"):
        storage_at(location).sync_writer(overwrite=True, mode="append")
    with pytest.raises(ValueError, match="mode must be one of"):
        storage_at(location).sync_writer(mode="replace")


def test_an_append_of_another_dtype_kind_or_format_is_refused(tmp_path: Path) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location), {0: [np.arange(5, dtype="<i4")]})
    wider = StreamStorage(location.child("ds"), StreamNumpyFormat(np.dtype([("t", "<i8")])))
    with pytest.raises(SchemaMismatchError, match="stream_dtype"):
        wider.sync_writer(mode="append")
    documents = DocumentStorage(location.child("ds"), RecordFormat([RecordField("t", "<i4")]))
    with pytest.raises(SchemaMismatchError, match="'stream' dataset"):
        documents.sync_writer(mode="append")
    assert len(read_all(storage_at(location))) == 5


def test_an_append_cuts_its_shards_as_the_stored_ones_whatever_its_options(
    tmp_path: Path,
) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location, chunk_bytes=32, block_bytes=512), {0: [np.arange(500, dtype="<i4")]})
    stored = root(location)["arrays"]
    plain = StreamStorage(location.child("ds"))  # default sizes, and no format: the stored one
    with plain.sync_writer(mode="append") as writer:
        writer.append(0, {"t": np.arange(500, 900, dtype="<i4")})
    assert root(location)["arrays"] == stored
    np.testing.assert_array_equal(read_all(storage_at(location)), np.arange(900))
    assert verify_dataset(location.child("ds")).ok


def test_records_and_boundaries_span_the_old_and_the_appended_shards(location: Location) -> None:
    write(storage_at(location), {0: [np.arange(10, dtype="<i4"), np.arange(10, 16, dtype="<i4")]})
    write(storage_at(location), {0: [np.arange(16, 30, dtype="<i4")]}, mode="append")
    dataset = StreamDataset(storage_at(location), 8, boundaries=True)
    with dataset.sync_reader() as reader:
        window = reader[1]  # elements 8..15 | 16..: records start at 10 and at 16
    assert window["cu_seqlens"].tolist() == [0, 2, 8]
    assert window["position_ids"].tolist() == [8, 9, 0, 1, 2, 3, 4, 5]


def test_documents_and_temporal_records_append_too(location: Location) -> None:
    fmt = RecordFormat([RecordField("x", np.dtype("<u2"))])
    documents = DocumentStorage(
        location.child("docs"), fmt, storage_options=location.storage_options
    )
    with documents.sync_writer() as writer:
        writer.append(0, {"x": [1, 2]})
    reopened = DocumentStorage(location.child("docs"), storage_options=location.storage_options)
    with reopened.sync_writer(mode="append") as writer:
        writer.append(0, {"x": [3]})
    with reopened.sync_reader() as reader:
        assert [d["x"].tolist() for d in reader.read_many([0, 1])] == [[1, 2], [3]]
    tracks = TemporalArrayStorage(
        location.child("tracks"), storage_options=location.storage_options
    )
    frames = [np.arange(n * 3, dtype="<f4").reshape(n, 3) for n in (5, 9)]
    with tracks.sync_writer() as writer:
        writer.append(0, {"pose": frames[0]})
    with tracks.sync_writer(mode="append") as writer:
        writer.append(0, {"pose": frames[1]})
    reread = TemporalArrayStorage(
        location.child("tracks"), storage_options=location.storage_options
    )
    assert reread.frame_counts.tolist() == [5, 9]
    np.testing.assert_array_equal(reread.read_window(1, 2, 4)["pose"], frames[1][2:6])


def test_verify_scans_the_inherited_shards_where_they_lie(tmp_path: Path) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location), {0: [np.arange(200, dtype="<i4")]})
    old = root(location)["commit_id"]
    write(storage_at(location), {0: [np.arange(200, 260, dtype="<i4")]}, mode="append")
    block = tmp_path / "ds" / "data" / old / "shards" / "0" / "stream" / "c" / "0" / "0"
    data = bytearray(block.read_bytes())
    data[5] ^= 0xFF
    block.write_bytes(bytes(data))
    report = verify_dataset(location.child("ds"))
    assert not report.ok
    assert any(f"data/{old}/shards/0/stream/c/0/0" in str(p) for p in report.problems)
    assert "checksum mismatch" in " ".join(str(p) for p in report.problems)


def test_an_append_past_the_listed_shards_keeps_its_inherited_shards_with_the_table(
    location: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rangestream.layout import shard_table

    monkeypatch.setattr(shard_table, "INLINE_SHARDS", 3)  # a table from 4 shards on
    values = [np.arange(k * 50, (k + 1) * 50, dtype="<i4") for k in range(6)]
    write(storage_at(location), {k: [values[k]] for k in range(4)})
    first = root(location)
    assert "ids" not in first["shards"] and first["shards"]["count"] == 4
    write(storage_at(location), {k: [values[4 + k]] for k in range(2)}, mode="append")
    appended = root(location)
    assert appended["shards"]["count"] == 6 and "ids" not in appended["shards"]
    assert appended["inherited"] == {first["commit_id"]: [0, 1, 2, 3]}
    np.testing.assert_array_equal(read_all(storage_at(location)), np.concatenate(values))
    report = verify_dataset(location.child("ds"), location.storage_options)
    assert report.ok, report.lines()
    assert report.shards == 6 and report.arrays == 12 and not report.orphans


def test_an_append_to_a_version_1_dataset_is_refused_and_says_to_write_it_again(
    tmp_path: Path,
) -> None:
    location = Location(str(tmp_path), {})
    write(storage_at(location), {0: [np.arange(10, dtype="<i4")]})
    path = tmp_path / "ds" / "zarr.json"
    document = json.loads(path.read_bytes())
    attributes = document["attributes"]["rangestream"]
    attributes["format_version"] = 1
    del attributes["shards"]["count"]
    path.write_text(json.dumps(document))
    np.testing.assert_array_equal(read_all(storage_at(location)), np.arange(10))  # still read
    with pytest.raises(SchemaMismatchError, match=r"format_version 1 dataset.*write it again"):
        write(storage_at(location), {0: [np.arange(5, dtype="<i4")]}, mode="append")
