"""A writer's uploads: whole blocks per array, and pieces spilled under a memory budget.

Split from the session and the commit so the one thing that bounds a writer's memory
(what is in flight, what waits in memory, what was spilled) is read in one place.

Each shard's partial last block waits in memory until it fills; when the writer's budget
is exceeded (``DatasetWriter``), the rows in memory of the least recently appended shards
are uploaded as raw *pieces* under ``data/<commit>/spill/<part id>/`` and dropped. A
block with pieces is assembled when it fills (or at close): its pieces are read back,
joined with the rows still in memory and uploaded as the block. Each spill costs one put;
each block assembled from ``n`` pieces costs ``n`` gets; the writer deletes its spill
prefix once at close (one listing and a batched delete). Bytes move about twice instead
of once for the spilled rows, which is what a budget far below ``shards x block`` buys.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from rangestream.errors import StorageError
from rangestream.io.local import LocalStore
from rangestream.io.process import io_loop, run_blocking
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.dtypes import little_endian
from rangestream.layout.zarr_json import array_document, dumps

#: Uploads in flight per writer; bounds memory to about this many blocks.
MAX_PENDING_UPLOADS = 8


class Uploader:
    """Puts objects: directly for local files, pipelined on the I/O loop otherwise."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._pending: deque[Future[None]] = deque()

    def put(self, key: str, data: bytes) -> None:
        if isinstance(self.store, LocalStore):
            self.store.put_sync(key, data)
            return
        while len(self._pending) >= MAX_PENDING_UPLOADS:
            self._pending.popleft().result()
        self._pending.append(asyncio.run_coroutine_threadsafe(self.store.put(key, data), io_loop()))

    def get_all(self, keys: Sequence[str]) -> list[bytes]:
        """Whole objects, fetched together (pieces of a block being assembled)."""
        store = self.store
        if isinstance(store, LocalStore):
            return [store.get_sync(key) for key in keys]

        async def fetch() -> list[bytes]:
            return list(await asyncio.gather(*(store.get(key) for key in keys)))

        return asyncio.run_coroutine_threadsafe(fetch(), io_loop()).result()

    def delete_prefix(self, prefix: str) -> None:
        if isinstance(self.store, LocalStore):
            run_blocking(self.store.delete_prefix(prefix))
            return
        asyncio.run_coroutine_threadsafe(self.store.delete_prefix(prefix), io_loop()).result()

    def flush(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def drop(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()


class ArrayWriter:
    """Rows of one array of one shard, uploaded one full block at a time.

    The rows of the block being filled are in memory (``buffered`` bytes), or partly in
    pieces that ``spill`` uploaded (``_pieces``: their sizes; piece ``i`` of block ``b`` is
    ``<spill_key>/<b>.<i>``), which the block's assembly reads back.
    """

    def __init__(self, key: str, layout: ArrayLayout, uploader: Uploader, spill_key: str) -> None:
        self.key = key
        self.layout = layout
        self.uploader = uploader
        self.spill_key = spill_key
        self.length = 0
        self._buffer = bytearray()
        self._blocks_written = 0
        self._pieces: list[int] = []
        self._piece_bytes = 0
        self._block_nbytes = layout.block_rows * layout.row_nbytes

    @property
    def buffered(self) -> int:
        """Bytes of rows held in memory."""
        return len(self._buffer)

    def append(self, rows: np.ndarray) -> None:
        if rows.dtype != self.layout.dtype and little_endian(rows.dtype) == self.layout.dtype:
            rows = rows.astype(self.layout.dtype)  # stored little-endian, values equal
        data = np.ascontiguousarray(rows).view(np.uint8).reshape(-1)
        self._buffer += data.data
        self.length += data.size // self.layout.row_nbytes
        while self._piece_bytes + len(self._buffer) >= self._block_nbytes:
            take = self._block_nbytes - self._piece_bytes
            block = self._assemble(self._buffer[:take])
            del self._buffer[:take]
            self._upload(block, self.layout)

    def spill(self) -> int:
        """Upload the rows held in memory as a piece of the current block; bytes freed."""
        freed = len(self._buffer)
        if freed:
            self.uploader.put(self._piece_key(len(self._pieces)), bytes(self._buffer))
            self._pieces.append(freed)
            self._piece_bytes += freed
            self._buffer = bytearray()
        return freed

    def _piece_key(self, piece: int) -> str:
        return f"{self.spill_key}/{self._blocks_written}.{piece}"

    def _assemble(self, tail: bytes | bytearray) -> bytes | bytearray:
        """The current block's rows: its pieces, read back, then ``tail``."""
        if not self._pieces:
            return tail
        self.uploader.flush()  # the pieces must have landed before they are read back
        keys = [self._piece_key(piece) for piece in range(len(self._pieces))]
        datas = self.uploader.get_all(keys)
        for key, nbytes, data in zip(keys, self._pieces, datas, strict=True):
            if len(data) != nbytes:
                raise StorageError(
                    f"{self.uploader.store.describe(key)}: a spilled piece of {nbytes} bytes "
                    f"read back as {len(data)} bytes"
                )
        self._pieces.clear()
        self._piece_bytes = 0
        return b"".join([*datas, bytes(tail)])

    def _upload(self, block: bytes | bytearray, layout: ArrayLayout) -> None:
        key = layout.block_key(self.key, self._blocks_written)
        self.uploader.put(key, encode_block(layout, bytes(block)))
        self._blocks_written += 1

    def finish(self, attributes: dict[str, Any] | None = None) -> int:
        # an array that never filled a block is stored as one block of its own length
        layout = self.layout.stored_for(self.length) if not self._blocks_written else self.layout
        rest = self._assemble(self._buffer)
        if rest:
            self._upload(rest, layout)
        self._buffer = bytearray()
        document = array_document(layout, self.length, attributes)
        self.uploader.put(f"{self.key}/zarr.json", dumps(document))
        return self.length
