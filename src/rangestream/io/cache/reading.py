"""Reading entries: the pieces of a range out of an object's entries, each entry checked once.

Why its own state: a process checks an entry's length and CRC the first time it reads it
(reading it whole), then trusts it and reads only the bytes asked for; the set of entries
this process has checked lives here, beside the reads that use it. A damaged entry is
handed to ``drop`` (the cache deletes it, uncounts its bytes and counts the drop) and the
range is reported as a hole, to be fetched again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from rangestream.io.cache.entries import HEADER, RANGE_ENTRY, intact

__all__ = ["EntryReader", "Pieces"]

#: ``(offset, bytes)`` pieces a cache held of a range, and the ``(start, end)`` holes.
Pieces = tuple[list[tuple[int, bytes]], list[tuple[int, int]]]


class EntryReader:
    """Reads entries for one cache (one per directory and process).

    Parameters
    ----------
    drop
        ``drop(path, accounted bytes)``: delete a damaged entry (it is not used again).
    """

    def __init__(self, drop: Callable[[Path, int], None]) -> None:
        self.verified: set[str] = set()
        self._drop = drop

    def assemble(self, folder: Path, start: int, end: int) -> Pieces:
        """Bytes ``[start, end)`` of an object from its range entries (the longest entry
        at each point first), and the holes no intact entry covers."""
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return [], [(start, end)]
        spans = []
        for name in names:
            match = RANGE_ENTRY.match(name)
            if match is not None:
                low, high = int(match.group(1)), int(match.group(2))
                if low < end and high > start:
                    spans.append((low, high, name))
        pieces: list[tuple[int, bytes]] = []
        holes: list[tuple[int, int]] = []
        at = start
        while at < end:
            best = None
            for low, high, name in spans:
                if low <= at < high and (best is None or high > best[1]):
                    best = (low, high, name)
            if best is None:  # a hole up to the next entry that starts later
                upto = min([low for low, _h, _n in spans if low > at] + [end])
                holes.append((at, upto))
                at = upto
                continue
            low, high, name = best
            upto = min(high, end)
            piece = self.slice(folder / name, high - low, at - low, upto - at)
            if piece is None:  # dropped as damaged (or evicted): fetched again
                spans.remove(best)
                continue
            pieces.append((at, piece))
            at = upto
        return pieces, holes

    def whole(self, path: Path) -> bytes | None:
        """The payload of the entry at ``path`` (a suffix, an object), or ``None``."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        return self.slice(path, size - HEADER, 0, size - HEADER)

    def slice(self, path: Path, payload: int, offset: int, nbytes: int) -> bytes | None:
        """``nbytes`` at ``offset`` of an entry's payload; the entry is checked on first use."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # evicted by another process since the listing
        try:
            name = str(path)
            if name not in self.verified:
                whole = os.pread(fd, HEADER + payload + 1, 0)
                if not intact(whole, payload):
                    self._drop(path, HEADER + payload)  # as accounted when written
                    return None
                self.verified.add(name)
                data = whole[HEADER + offset : HEADER + offset + nbytes]
            else:
                data = os.pread(fd, nbytes, HEADER + offset)
                if len(data) != nbytes:  # truncated since it was checked
                    self.verified.discard(name)
                    self._drop(path, HEADER + payload)
                    return None
        finally:
            os.close(fd)
        with suppress(FileNotFoundError):
            os.utime(path)  # recency, for eviction across processes
        return data
