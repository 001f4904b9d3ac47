"""write_records: parallel loading keeps the input order, failures publish nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.s3 import Location

from rangestream import TemporalArrayStorage, write_records
from rangestream.errors import InvalidRecordError


def load_record(index: int) -> dict[str, np.ndarray]:
    """A record whose content and length identify the input it came from."""
    frames = 3 + (index * 7) % 11
    rng = np.random.default_rng(index)
    return {
        "features": rng.standard_normal((frames, 5)).astype(np.float32),
        "input": np.full(frames, index, dtype=np.int64),
        "pose": rng.standard_normal((frames, 7)).astype(np.float32),
    }


def load_record_failing_at_5(index: int) -> dict[str, np.ndarray]:
    record = load_record(index)
    if index == 5:
        del record["pose"]
    return record


def test_records_are_stored_in_input_order_with_two_workers(location: Location) -> None:
    inputs = list(range(9))
    storage = write_records(
        load_record,
        inputs,
        location.url,
        num_workers=2,
        field_groups=[["input", "pose"]],
        storage_options=location.storage_options,
        progress=False,
    )
    assert isinstance(storage, TemporalArrayStorage)
    assert storage.frame_counts.tolist() == [3 + (i * 7) % 11 for i in inputs]
    for index in inputs:
        got, want = storage[index], load_record(index)
        for name in want:
            assert np.array_equal(got[name], want[name]), (index, name)
    assert storage.read_window(4, 1, 2, ["input"])["input"].tolist() == [4, 4]


def test_loading_in_this_process_takes_any_callable(tmp_path: Path) -> None:
    storage = write_records(
        lambda i: load_record(i + 100), range(3), tmp_path / "ds", num_workers=0, progress=False
    )
    assert [int(storage[i]["input"][0]) for i in range(3)] == [100, 101, 102]


def test_a_record_failing_in_a_worker_names_its_input_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    with pytest.raises(InvalidRecordError, match="missing") as caught:
        write_records(
            load_record_failing_at_5, range(8), tmp_path / "ds", num_workers=2, progress=False
        )
    assert "while writing input 5: 5" in caught.value.__notes__
    assert not TemporalArrayStorage(tmp_path / "ds").exists()


def test_an_unpicklable_loader_with_workers_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="module-level function, or num_workers=0"):
        write_records(lambda i: load_record(i), range(3), tmp_path / "ds", num_workers=2)
    assert not TemporalArrayStorage(tmp_path / "ds").exists()


def test_the_progress_bar_counts_every_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_records(load_record, range(4), tmp_path / "ds", num_workers=2, progress=True)
    assert "4/4" in capsys.readouterr().err


# -- inner chunks sized per field group: the over-fetch bound --------------------------------
WIDTHS = {"flag": ("?", ()), "clock": ("<f8", ()), "pose": ("<f4", (7,)), "wide": ("<f4", (256,))}


def _fetched_bytes(row: int, chunk: int, start_row: int, frames: int) -> int:
    """Bytes of the inner chunks (each with its 4-byte crc) holding rows [start, start+n)."""
    first, last = start_row // chunk, (start_row + frames - 1) // chunk
    return (last - first + 1) * (chunk * row + 4)


def test_windows_of_the_sized_length_fetch_at_most_a_quarter_more_than_their_payload(
    tmp_path: Path,
) -> None:
    """Every field alone in its group; 64-frame windows at every start in a chunk period.
    Rows of 8 bytes and more stay within 1.25x their payload; a 1-byte field's chunks
    cannot (a 4-byte checksum per chunk): it gets the chunk size that fetches least."""
    rng = np.random.default_rng(5)
    frames = 400
    record = {
        name: rng.standard_normal((frames, *shape)).astype(dtype) if dtype != "?"
        else rng.random(frames) > 0.5
        for name, (dtype, shape) in WIDTHS.items()
    }  # fmt: skip
    storage = TemporalArrayStorage(tmp_path / "ds")
    with storage.sync_writer() as writer:
        writer.append(0, record)
    storage = TemporalArrayStorage(tmp_path / "ds")
    storage.frame_counts.tolist()  # opens and reads the index
    worst = {}
    for name, (dtype, shape) in WIDTHS.items():
        row = np.dtype(dtype).itemsize * int(np.prod(shape))
        # the rule, brute force: powers of two up to 32 frames and 8 KiB
        candidates = [c for c in (1, 2, 4, 8, 16, 32) if c * row <= 8192]
        ratio = {c: max(_fetched_bytes(row, c, s, 64) for s in range(c)) / (64 * row)
                 for c in candidates}  # fmt: skip
        fitting = [c for c in candidates if ratio[c] <= 1.25]
        chunk = max(fitting) if fitting else min(sorted(candidates, reverse=True),
                                                 key=ratio.__getitem__)  # fmt: skip
        spent = []
        for start in range(40, 40 + 2 * chunk):
            before = storage.stats.copy()
            got = storage.read_window(0, start, 64, [name])
            assert np.array_equal(got[name], record[name][start : start + 64])
            spent.append((storage.stats - before).bytes)
            assert spent[-1] == _fetched_bytes(row, chunk, start, 64), (name, start)
        worst[name] = max(spent) / (64 * row)
    assert worst["clock"] <= 1.25 and worst["pose"] <= 1.25 and worst["wide"] <= 1.25
    assert worst["flag"] == pytest.approx(100 / 64)  # 5 chunks of 16 frames + 4 B each


def test_the_window_length_chunks_are_sized_for_is_an_option(tmp_path: Path) -> None:
    record = {"pose": np.zeros((50, 7), dtype=np.float32)}
    for window, chunk in ((64, 8), (8, 1), (1024, 32)):
        storage = TemporalArrayStorage(tmp_path / f"w{window}", window_frames=window)
        with storage.sync_writer() as writer:
            writer.append(0, record)
        root = TemporalArrayStorage(tmp_path / f"w{window}")
        with root.sync_reader() as reader:
            assert reader.opened.arrays[0][0].chunk_rows == chunk, window


# -- the commit's index arrays ---------------------------------------------------------------
def test_the_commit_writes_the_cumulative_index_and_the_histogram_zarr_reads(
    tmp_path: Path,
) -> None:
    import json

    import zarr

    frames = [5, 1, 9, 5, 30, 2, 5]
    storage = TemporalArrayStorage(tmp_path / "ds")
    with storage.sync_writer() as writer:
        for number, count in enumerate(frames):
            writer.append(number % 3, {"x": np.full(count, number, dtype=np.int16)})
    order = sorted(range(len(frames)), key=lambda i: (i % 3, i))
    counts = np.asarray([frames[i] for i in order])
    root = json.loads((tmp_path / "ds" / "zarr.json").read_text())["attributes"]["rangestream"]
    prefix = tmp_path / "ds" / root["data_prefix"] / "index"
    starts = zarr.open_array(prefix / "frame_starts", mode="r")
    assert starts.attrs["rangestream_record_stride"] == 512
    assert starts[:].tolist() == [0, int(counts.sum())]  # one stride of records, the total
    histogram = zarr.open_array(prefix / "frame_histogram", mode="r")[:]
    values, numbers = np.unique(counts, return_counts=True)
    assert histogram.tolist() == np.stack([values, numbers], axis=1).tolist()
