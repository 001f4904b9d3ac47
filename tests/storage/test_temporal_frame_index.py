"""The frame questions of the temporal record index: the cumulative index maps global
frames to records like a numpy searchsorted, the histogram counts records and windows, both
are read once and checked, and an append rewrites them for every record. Requests and
bytes are exact counts, never timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.temporal import ALL, COUNTS, PER_CHUNK, small_cache, write_bulk

from rangestream import TemporalArrayStorage
from rangestream.errors import CorruptDataError, MetadataError, OutOfRangeError
from rangestream.layout.block import ArrayLayout, encode_block


@pytest.fixture(scope="module")
def bulk(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("bulk") / "ds")
    write_bulk(path, COUNTS)
    return path


def test_locate_frames_maps_global_frames_like_a_numpy_searchsorted(bulk: str) -> None:
    storage = small_cache(bulk)
    starts = np.concatenate([[0], np.cumsum(ALL)])
    assert storage.total_frames == int(starts[-1])
    rng = np.random.default_rng(23)
    positions = np.concatenate(
        [rng.integers(0, int(starts[-1]), size=500), starts[:-1][:50], starts[1:] - 1]
    )
    records, within = storage.locate_frames(positions)
    want = np.searchsorted(starts, positions, side="right") - 1
    assert np.array_equal(records, want)
    assert np.array_equal(within, positions - starts[want])
    with pytest.raises(OutOfRangeError, match="outside the dataset's"):
        storage.locate_frames([int(starts[-1])])


def test_the_histogram_counts_records_and_windows_of_any_length(bulk: str) -> None:
    storage = small_cache(bulk)
    values, records = storage.frame_histogram()
    want_values, want_records = np.unique(ALL, return_counts=True)
    assert np.array_equal(values, want_values) and np.array_equal(records, want_records)
    for frames in (1, 7, 40, 41):
        eligible = ALL[frames <= ALL]
        assert storage.count_windows(frames) == (eligible.size, int((eligible - frames + 1).sum()))
    # the histogram and the cumulative index are read once: a few requests, no record_rows
    assert "record_rows" not in storage.stats.by_key_kind


def test_uniform_window_sampling_by_rejection_reads_no_whole_index(bulk: str) -> None:
    """What a sampler does over 10^8 records, here over 4,300: draw global frames, keep
    those whose window fits in its record. Every valid (record, start) pair is drawn with
    equal probability; the bytes read are those of the chunks touched, not of the index."""
    storage = small_cache(bulk)
    frames = 20
    rng = np.random.default_rng(24)
    positions = rng.integers(0, storage.total_frames, size=4000)
    records, starts = storage.locate_frames(positions)
    fits = starts + frames <= ALL[records]
    records, starts = records[fits], starts[fits]
    assert (ALL[records] >= frames).all()
    _, windows = storage.count_windows(frames)
    assert fits.mean() == pytest.approx(windows / storage.total_frames, abs=0.03)
    # a record's chance is proportional to its windows (checked on the long records)
    long = np.flatnonzero(ALL >= 35)
    draws = np.bincount(records, minlength=len(ALL))[long].sum()
    share = (ALL[long] - frames + 1).sum() / windows
    assert draws / len(records) == pytest.approx(share, rel=0.15)
    assert storage.stats.bytes_by_key_kind.get("record_rows", 0) <= 2 * (PER_CHUNK * 16 + 4) * 9


def _index_array(root: Path, name: str) -> tuple[Path, Any]:
    attributes = json.loads((root / "zarr.json").read_text())["attributes"]["rangestream"]
    schema_key = {"frame_starts": "frame_starts", "frame_histogram": "frame_histogram"}[name]
    layout = ArrayLayout.from_json(attributes["schema"][schema_key], name)
    return root / attributes["data_prefix"] / "index" / name, layout


def test_a_cumulative_index_that_disagrees_with_the_records_is_refused(tmp_path: Path) -> None:
    write_bulk(str(tmp_path / "ds"), COUNTS)
    folder, layout = _index_array(tmp_path / "ds", "frame_starts")
    starts = [*np.concatenate([[0], np.cumsum(ALL)])[::PER_CHUNK].tolist(), int(ALL.sum())]
    starts[3] += 1  # chunk 2 claims one frame more, chunk 3 one less
    (folder / "c" / "0").write_bytes(encode_block(layout, np.asarray(starts, "<i8").view("u1")))
    storage = TemporalArrayStorage(tmp_path / "ds")
    with pytest.raises(CorruptDataError, match=r"frame_starts says records \[1024, 1536\)"):
        storage.locate_frames([int(starts[2]) + 5])
    starts[3] = starts[1] - 1  # not cumulative
    (folder / "c" / "0").write_bytes(encode_block(layout, np.asarray(starts, "<i8").view("u1")))
    with pytest.raises(CorruptDataError, match="not cumulative"):
        TemporalArrayStorage(tmp_path / "ds").locate_frames([0])


def test_a_histogram_that_does_not_count_every_record_is_refused(tmp_path: Path) -> None:
    write_bulk(str(tmp_path / "ds"), COUNTS)
    folder, layout = _index_array(tmp_path / "ds", "frame_histogram")
    values, numbers = np.unique(ALL, return_counts=True)
    numbers[0] += 1
    pairs = np.stack([values, numbers], axis=1).astype("<i8")
    (folder / "c" / "0" / "0").write_bytes(encode_block(layout, pairs.view("u1")))
    with pytest.raises(CorruptDataError, match="summing to 4300 records"):
        TemporalArrayStorage(tmp_path / "ds").count_windows(3)
    document = json.loads((folder / "zarr.json").read_text())
    document["shape"][0] = 10**12  # a hostile length: refused before any allocation
    (folder / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(MetadataError, match=r"length 1000000000000 is not in \[0, 4300\]"):
        TemporalArrayStorage(tmp_path / "ds").frame_histogram()


def test_an_append_rewrites_the_cumulative_index_and_histogram_of_every_record(
    tmp_path: Path,
) -> None:
    """An append adds shards without copying the old ones; the record index, cumulative
    index and histogram of the new version cover the old records and the appended ones."""
    from support.temporal import BulkTemporalStorage

    url = str(tmp_path / "ds")
    write_bulk(url, COUNTS[:2])
    with BulkTemporalStorage(url).sync_writer(mode="append") as writer:
        writer.append(0, {"counts": COUNTS[2]})
    storage = small_cache(url)
    starts = np.concatenate([[0], np.cumsum(ALL)])
    assert len(storage) == len(ALL) and storage.total_frames == int(starts[-1])
    values, records = storage.frame_histogram()
    want_values, want_records = np.unique(ALL, return_counts=True)
    assert np.array_equal(values, want_values) and np.array_equal(records, want_records)
    positions = np.random.default_rng(27).integers(0, int(starts[-1]), size=300)
    found, within = storage.locate_frames(positions)
    want = np.searchsorted(starts, positions, side="right") - 1
    assert np.array_equal(found, want) and np.array_equal(within, positions - starts[want])
    record = len(ALL) - 5  # an appended record: its shard's frames start at 0
    got = storage.read_window(record, 0, int(ALL[record]))
    first = int(COUNTS[2][: record - 2200].sum())
    assert np.array_equal(got["x"], (np.arange(first, first + ALL[record]) % 251).astype(np.uint8))
