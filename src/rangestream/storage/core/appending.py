"""Appending to a committed version: what may be appended, and the version it extends.

Every shard of a version shares one layout per array, so the appended shards must be cut
as the committed ones were; the checks live here so the writer and the commit apply the
same ones.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from rangestream.errors import CommitError, SchemaMismatchError
from rangestream.layout.manifest import Manifest
from rangestream.storage.core.options import LayoutOptions

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind

K = TypeVar("K", bound="StorageKind")


def check_appendable(storage: StorageKind, base: Manifest) -> None:
    """Refuse to append ``storage``'s records to ``base``: another kind, format or layout.

    Every shard of a version shares one layout per array, so the appended shards must be
    cut as the committed ones were.
    """
    where = storage.url
    if base.kind != storage.kind:
        raise SchemaMismatchError(
            f"{where} holds a {base.kind!r} dataset; a {storage.kind!r} write cannot append to it"
        )
    check_appendable_version(base, where)
    storage.check_schema(base)
    layouts = storage.array_layouts()
    if set(layouts) != set(base.arrays):
        raise SchemaMismatchError(
            f"{where} stores arrays {sorted(base.arrays)}, the appended records {sorted(layouts)}"
        )
    for name, layout in layouts.items():
        stored = base.arrays[name]
        if layout != stored:
            raise SchemaMismatchError(
                f"{where}: array {name!r} is stored as {stored}, the appended shards would be "
                f"{layout}; append with the chunk_bytes and block_bytes of the first write"
            )


def check_appendable_version(base: Manifest, where: str) -> None:
    """Refuse to append to a version 1 dataset: its arrays of one block are stored with
    full blocks, which a version 2 manifest would misdescribe (``Manifest.stored_layout``)."""
    if base.format_version < 2:
        raise SchemaMismatchError(
            f"{where} holds a format_version {base.format_version} dataset, which cannot be "
            "appended to; write it again with this library (format_version 2), then append"
        )


def appending_storage(storage: K, base: Manifest) -> K:
    """``storage``, with layout options that cut arrays as ``base`` stores them if its own
    do not (the first write chose other sizes): appended shards must match."""
    check_appendable_version(base, storage.url)
    if storage.array_layouts() == base.arrays:
        return storage
    for layout in base.arrays.values():
        chunk = layout.chunk_nbytes
        block = layout.chunks_per_block * (chunk + 20) + 4  # for_sizes, inverted
        candidate = copy.copy(storage)  # temporal layouts, bound by records, never match
        candidate.layout_options = LayoutOptions(chunk, max(block, chunk), layout.dense_chunks)
        if candidate.array_layouts() == base.arrays:
            return candidate
    return storage  # the commit says what differs


def extended(
    base: Manifest, ids: np.ndarray, lengths: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list[int]]]:
    """Shard ids, lengths and inherited shards of ``base`` followed by the new shards."""
    if len(ids) and len(base.shard_ids) and int(ids[0]) <= int(base.shard_ids[-1]):
        raise CommitError(
            f"appended shard {int(ids[0])} is not after the last shard "
            f"{int(base.shard_ids[-1])} of the version it extends"
        )
    inherited = {commit: list(shards) for commit, shards in base.inherited.items()}
    own = sorted(set(base.shard_ids.tolist()) - {s for v in inherited.values() for s in v})
    if own:
        inherited[base.commit_id] = own
    merged = {
        name: np.concatenate([base.lengths[name], values]).astype(np.int64)
        for name, values in lengths.items()
    }
    return np.concatenate([base.shard_ids, ids]).astype(np.int64), merged, inherited
