"""Values given for a stored field: converted exactly, or refused naming the first misfit.

numpy's casts wrap (``int64`` 2**31 becomes ``int32`` -2**31) and truncate (2.5 becomes 2)
without a word, and ``np.can_cast(..., "same_kind")`` allows exactly those narrowing
casts. A training set with silently wrapped token ids is worse than a failed write, so a
value is accepted only if the field's dtype holds it: integers within the field's range,
floats without a fraction for integer fields, 0 and 1 for bool fields, and, for float
fields, anything that does not overflow to infinity (rounding to the narrower float is
what storing float32 means). The check costs nothing when the cast cannot lose anything
(``np.can_cast(..., "safe")``) and a vectorised min/max otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.errors import InvalidRecordError

__all__ = ["fit_to_field"]

_NUMERIC = "biuf"


def fit_to_field(values: Any, dtype: np.dtype[Any], field: str) -> np.ndarray:
    """``values`` (an array or a Python sequence) as an array whose values ``dtype`` holds.

    Returns an array of ``dtype`` or one that casts to it without loss (the caller's
    assignment or ``astype`` converts; no copy is made here just to convert). Raises
    ``InvalidRecordError`` naming ``field``, the first value that does not fit and its
    position.
    """
    array = np.asarray(values)
    source = array.dtype
    if source == dtype or np.can_cast(source, dtype, casting="safe"):
        return array
    if source.kind == "c" and dtype.kind in _NUMERIC:
        if array.size and np.any(array.imag != 0):
            _refuse(array, array.imag != 0, field, "has an imaginary part")
        array, source = array.real, array.real.dtype
    if source.kind not in _NUMERIC + "c" or dtype.kind not in _NUMERIC + "c":
        raise InvalidRecordError(
            f"field {field!r}: values of dtype {source} cannot be stored as {dtype}"
        )
    if array.size == 0:
        return array.astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if source.kind == "f":
            # bounds are powers of two, exact as floats: [min, max + 1) is what fits
            misfit = ~np.isfinite(array) | (array != np.trunc(array))
            misfit |= (array < float(info.min)) | (array >= float(info.max) + 1)
            if misfit.any():
                _refuse(array, misfit, field, f"does not fit {_describe(dtype)}")
        elif int(array.min()) < info.min or int(array.max()) > info.max:
            misfit = (array < info.min) | (array > info.max)
            _refuse(array, misfit, field, f"does not fit {_describe(dtype)}")
        return array
    if dtype.kind == "b":
        misfit = (array != 0) & (array != 1)
        if misfit.any():
            _refuse(array, misfit, field, "is neither 0 nor 1 (a bool field)")
        return array
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(dtype)
    overflow = np.isinf(converted) & np.isfinite(array)
    if overflow.any():
        _refuse(array, overflow, field, f"overflows {_describe(dtype)} to infinity")
    return converted


def _describe(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return f"{dtype.newbyteorder('=').name} ({info.min}..{info.max})"
    return dtype.newbyteorder("=").name


def _refuse(array: np.ndarray, misfit: np.ndarray, field: str, what: str) -> None:
    flat = np.flatnonzero(misfit)
    index = np.unravel_index(int(flat[0]), array.shape)
    position = index[0] if len(index) == 1 else tuple(int(i) for i in index)
    value = array[index].item()
    more = f" ({len(flat) - 1} more values do not fit either)" if len(flat) > 1 else ""
    raise InvalidRecordError(
        f"field {field!r}: value {value!r} at position {position} {what}{more}"
    )
