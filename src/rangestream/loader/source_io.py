"""Each source's requests and bytes, counted where they are made and summed by the loader.

Workers read; the loader in the training process reports (``source_stats``). So a worker
sends, with every batch, what each source's reader made since its previous batch, and the
loader adds it up: exact whatever the number of workers, restarts or persistent workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SourceIO"]


class SourceIO:
    """Requests and bytes of the readers of one process, as deltas between batches."""

    def __init__(self) -> None:
        self._reader: Any = None
        self._seen: list[tuple[int, int]] = []
        self._counters: list[Callable[[], tuple[int, int]]] = []

    def note(self, reader: Any) -> None:
        """Count ``reader`` from now on (a mixture's ``readers``, or the reader itself)."""
        if reader is not self._reader:
            self._reader = reader
            self._seen = []
            self._counters = []

    def delta(self) -> list[tuple[int, int]] | None:
        """``(requests, bytes)`` per source since the previous call; ``None`` before any
        reader was noted."""
        reader = self._reader
        if reader is None:
            return None
        if not self._counters:
            readers = getattr(reader, "readers", None) or [reader]
            self._counters = [_io_counts(one) for one in readers]
        now = [counts() for counts in self._counters]
        seen = self._seen or [(0, 0)] * len(now)
        self._seen = now
        return [(r - r0, b - b0) for (r, b), (r0, b0) in zip(now, seen, strict=True)]


def _io_counts(reader: Any) -> Callable[[], tuple[int, int]]:
    """Requests and bytes a reader has made so far, read cheaply on every batch.

    A dataset reader's ``stats`` is a snapshot (about 20 us, per batch and source); the live
    counter behind it (``storage_reader.opened.reader.counter``, an ``IOCounter``) is summed
    in well under a microsecond. Readers without it fall back to ``stats``, and readers
    without either count nothing.
    """
    opened = getattr(getattr(reader, "storage_reader", None), "opened", None)
    counter = getattr(getattr(opened, "reader", None), "counter", None)
    kinds = getattr(counter, "kinds", None)
    if isinstance(kinds, dict):

        def live() -> tuple[int, int]:
            requests = nbytes = 0
            for count, size in list(kinds.values()):
                requests += count
                nbytes += size
            return requests, nbytes

        return live
    if hasattr(reader, "stats"):
        return lambda: (reader.stats.requests, reader.stats.bytes)
    return lambda: (0, 0)
