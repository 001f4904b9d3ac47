"""Ground-truth datasets for the reliability tests, and raw access to their stored objects.

Data is generated from a seed with numpy, so every expectation is computed independently
of the code under test; objects are read and damaged through a plain ``ObjectStore``, the
way a failing disk or a careless tool would, not through the storage classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from rangestream import DocumentStorage, StreamNumpyFormat, StreamStorage
from rangestream.io import LocalStore, ObjectStore, open_store
from rangestream.io.process import run_blocking as run_sync
from rangestream.layout.block import ArrayLayout
from rangestream.types import DocumentStorageFormat

TOKENS = np.dtype([("tokens", "<i4")])
#: Small chunks and blocks: many objects and chunks from little data.
# 16 inner chunks of 64 bytes per block; block_bytes bounds the stored object: each chunk
# adds its 4-byte crc32c and a 16-byte index entry, the index its own crc32c.
SMALL = {"chunk_bytes": 64, "block_bytes": 16 * (64 + 4 + 16) + 4}


class BytesFormat(DocumentStorageFormat[bytes, bytes]):
    """Documents are raw bytes: no pickle anywhere on the read path."""

    def pack(self, data: bytes) -> bytes:
        return bytes(data)

    def unpack(self, encoded_data: Any, shard: int) -> bytes:
        return bytes(encoded_data)


@dataclass(frozen=True)
class TokenData:
    """A written stream dataset and what it must read back as."""

    storage: StreamStorage
    tokens: np.ndarray  # every element, in global (shard by shard) order
    shard_lengths: list[int]


@dataclass(frozen=True)
class DocumentData:
    storage: DocumentStorage
    documents: list[bytes]  # in global order


def token_records(seed: int, shards: int, tokens_per_shard: int) -> dict[int, list[np.ndarray]]:
    """Records of 1..999 tokens per shard, ``tokens_per_shard`` tokens in each shard."""
    rng = np.random.default_rng(seed)
    records: dict[int, list[np.ndarray]] = {}
    for shard in range(shards):
        left, out = tokens_per_shard, []
        while left:
            n = int(min(left, rng.integers(1, 1000)))
            out.append(rng.integers(0, 2**31 - 1, n, dtype="<i4"))
            left -= n
        records[shard] = out
    return records


def token_ground_truth(seed: int, shards: int = 3, tokens_per_shard: int = 20_000) -> np.ndarray:
    """Every token ``write_tokens`` writes with these arguments, in global order."""
    records = token_records(seed, shards, tokens_per_shard)
    return np.concatenate([r for shard in range(shards) for r in records[shard]])


def tokens_storage(url: str, storage_options: dict[str, Any] | None = None) -> StreamStorage:
    return StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=storage_options)


def write_tokens(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    shards: int = 3,
    tokens_per_shard: int = 20_000,
    overwrite: bool = False,
    **options: Any,
) -> TokenData:
    records = token_records(seed, shards, tokens_per_shard)
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=storage_options,
                            **options)  # fmt: skip
    with storage.sync_writer(overwrite=overwrite) as writer:
        for shard in range(shards):
            for record in records[shard]:
                writer.append(shard, {"tokens": record})
    tokens = np.concatenate([r for shard in range(shards) for r in records[shard]])
    return TokenData(storage, tokens, [tokens_per_shard] * shards)


def write_documents(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    count: int = 200,
    shards: int = 2,
    **options: Any,
) -> DocumentData:
    rng = np.random.default_rng(seed)
    documents = [rng.bytes(int(n)) for n in rng.integers(0, 700, count)]
    storage = DocumentStorage(url, BytesFormat(), storage_options=storage_options, **options)
    per_shard: dict[int, list[bytes]] = {shard: [] for shard in range(shards)}
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i % shards, document)
            per_shard[i % shards].append(document)
    ordered = [d for shard in range(shards) for d in per_shard[shard]]
    return DocumentData(storage, ordered)


class RawObjects:
    """The objects of one dataset, read and written around the storage classes."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.store: ObjectStore = open_store(url, storage_options)

    def _run(self, coroutine: Any) -> Any:
        async def run() -> Any:
            try:
                return await coroutine
            finally:
                await self.store.aclose()

        return run_sync(run())

    def get(self, key: str) -> bytes:
        return bytes(self._run(self.store.get(key)))

    def put(self, key: str, data: bytes) -> None:
        self._run(self.store.put(key, data))

    def delete(self, key: str) -> None:
        """Remove the one object ``key``."""
        if isinstance(self.store, LocalStore):
            (self.store.root / key).unlink()
            return
        import fsspec

        protocol = self.url.split("://", 1)[0]
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self.storage_options)
        fs.rm_file(f"{self.url}/{key}")

    def list(self, prefix: str) -> list[str]:
        return list(self._run(self.store.list(prefix)))

    def describe(self, key: str) -> str:
        return self.store.describe(key)

    def root(self) -> dict[str, Any]:
        return dict(json.loads(self.get("zarr.json")))

    def put_root(self, document: dict[str, Any]) -> None:
        self.put("zarr.json", json.dumps(document).encode())

    def attributes(self) -> dict[str, Any]:
        return dict(self.root()["attributes"]["rangestream"])

    def array_key(self, shard: int, name: str) -> str:
        return f"{self.attributes()['data_prefix']}/shards/{shard}/{name}"

    def layout(self, name: str, shard: int | None = None) -> ArrayLayout:
        """Array ``name``'s layout in the manifest, or as shard ``shard`` stores it (its
        ``zarr.json``: from format version 2 an array of one block declares its own size)."""
        layout = ArrayLayout.from_json(self.attributes()["arrays"][name], name)
        if shard is None:
            return layout
        document = json.loads(self.get(f"{self.array_key(shard, name)}/zarr.json"))
        rows = document["chunk_grid"]["configuration"]["chunk_shape"][0]
        return ArrayLayout(
            layout.dtype, layout.row_shape, layout.chunk_rows, rows, layout.dense_chunks
        )

    def block_key(self, shard: int, name: str, block: int) -> str:
        return self.layout(name).block_key(self.array_key(shard, name), block)

    def flip(self, key: str, offset: int) -> None:
        """Invert every bit of the byte at ``offset`` of the object ``key``."""
        data = bytearray(self.get(key))
        data[offset] ^= 0xFF
        self.put(key, bytes(data))

    def truncate(self, key: str, nbytes: int) -> None:
        """Drop the last ``nbytes`` bytes of the object ``key``."""
        data = self.get(key)
        self.put(key, data[: len(data) - nbytes])
