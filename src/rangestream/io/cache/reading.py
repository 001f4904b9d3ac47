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
#: A range entry: ``(start, end, file name)``.
_Span = tuple[int, int, str]
#: Folder listings remembered per process (then all forgotten at once).
LISTINGS_KEPT = 4096


def _plan(spans: list[_Span], start: int, end: int) -> list[tuple[int, int, _Span | None]]:
    """``[start, end)`` cut into ``(at, upto, entry)`` segments, the longest entry at each
    point first; ``entry`` is ``None`` for a hole (up to the next entry that starts)."""
    near = [span for span in spans if span[0] < end and span[1] > start]
    plan: list[tuple[int, int, _Span | None]] = []
    at = start
    while at < end:
        best = None
        for span in near:
            if span[0] <= at < span[1] and (best is None or span[1] > best[1]):
                best = span
        if best is None:
            upto = min([span[0] for span in near if span[0] > at] + [end])
            plan.append((at, upto, None))
        else:
            upto = min(best[1], end)
            plan.append((at, upto, best))
        at = upto
    return plan


class EntryReader:
    """Reads entries for one cache (one per directory and process).

    Parameters
    ----------
    drop
        ``drop(path, accounted bytes)``: delete a damaged entry (it is not used again).
    """

    def __init__(self, drop: Callable[[str | Path, int], None]) -> None:
        self.verified: set[str] = set()
        self._drop = drop
        #: folder -> its range entries as ``(low, high, name)``, as last listed or written
        #: by this process: a range they cover is read without listing the folder again
        self._listed: dict[str, list[_Span]] = {}

    def assemble(self, folder: Path, start: int, end: int) -> Pieces:
        """Bytes ``[start, end)`` of an object from its range entries (the longest entry
        at each point first), and the holes no intact entry covers.

        Why a remembered listing: a hit (every byte covered by entries this process listed
        or wrote before) needs no ``listdir``, so an epoch served by the cache reads its
        entries as a local reader reads its blocks. Anything short of a hit lists the folder
        again, so a miss, and its holes, are what a fresh listing says; an entry evicted
        since (its file gone) makes the read list the folder again too.
        """
        base = os.fspath(folder)
        known = self._listed.get(base)
        if known is not None:
            plan = _plan(known, start, end)
            if all(span is not None for _at, _upto, span in plan):
                read = self._read(base, plan)
                if read is not None:
                    return read, []
        spans = self.list(base)
        pieces: list[tuple[int, bytes]] = []
        holes: list[tuple[int, int]] = []
        while True:
            plan = _plan(spans, start, end)
            pieces, holes = [], []
            for at, upto, span in plan:
                if span is None:
                    holes.append((at, upto))
                    continue
                low, high, name = span
                piece = self.slice(f"{base}/{name}", high - low, at - low, upto - at)
                if piece is None:  # dropped as damaged (or evicted): plan again without it
                    spans = [s for s in spans if s != span]
                    self._listed[base] = spans
                    break
                pieces.append((at, piece))
            else:
                return pieces, holes

    def list(self, folder: str) -> list[_Span]:
        """The range entries in ``folder`` now (remembered for ``assemble``)."""
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            names = []
        spans = []
        for name in names:
            match = RANGE_ENTRY.match(name)
            if match is not None:
                spans.append((int(match.group(1)), int(match.group(2)), name))
        if len(self._listed) >= LISTINGS_KEPT and folder not in self._listed:
            self._listed.clear()
        self._listed[folder] = spans
        return spans

    def wrote(self, folder: str, low: int, high: int, name: str) -> None:
        """Note an entry this process just put in place (if its folder's listing is kept)."""
        known = self._listed.get(folder)
        if known is not None and (low, high, name) not in known:
            known.append((low, high, name))

    def forget_listings(self, folder: str | None = None) -> None:
        """Forget a folder's listing (or all): entries were deleted (dropped, evicted)."""
        if folder is None:
            self._listed.clear()
        else:
            self._listed.pop(folder, None)

    def _read(self, base: str, plan: list[tuple[int, int, _Span | None]]) -> list | None:
        """The pieces of a plan without holes, or ``None`` if an entry is gone or bad."""
        pieces = []
        for at, upto, span in plan:
            assert span is not None
            low, high, name = span
            piece = self.slice(f"{base}/{name}", high - low, at - low, upto - at)
            if piece is None:
                return None
            pieces.append((at, piece))
        return pieces

    def whole(self, path: Path) -> bytes | None:
        """The payload of the entry at ``path`` (a suffix, an object), or ``None``."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return None
        return self.slice(path, size - HEADER, 0, size - HEADER)

    def slice(self, path: str | Path, payload: int, offset: int, nbytes: int) -> bytes | None:
        """``nbytes`` at ``offset`` of an entry's payload; the entry is checked on first use."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # evicted by another process since the listing
        try:
            name = os.fspath(path)
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
