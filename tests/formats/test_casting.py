"""cast_fitting: values decide whether integers fit; kinds decide the rest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import InvalidRecordError
from rangestream.formats.casting import cast_fitting


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        (np.array([0, 2**31 - 1], "<i8"), "<i4"),
        (np.array([0, 65535], "<i8"), "<u2"),
        (np.array([0, 255], "<u4"), "u1"),
        (np.array([True, False]), "<i4"),
        (np.array([1.5, -2.25], "<f8"), "<f4"),
        (np.array([3, 4], "<i4"), "<f8"),
    ],
)
def test_values_that_fit_are_cast_exactly(values: np.ndarray, dtype: str) -> None:
    out = cast_fitting(values, np.dtype(dtype), "ids")
    assert out.dtype == np.dtype(dtype)
    assert out.astype(np.float64).tolist() == values.astype(np.float64).tolist()


@pytest.mark.parametrize(
    ("values", "dtype", "message"),
    [
        (np.array([0, 2**31], "<i8"), "<i4", "2147483648"),
        (np.array([-1, 3], "<i8"), "<u2", "-1"),
        (np.array([65536], "<u4"), "<u2", "65536"),
        (np.array([1e300]), "<f4", "overflows"),
        (np.array([1.0]), "<i4", "cannot be stored"),
        (np.array([1]), "?", "cannot be stored"),
    ],
)
def test_values_that_do_not_fit_are_refused_and_named(
    values: np.ndarray, dtype: str, message: str
) -> None:
    with pytest.raises(InvalidRecordError, match=message):
        cast_fitting(values, np.dtype(dtype), "ids")


def test_stream_numpy_format_refuses_an_id_that_would_wrap(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(np.dtype([("tokens", "<i4")])))
    with storage.sync_writer() as writer:
        with pytest.raises(InvalidRecordError, match="2147483648"):
            writer.append(0, {"tokens": np.array([1, 2**31], dtype=np.int64)})
        writer.append(0, {"tokens": np.array([1, 2**31 - 1], dtype=np.int64)})
    with storage.sync_reader() as reader:
        assert reader.read(0, 2)["tokens"].tolist() == [1, 2**31 - 1]
