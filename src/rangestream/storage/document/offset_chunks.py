"""The offsets of documents a reader keeps: inner chunks within a byte budget, compactly.

Offsets are read by range on demand, one inner chunk of ``payload_offsets`` at a time,
never a shard's whole array; what was read is kept here so the next document of the same
chunk costs one round instead of two. Each chunk is kept as its first offset and the
others relative to it as 32-bit integers, about 5 bytes per document with the
bookkeeping, so the default 64 MiB holds the offsets of about 12 million documents.
"""

from __future__ import annotations

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
        self._bases: list[np.ndarray] = []
        self._relative: list[np.ndarray] = []
        self._referenced = bytearray()
        self._hand = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        """Bytes of the slots allocated so far (values, reference bits)."""
        return (
            sum(a.nbytes for a in self._bases)
            + sum(a.nbytes for a in self._relative)
            + (len(self._referenced))
        )

    def value(self, key: Hashable, row: int) -> int | None:
        """Offset ``row`` of chunk ``key`` if the chunk is kept, else ``None``."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        self._referenced[slot] = 1
        page, at = divmod(slot, _SLOTS_PER_PAGE)
        return int(self._bases[page][at]) + int(self._relative[page][at, row])

    def gather(self, keys: list[int], rows: list[int]) -> list[int] | None:
        """Offsets ``rows[i]`` of chunks ``keys[i]``, if every chunk is kept; else ``None``
        and nothing is marked (the caller reads the missing chunks). One dictionary lookup
        per key and one numpy gather per page of slots (a batch of documents:
        ``OpenedDocuments.read_mapped``)."""
        get = self._slots.get
        found = [get(key) for key in keys]
        if None in found:
            return None
        referenced = self._referenced
        for slot in found:
            referenced[slot] = 1
        if len(self._bases) == 1:  # index arrays: numpy converts lists slower per index
            at = np.array(found, dtype=np.intp)
            return (self._bases[0][at] + self._relative[0][at, np.array(rows, np.intp)]).tolist()
        slots = np.asarray(found, dtype=np.int64)
        at_rows = np.asarray(rows, dtype=np.int64)
        pages, at = np.divmod(slots, _SLOTS_PER_PAGE)
        out = np.empty(len(slots), dtype=np.int64)
        for page in np.unique(pages).tolist():
            mask = pages == page
            out[mask] = self._bases[page][at[mask]] + self._relative[page][at[mask], at_rows[mask]]
        return out.tolist()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    def put(self, key: Hashable, offsets: np.ndarray) -> None:
        """Keep ``offsets`` (at most ``chunk_rows`` int64 values) as chunk ``key``."""
        if not self.capacity or key in self._slots or not len(offsets):
            return
        base = int(offsets[0])
        relative = offsets - base
        if int(relative[-1]) >= _UINT32_SPAN or (
            len(relative) > 1 and (np.diff(relative) < 0).any()
        ):
            return
        slot = self._free_slot()
        self._slots[key] = slot
        self._keys[slot] = key
        self._referenced[slot] = 0
        page, at = divmod(slot, _SLOTS_PER_PAGE)
        self._bases[page][at] = base
        self._relative[page][at, : len(relative)] = relative

    def _free_slot(self) -> int:
        used = len(self._keys)
        if used < self.capacity:
            if used % _SLOTS_PER_PAGE == 0:
                slots = min(_SLOTS_PER_PAGE, self.capacity - used)
                self._bases.append(np.zeros(slots, dtype=np.int64))
                self._relative.append(np.zeros((slots, self.chunk_rows), dtype=np.uint32))
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
