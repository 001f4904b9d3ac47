"""The checksum step of every read: crc32c per inner chunk, partial reads included.

A stored inner chunk is its bytes followed by their little-endian CRC-32C. Two ways to
check a run of chunks, one for each executor:

- fetched bytes (``check_span``): one CRC over the whole run, compared with the CRC every
  intact run of that many chunks has (it depends only on their count), so a window costs
  one call whatever its chunk count; only on a mismatch are chunks checked one by one, to
  name the damaged one;
- a mapped block (``check_mapped``): committed blocks never change, so each chunk is
  checked the first time this process reads it and flagged; a damaged chunk is never
  flagged, so every read that touches it keeps failing.
"""

from __future__ import annotations

from collections.abc import Callable

import google_crc32c
import numpy as np
from google_crc32c import value as crc32c_value

from rangestream.errors import ChecksumError, CorruptDataError

__all__ = [
    "CRC32C_RESIDUE",
    "CRC_NBYTES",
    "check_mapped",
    "check_span",
    "crc32c",
    "first_bad_chunk",
]

CRC_NBYTES = 4
#: CRC-32C of any message followed by its own little-endian CRC-32C: checking a stored
#: chunk against this constant verifies it in one call, without splitting off the trailer.
CRC32C_RESIDUE = 0x48674BC7

#: ``stored chunk size -> [CRC-32C of n intact stored chunks for n = 0, 1, ...]``.
_INTACT_RUNS: dict[int, list[int]] = {}


def crc32c(data: bytes | memoryview | np.ndarray) -> int:
    if isinstance(data, memoryview):  # google_crc32c takes bytes and arrays, not memoryviews
        data = np.frombuffer(data, dtype=np.uint8)
    return int(google_crc32c.value(data))  # type: ignore[arg-type]


def intact_crc(stored: int, count: int) -> int:
    """The CRC-32C of any ``count`` intact stored chunks of ``stored`` bytes each.

    An intact stored chunk always has the CRC ``CRC32C_RESIDUE``, and the CRC of a
    concatenation depends only on the parts' CRCs and lengths, so every run of ``count``
    intact chunks has one CRC, whatever the chunks hold; a single damaged chunk always
    changes it (the combination is invertible per chunk).
    """
    table = _INTACT_RUNS.get(stored)
    if table is None or len(table) <= count:
        table = list(table or [0])  # built aside, then published whole: threads may race
        body = bytes(stored - CRC_NBYTES)
        intact = body + crc32c(body).to_bytes(CRC_NBYTES, "little")
        while len(table) <= count:
            table.append(google_crc32c.extend(table[-1], intact))
        if len(_INTACT_RUNS) >= 64:  # layouts come from stored metadata: bound the cache
            _INTACT_RUNS.clear()
        _INTACT_RUNS[stored] = table
    return table[count]


def first_bad_chunk(data: np.ndarray, stored: int) -> int | None:
    """The first stored chunk of ``data`` (whole chunks) whose CRC does not match."""
    for number, chunk in enumerate(data.reshape(-1, stored)):
        if crc32c_value(chunk) != CRC32C_RESIDUE:
            return number
    return None


def check_span(
    data: bytes | memoryview,
    stored: int,
    first_chunk: int,
    where: Callable[[], str],
    *,
    verify: bool = True,
) -> np.ndarray:
    """``data`` (whole stored chunks from ``first_chunk`` of a block on) as a byte array,
    verified; ``ChecksumError`` naming the block's first damaged chunk otherwise.

    ``where`` builds the place for the message (object and byte range), only on error.
    ``verify=False`` only checks that ``data`` is whole chunks.
    """
    buffer = np.frombuffer(data, dtype=np.uint8)
    count = buffer.size // stored
    if count * stored != buffer.size:
        raise CorruptDataError(f"{where()}: {buffer.size} bytes is not a whole number of chunks")
    if not verify:
        return buffer
    whole = crc32c_value(data if type(data) is bytes else buffer)
    if whole != intact_crc(stored, count):
        bad = first_bad_chunk(buffer, stored)
        number = "?" if bad is None else first_chunk + bad
        raise ChecksumError(f"{where()}: checksum mismatch in inner chunk {number} of the block")
    return buffer


def check_mapped(
    data: np.ndarray,
    verified: bytearray,
    stored: int,
    first: int,
    end: int,
    where: Callable[[], str],
) -> None:
    """Check the not yet verified stored chunks ``[first, end)`` of a mapped block.

    ``data`` is the whole block's bytes, ``verified`` one flag per inner chunk; chunks that
    match their CRC are flagged, so a process checks each chunk of an immutable block once.
    """
    for chunk in range(first, end):
        if verified[chunk]:
            continue
        if crc32c_value(data[chunk * stored : (chunk + 1) * stored]) != CRC32C_RESIDUE:
            raise ChecksumError(f"{where()}: checksum mismatch in inner chunk {chunk} of the block")
        verified[chunk] = 1
