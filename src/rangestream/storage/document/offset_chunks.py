"""The offsets of documents a reader keeps: inner chunks within a byte budget, compactly.

Offsets are read by range on demand, one inner chunk of ``payload_offsets`` at a time,
never a shard's whole array; what was read is kept here so the next document of the same
chunk costs one round instead of two. Each chunk is kept as its first offset and the
others relative to it as 32-bit integers, about 5 bytes per document with the
bookkeeping, so the default 64 MiB holds the offsets of about 12 million documents.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable

import numpy as np

#: Slots of the offsets cache are allocated this many at a time, as chunks arrive.
_SLOTS_PER_PAGE = 1024
#: Python bytes per cached chunk besides its values (its key, dict entry, list slot).
_SLOT_BOOKKEEPING = 160
_UINT32_SPAN = 1 << 32
#: Cached chunks are keyed ``(shard position << PART_SHIFT) + chunk`` (an int hashes faster
#: than a tuple): chunks of one shard number far fewer than 2**44.
PART_SHIFT = 44


class OffsetChunks:
    """Inner chunks of documents' offsets, of any shards, within a byte budget.

    A chunk of ``chunk_rows`` offsets is kept as its first offset and the rest relative to
    it (uint32), in slots allocated page by page as chunks arrive (so an idle reader holds
    nothing); when all slots are used, a CLOCK sweep reuses the slot of a chunk not looked
    up since the last sweep. Chunks whose offsets span 4 GiB or more, or decrease (damage,
    reported by the read), are not kept.

    The slots are flat ``array.array``s (slot ``s`` holds relative offsets
    ``[s * chunk_rows, (s + 1) * chunk_rows)``): indexing one gives a Python int without a
    numpy scalar, which is what a batch of documents needs (``pairs``: two offsets each).

    Parameters
    ----------
    max_bytes
        Bound on the memory of the slots and their bookkeeping.
    chunk_rows
        Offsets per chunk (the rows of one inner chunk of ``payload_offsets``).
    """

    def __init__(self, max_bytes: int, chunk_rows: int) -> None:
        self.chunk_rows = chunk_rows
        self.slot_nbytes = 8 + 4 * chunk_rows + 1 + _SLOT_BOOKKEEPING
        self.capacity = max(0, max_bytes) // self.slot_nbytes
        self._slots: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._bases = array("q")
        self._relative = array("I")
        self._referenced = bytearray()
        self._hand = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        """Chunks that can be kept before one is evicted."""
        return self.capacity - len(self._slots)

    @property
    def nbytes(self) -> int:
        """Bytes of the slots allocated so far (values, reference bits)."""
        return (
            len(self._bases) * self._bases.itemsize
            + len(self._relative) * self._relative.itemsize
            + len(self._referenced)
        )

    def value(self, key: Hashable, row: int) -> int | None:
        """Offset ``row`` of chunk ``key`` if the chunk is kept, else ``None``."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        self._referenced[slot] = 1
        return self._bases[slot] + self._relative[slot * self.chunk_rows + row]

    def pairs(self, keys: list[int], rows: list[int]) -> list[int] | None:
        """The offsets of documents ``rows[i]`` and ``rows[i] + 1`` of the shard whose chunks
        are keyed ``keys[i] + chunk`` (``keys[i]`` is ``position << PART_SHIFT``), flat:
        ``[start0, end0, start1, end1, ...]``; ``None`` as soon as a chunk is not kept (the
        caller reads the missing chunks; chunks looked up before it are marked used, as the
        read will use them). A batch of documents: ``MappedReads``."""
        get, referenced = self._slots.get, self._referenced
        bases, relative, per = self._bases, self._relative, self.chunk_rows
        out: list[int] = []
        append = out.append
        for key, row in zip(keys, rows, strict=True):
            chunk, at = divmod(row, per)
            slot = get(key + chunk)
            if slot is None:
                return None
            referenced[slot] = 1
            base, at = bases[slot], slot * per + at
            append(base + relative[at])
            if row % per + 1 < per:
                append(base + relative[at + 1])
                continue
            slot = get(key + chunk + 1)  # the last document of a chunk ends in the next
            if slot is None:
                return None
            referenced[slot] = 1
            append(bases[slot] + relative[slot * per])
        return out

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def put(self, key: Hashable, offsets: np.ndarray) -> None:
        """Keep ``offsets`` (at most ``chunk_rows`` int64 values) as chunk ``key``."""
        if not self.capacity or key in self._slots or not len(offsets):
            return
        base = int(offsets[0])
        relative = np.asarray(offsets, dtype=np.int64) - base
        if int(relative[-1]) >= _UINT32_SPAN or (
            len(relative) > 1 and (np.diff(relative) < 0).any()
        ):
            return
        slot = self._free_slot()
        self._slots[key] = slot
        self._keys[slot] = key
        self._referenced[slot] = 0
        self._bases[slot] = base
        at = slot * self.chunk_rows
        self._relative[at : at + len(relative)] = array("I", relative.astype("=u4").tobytes())

    def _free_slot(self) -> int:
        used = len(self._keys)
        if used < self.capacity:
            if used % _SLOTS_PER_PAGE == 0:
                slots = min(_SLOTS_PER_PAGE, self.capacity - used)
                self._bases.frombytes(bytes(8 * slots))
                self._relative.frombytes(bytes(4 * slots * self.chunk_rows))
                self._referenced.extend(bytes(slots))
            self._keys.append(None)
            return used
        referenced, hand = self._referenced, self._hand
        while referenced[hand]:  # CLOCK: a second chance for chunks looked up since
            referenced[hand] = 0
            hand = (hand + 1) % used
        self._hand = (hand + 1) % used
        del self._slots[self._keys[hand]]
        return hand
