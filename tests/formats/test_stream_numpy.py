"""``StreamNumpyFormat.pack``: values are stored exactly or refused, never wrapped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import InvalidRecordError

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def test_ids_over_int32_are_refused_naming_the_field_value_and_position() -> None:
    ids = np.arange(10, dtype=np.int64)
    ids[7] = 2**31 + 5  # one past int32's range: today it would wrap to a negative id
    with pytest.raises(InvalidRecordError) as caught:
        StreamNumpyFormat(TOKENS).pack({"tokens": ids, "loss_mask": np.ones(10, "u1")})
    message = str(caught.value)
    assert "'tokens'" in message and "2147483653" in message and "position 7" in message
    assert "int32" in message


@pytest.mark.parametrize(
    ("field", "values", "bad", "position"),
    [
        ("tokens", [0, -(2**31) - 1, 3], -(2**31) - 1, 1),
        ("loss_mask", [1, 0, 256], 256, 2),
        ("loss_mask", [1, -1, 0], -1, 1),
        ("tokens", [1.0, 2.5, 3.0], 2.5, 1),  # a fraction does not fit an integer
        ("tokens", [1.0, float("nan"), 3.0], "nan", 1),
    ],
)
def test_every_value_that_does_not_fit_its_field_is_refused(
    field: str, values: list[Any], bad: Any, position: int
) -> None:
    record = {"tokens": [1, 2, 3], "loss_mask": [1, 1, 1], field: values}
    with pytest.raises(InvalidRecordError) as caught:
        StreamNumpyFormat(TOKENS).pack(record)
    message = str(caught.value)
    assert repr(field) in message and str(bad) in message and f"position {position}" in message


def test_python_lists_and_wider_integer_arrays_pack_when_every_value_fits() -> None:
    tokens = [0, 2**31 - 1, -(2**31), 17]
    packed = StreamNumpyFormat(TOKENS).pack(
        {"tokens": tokens, "loss_mask": np.array([1, 0, 1, 1], dtype=np.int64)}
    )
    expected = np.zeros(4, dtype=TOKENS)
    expected["tokens"] = np.array(tokens, dtype=np.int64).astype("<i4")
    expected["loss_mask"] = [1, 0, 1, 1]
    assert packed.dtype == TOKENS
    np.testing.assert_array_equal(packed, expected)


def test_integral_floats_and_bools_fit_integer_fields() -> None:
    packed = StreamNumpyFormat(TOKENS).pack(
        {"tokens": np.array([3.0, -4.0]), "loss_mask": np.array([True, False])}
    )
    assert packed["tokens"].tolist() == [3, -4] and packed["loss_mask"].tolist() == [1, 0]


def test_float_fields_take_wider_floats_but_refuse_overflow_to_infinity() -> None:
    fmt = StreamNumpyFormat(np.dtype([("x", "<f2")]))
    packed = fmt.pack({"x": [0.1, -2.5, float("inf")]})  # rounding is fine, inf stays inf
    np.testing.assert_array_equal(packed["x"], np.array([0.1, -2.5, np.inf], dtype="<f2"))
    with pytest.raises(InvalidRecordError, match=r"'x'.*70000.*position 1"):
        fmt.pack({"x": [1.0, 70000.0]})


def test_bool_fields_take_only_zero_and_one() -> None:
    fmt = StreamNumpyFormat(np.dtype([("keep", "?")]))
    assert fmt.pack({"keep": [0, 1, 1]})["keep"].tolist() == [False, True, True]
    with pytest.raises(InvalidRecordError, match=r"'keep'.*2.*position 2"):
        fmt.pack({"keep": [0, 1, 2]})


def test_text_is_refused_as_a_field_value() -> None:
    with pytest.raises(InvalidRecordError, match="'tokens'"):
        StreamNumpyFormat(TOKENS).pack({"tokens": ["a", "b"], "loss_mask": [1, 1]})


def test_a_writer_refuses_the_record_and_keeps_the_earlier_ones(tmp_path: Any) -> None:
    storage = StreamStorage(str(tmp_path / "ds"), StreamNumpyFormat(TOKENS))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": [5, 6, 7], "loss_mask": [1, 1, 0]})
        with pytest.raises(InvalidRecordError, match="position 1"):
            writer.append(0, {"tokens": [8, 2**40], "loss_mask": [1, 1]})
    with storage.sync_reader() as reader:
        window = reader.read(0, 3)
    assert window["tokens"].tolist() == [5, 6, 7] and window["loss_mask"].tolist() == [1, 1, 0]
