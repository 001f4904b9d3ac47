"""Integer samples widened to the loader's token dtype: one read's samples cast together
(``widen_many``) are exactly what casting each alone (``widen_integers``) gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rangestream.loader.sources.indexed import widen_integers, widen_many

WIDE = np.dtype("int64")


def _windows(dtype: str, count: int = 5, length: int = 7) -> np.ndarray:
    """Overlapping-free rows of one read, as the stream reader cuts a run."""
    return (np.arange(count * length) * 3 + 1).astype(dtype).reshape(count, length)


def _same(got: Any, want: Any) -> None:
    """Equal structure, values and dtypes (dict key order included)."""
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, tuple):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
    else:
        assert got == want


def _check(samples: list[Any]) -> list[Any]:
    expected = [widen_integers(sample, WIDE) for sample in samples]
    got = widen_many(samples, WIDE)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        _same(a, b)
    return got


@pytest.mark.parametrize("stored", ["uint16", "int32", "uint32", "int8"])
def test_alike_dict_windows_come_as_the_token_dtype(stored: str) -> None:
    rows = _windows(stored)
    samples = [{"tokens": row, "mask": row > 4} for row in rows]
    got = _check(samples)
    assert [s["tokens"].dtype for s in got] == [WIDE] * len(rows)
    assert all(s["mask"] is o["mask"] for s, o in zip(got, samples, strict=True))  # kept
    assert [s["tokens"].tolist() for s in got] == rows.astype(np.int64).tolist()
    bases = {id(s["tokens"].base) for s in got}  # cast together: rows of one new array
    assert len(bases) == 1 and got[0]["tokens"].base is not None


def test_bare_windows_and_their_rows_are_independent() -> None:
    rows = _windows("uint16")
    got = _check(list(rows))
    assert got[0].base is got[1].base is not None  # cast together
    got[1][:] = -5  # one sample changed in place changes no other, nor the stored rows
    assert got[0].tolist() == rows[0].astype(np.int64).tolist()
    assert got[2].tolist() == rows[2].astype(np.int64).tolist()
    assert rows[1].tolist() == (np.arange(7, 14) * 3 + 1).tolist()


def test_samples_already_in_the_token_dtype_are_handed_on_as_they_are() -> None:
    rows = list(_windows("int64"))
    got = widen_many(rows, WIDE)
    assert all(a is b for a, b in zip(got, rows, strict=True))
    dicts = [{"tokens": row} for row in rows]
    assert all(
        a["tokens"] is b["tokens"] for a, b in zip(widen_many(dicts, WIDE), dicts, strict=True)
    )


def test_unlike_samples_are_widened_one_by_one_to_the_same_values() -> None:
    rows = _windows("int32")
    short = np.arange(3, dtype=np.int32)
    _check([{"tokens": rows[0]}, {"tokens": short}])  # shapes differ
    _check([{"tokens": rows[0]}, {"tokens": rows[1].astype(np.uint16)}])  # dtypes differ
    _check([{"a": rows[0], "b": rows[1]}, {"b": rows[2], "a": rows[3]}])  # key order
    _check([{"a": rows[0]}, {"b": rows[1]}])  # keys differ
    _check([{"tokens": rows[0], "n": 3}, {"tokens": rows[1], "n": 4}])  # not arrays
    _check([(rows[0], rows[1]), (rows[2], rows[3])])  # tuples
    _check([rows[0], rows[1].astype(">i4")])  # another byte order
    structured = np.zeros(4, dtype=[("tokens", "<u2"), ("loss", "<f4")])
    got = _check([structured, structured.copy()])
    assert got[0].dtype["tokens"] == WIDE and got[0].dtype["loss"] == np.float32
    _check([rows[0]])  # one sample


def test_loader_fields_keep_their_dtype_and_shapes_may_differ() -> None:
    rows = _windows("uint16", count=3)
    samples = [
        {"tokens": row, "cu_seqlens": np.array([0, 2 + i, 7], dtype=np.int32)[: 2 + i % 2]}
        for i, row in enumerate(rows)
    ]
    got = _check(samples)
    assert [s["cu_seqlens"].dtype for s in got] == [np.int32] * 3
    assert [s["tokens"].dtype for s in got] == [WIDE] * 3
