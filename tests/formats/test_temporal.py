"""Temporal records: fields given as Python lists are stored exactly or refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rangestream import TemporalArrayStorage
from rangestream.errors import InvalidRecordError


def test_later_records_may_give_fields_as_lists_of_values_that_fit(tmp_path: Path) -> None:
    storage = TemporalArrayStorage(str(tmp_path / "ds"), field_groups=[["clock", "valid"]])
    first = {
        "clock": np.array([0.5, 1.5], dtype="<f4"),
        "valid": np.array([True, False]),
        "pose": np.arange(6, dtype="<i2").reshape(2, 3),
    }
    second = {"clock": [2.5, 3.5, 4.5], "valid": [1, 1, 0], "pose": [[1, 2, 3]] * 3}
    with storage.sync_writer() as writer:
        writer.append(0, first)
        writer.append(0, second)
    reopened = TemporalArrayStorage(str(tmp_path / "ds"))
    got = reopened[1]
    assert got["clock"].dtype == np.dtype("<f4") and got["clock"].tolist() == [2.5, 3.5, 4.5]
    assert got["valid"].tolist() == [True, True, False]
    assert got["pose"].dtype == np.dtype("<i2")
    np.testing.assert_array_equal(got["pose"], np.array(second["pose"], dtype="<i2"))


def test_a_list_value_that_does_not_fit_its_field_is_refused_with_its_position(
    tmp_path: Path,
) -> None:
    storage = TemporalArrayStorage(str(tmp_path / "ds"))
    with storage.sync_writer() as writer:
        writer.append(0, {"pose": np.zeros((2, 3), dtype="u1")})
        with pytest.raises(InvalidRecordError, match=r"'pose'.*300.*position \(1, 2\)"):
            writer.append(0, {"pose": [[1, 2, 3], [4, 5, 300]]})


def test_arrays_of_another_dtype_are_still_refused(tmp_path: Path) -> None:
    storage = TemporalArrayStorage(str(tmp_path / "ds"))
    with storage.sync_writer() as writer:
        writer.append(0, {"pose": np.zeros((2, 3), dtype="u1")})
        with pytest.raises(InvalidRecordError, match="expected dtype uint8, found int64"):
            writer.append(0, {"pose": np.zeros((2, 3), dtype=np.int64)})
