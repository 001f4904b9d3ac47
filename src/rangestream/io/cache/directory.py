"""What a cache directory holds, for ``rangestream cache``, and clearing it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rangestream.io.cache.budget import LEASES, locked, scan_leases, write_size
from rangestream.io.cache.byte_cache import read_stats, scan_entries
from rangestream.io.cache.claims import CLAIMS

__all__ = ["CacheSummary", "clear_cache", "summarize_cache"]


@dataclass
class CacheSummary:
    """Sizes and counts of one cache directory.

    ``bytes`` sums the entry files (headers included): what the budget bounds.
    ``datasets`` maps each dataset URL to ``[entries, bytes]``; ``hits`` and ``misses``
    count requests over every process that used the directory.
    """

    directory: str
    bytes: int = 0
    entries: int = 0
    datasets: dict[str, list[int]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    bytes_served: int = 0
    dropped: int = 0

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "directory": self.directory,
            "bytes": self.bytes,
            "entries": self.entries,
            "datasets": {url: {"entries": n, "bytes": b} for url, (n, b) in self.datasets.items()},
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "bytes_served": self.bytes_served,
            "dropped": self.dropped,
        }


def summarize_cache(directory: str | os.PathLike[str]) -> CacheSummary:
    """Walk a cache directory (no lock taken: a snapshot while others write)."""
    root = Path(directory)
    if not (root / "tmp").is_dir():
        raise FileNotFoundError(f"{root} is not a rangestream cache directory")
    summary = CacheSummary(str(root))
    entries, _temps = scan_entries(root)
    for _mtime, size, path in entries:
        dataset = path.parents[2]
        try:
            url = (dataset / "URL").read_text().strip()
        except FileNotFoundError:
            url = dataset.name
        counts = summary.datasets.setdefault(url, [0, 0])
        counts[0] += 1
        counts[1] += size
        summary.entries += 1
        summary.bytes += size
    stats = read_stats(root)
    summary.hits = stats.get("hits", 0)
    summary.misses = stats.get("misses", 0)
    summary.bytes_served = stats.get("bytes_served", 0)
    summary.dropped = stats.get("dropped", 0)
    return summary


def clear_cache(directory: str | os.PathLike[str]) -> int:
    """Delete every entry and count of a cache directory; the bytes freed.

    Readers still running keep working: a missing entry is a miss. ``SIZE`` is set to what
    they still hold (their slabs and files in transit), so the bound holds across a clear.
    """
    root = Path(directory)
    summary = summarize_cache(root)
    with locked(root):
        for child in root.iterdir():
            if child.is_dir() and child.name not in ("tmp", CLAIMS, LEASES):
                shutil.rmtree(child, ignore_errors=True)
        (root / "STATS").unlink(missing_ok=True)
        write_size(root, scan_leases(root) + scan_entries(root)[1])
    return summary.bytes
