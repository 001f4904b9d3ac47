"""Checks of untrusted numbers in a manifest: shard ids, lengths, inherited shards.

The root and the shard table are both read from the store, and both are checked with
these, so a damaged or foreign one is refused (``MetadataError``) before a read plans
with it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rangestream.errors import MetadataError

MAX_SHARDS = 1 << 24
#: Bound on the rows of one array over all shards: cumulative sums stay far inside int64.
MAX_TOTAL_ROWS = 1 << 60
COMMIT_ID = re.compile(r"^[0-9a-f]{32}$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise MetadataError(f"{where}: {message}")


def check_inherited_shards(
    inherited: dict[str, list[int]], shard_ids: np.ndarray, where: str
) -> None:
    for commit, listed in inherited.items():
        require(
            bool(np.isin(np.asarray(listed, dtype=np.int64), shard_ids).all()),
            where,
            f"inherited shards of {commit} must be distinct shards of this version",
        )


def check_ids(shard_ids: np.ndarray, where: str) -> None:
    require(bool((shard_ids >= 0).all()), where, "shard ids must be non-negative")
    require(bool((np.diff(shard_ids) > 0).all()), where, "shard ids must be strictly increasing")


def check_lengths(values: np.ndarray, name: str, where: str) -> None:
    require(bool((values >= 0).all()), where, f"{name} lengths must be non-negative")
    require(bool((values < 1 << 50).all()), where, f"{name} lengths are out of range")
    require(
        float(values.sum(dtype=np.float64)) < MAX_TOTAL_ROWS,
        where,
        f"{name} lengths add up to more than {MAX_TOTAL_ROWS} rows",
    )


def int_list(value: Any, where: str) -> list[int]:
    """``value`` if it is a list of integers that fit in int64 (numpy would overflow)."""
    if not isinstance(value, list) or not all(
        type(item) is int and -(1 << 63) <= item < 1 << 63 for item in value
    ):
        raise MetadataError(f"{where} must be a list of 64-bit integers")
    return value
