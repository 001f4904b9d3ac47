"""Turning ``reader[i]`` and ``reader[a:b]`` into checked positions."""

from __future__ import annotations

from typing import Any

import numpy as np

from rangestream.errors import OutOfRangeError


def positions(key: Any, length: int) -> tuple[list[int], bool]:
    """The positions ``key`` selects from ``length`` items, and whether it was a slice."""
    if isinstance(key, slice):
        return list(range(*key.indices(length))), True
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise TypeError(f"indices must be integers or slices, not {type(key).__name__}")
    index = int(key)
    if index < 0:
        index += length
    if not 0 <= index < length:
        raise OutOfRangeError(f"index {int(key)} is out of range for {length} items")
    return [index], False
