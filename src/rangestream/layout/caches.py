"""Bounded caches readers keep: parsed block indexes, and small arrays by key.

A block index is 16 bytes per inner chunk; caching it is what makes a window inside a known
block of a non-dense layout cost one request. Readers keep small index structures the same
way (a shard's document offsets, its coarse run index, recent chunks of runs), so repeated
reads skip a round of requests, within a byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

__all__ = ["ArrayCache", "BlockIndexCache"]


class ArrayCache:
    """Arrays by key, least recently used evicted first once ``max_bytes`` is exceeded.

    The most recent entry is always kept, even alone over budget: a read that needs it now
    must find it after putting it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[Hashable, np.ndarray] = OrderedDict()

    def get(self, key: Hashable) -> np.ndarray | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, value: np.ndarray) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = value
        self.nbytes += value.nbytes
        while self.nbytes > self.max_bytes and len(self._entries) > 1:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes

    def __len__(self) -> int:
        return len(self._entries)


class BlockIndexCache(ArrayCache):
    """Parsed chunk indexes of recently used blocks (a few MiB by default)."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        super().__init__(max_bytes)
