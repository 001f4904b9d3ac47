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
