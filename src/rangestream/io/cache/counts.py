"""The directory's ``STATS`` file: hits, misses, bytes served and entries dropped, summed
over every process that used the directory (for ``rangestream cache``).

Why a file of sums and not one per process: ``rangestream cache`` reads one small file, and
a process adds its counts under the directory's lock (``budget.locked``), so no count is
lost between two processes adding theirs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rangestream.io.cache.entries import temp_path

__all__ = ["STATS_FIELDS", "add_to_stats", "read_stats"]

#: The counts, in the order a reader's ``counter.cache`` list holds them.
STATS_FIELDS = ("hits", "misses", "bytes_served", "dropped")


def read_stats(directory: Path) -> dict[str, int]:
    """The directory's accumulated counts (``hits``, ``misses``, ``bytes_served``...)."""
    try:
        loaded = json.loads((directory / "STATS").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): int(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def add_to_stats(directory: Path, counts: list[int]) -> None:
    """Add ``counts`` (:data:`STATS_FIELDS`) to ``STATS``, replaced whole (renamed into
    place, so a reader never sees it torn). Call under the directory's lock."""
    stats = read_stats(directory)
    for name, count in zip(STATS_FIELDS, counts, strict=True):
        stats[name] = stats.get(name, 0) + count
    temp = temp_path(directory, 0)
    temp.write_text(json.dumps(stats))
    os.replace(temp, directory / "STATS")
