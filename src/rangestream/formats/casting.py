"""Storing values in a narrower dtype only when every value survives the cast.

numpy's ``astype`` wraps integers silently (``2**31`` stored as ``<i4`` reads back as
``-2**31``) and ``np.can_cast(..., "same_kind")`` allows that narrowing. Formats cast
through ``cast_fitting`` instead: the dtype kinds must be compatible, and then the values
themselves are checked, so a token id that does not fit the stored dtype is refused with
its value named rather than stored wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.errors import InvalidRecordError

__all__ = ["cast_fitting"]


def cast_fitting(values: np.ndarray, dtype: np.dtype[Any], what: str) -> np.ndarray:
    """``values`` as ``dtype``, or ``InvalidRecordError`` if a value would change.

    Integers (signed, unsigned or bool) go into any integer dtype whose range holds every
    value. Other casts must stay within a kind or widen it (numpy's ``same_kind``), and
    floats may lose precision but not overflow to infinity. Anything else (floats into
    integers, numbers into bools) is refused by kind, whatever the values.
    """
    source = values.dtype
    if source == dtype:
        return values
    integers = dtype.kind in "iu" and source.kind in "iub"
    if not integers and not np.can_cast(source, dtype, casting="same_kind"):
        raise InvalidRecordError(f"{what} has dtype {source}, which cannot be stored as {dtype}")
    if np.can_cast(source, dtype, casting="safe") or values.size == 0:
        return values.astype(dtype)
    if integers:  # signed and unsigned alike: the values decide
        info = np.iinfo(dtype)
        low, high = values.min(), values.max()
        if int(low) < info.min or int(high) > info.max:
            bad = low if int(low) < info.min else high
            raise InvalidRecordError(
                f"{what} holds the value {int(bad)}, outside the range of {dtype} "
                f"({info.min}..{info.max})"
            )
        return values.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(dtype)
    overflowed = np.isfinite(values) & ~np.isfinite(out)
    if overflowed.any():
        raise InvalidRecordError(
            f"{what} holds the value {values[overflowed].flat[0]!r}, which overflows {dtype}"
        )
    return out
