"""Byte requests as values, and the coalescing of nearby ranges into fewer requests.

A request is data (as in zarr-python's ``RangeByteRequest``): planners produce them without
doing I/O, so the sync and async read paths share every decision and differ only in how
the bytes arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Bytes ``[start, end)`` of the object at ``key`` (relative to the dataset root)."""

    key: str
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class SuffixRequest:
    """The last ``nbytes`` bytes of the object at ``key`` (a block's chunk index)."""

    key: str
    nbytes: int


@dataclass(frozen=True, slots=True)
class ObjectRequest:
    """The whole object at ``key`` (small metadata documents).

    With ``max_nbytes``, at most that many bytes plus one are fetched (one range request),
    so a hostile or damaged document cannot make a reader download gigabytes before it
    is refused as too large.
    """

    key: str
    max_nbytes: int | None = None


ByteRequest = RangeRequest | SuffixRequest | ObjectRequest


@dataclass(frozen=True, slots=True)
class CoalescedRange:
    """One request covering several member ranges of the same object.

    ``members`` are indices into the caller's request list.
    """

    key: str
    start: int
    end: int
    members: tuple[int, ...]


def coalesce(requests: Sequence[RangeRequest], *, gap: int, max_bytes: int) -> list[CoalescedRange]:
    """Merge ranges of one object that lie within ``gap`` bytes of each other.

    Fewer, larger requests win on object stores where first-byte latency dominates; the
    ``gap`` bounds the bytes fetched only to be thrown away, ``max_bytes`` bounds a single
    response so one huge request does not serialise what could run in parallel.
    """
    order = sorted(range(len(requests)), key=lambda i: (requests[i].key, requests[i].start))
    merged: list[CoalescedRange] = []
    key = ""
    start = end = 0
    members: list[int] = []
    for i in order:
        request = requests[i]
        if (
            members
            and request.key == key
            and request.start <= end + gap
            and max(end, request.end) - start <= max_bytes
        ):
            end = max(end, request.end)
            members.append(i)
            continue
        if members:
            merged.append(CoalescedRange(key, start, end, tuple(members)))
        key, start, end, members = request.key, request.start, request.end, [i]
    if members:
        merged.append(CoalescedRange(key, start, end, tuple(members)))
    return merged
