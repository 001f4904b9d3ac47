"""The root document of a dataset: read within the metadata cap, published conditionally.

The root is replaced only if it is still the version the commit read (a conditional put:
S3 ``If-Match`` / ``If-None-Match``, a lock and a rename on local disk, check-then-put
elsewhere) and read back afterwards, so of two concurrent commits the one that lost
learns it (``CommitConflictError``) instead of reporting a success nobody can read.
"""

from __future__ import annotations

import contextlib

from rangestream.errors import (
    CommitConflictError,
    ConcurrentWriteError,
    CorruptDataError,
    MetadataError,
)
from rangestream.io.range_reader import RangeReader
from rangestream.io.store import ObjectStore
from rangestream.layout.executors import RemoteExecutor
from rangestream.layout.manifest import (
    MAX_ROOT_BYTES,
    ROOT_KEY,
    Manifest,
    data_prefix,
    read_shard_table,
)
from rangestream.layout.manifest_parsing import parse_root
from rangestream.storage.core.store_errors import library_errors


async def read_committed(store: ObjectStore) -> tuple[bool, Manifest | None]:
    """Whether a root document exists, and its manifest if it is a readable one.

    Reads at most ``MAX_ROOT_BYTES + 1`` bytes, as readers do: a root beyond the cap is
    unreadable metadata, not a reason to hold gigabytes.
    """
    with library_errors(f"reading {store.describe(ROOT_KEY)}"):
        try:
            raw = await store.get_range(ROOT_KEY, 0, MAX_ROOT_BYTES + 1)
        except FileNotFoundError:
            return False, None
    try:
        return True, await completed(store, parse_bounded_root(raw, store.describe(ROOT_KEY)))
    except CorruptDataError:
        return True, None


async def completed(store: ObjectStore, manifest: Manifest) -> Manifest:
    """``manifest`` with its shard ids and lengths, read from ``index/shards`` if the root
    does not list them (an append numbers its shards after them and lists them all)."""
    if manifest.complete:
        return manifest
    reader = RangeReader(store)
    return await RemoteExecutor(reader, verify=True).run(read_shard_table(manifest, store.describe))


async def read_root(store: ObjectStore) -> tuple[bytes | None, str | None]:
    """The root document (at most the cap and one byte) and its version; ``None``s if absent."""
    try:
        return await store.get_versioned(ROOT_KEY, MAX_ROOT_BYTES + 1)
    except FileNotFoundError:
        return None, None


async def publish_root(
    store: ObjectStore, document: bytes, version: str | None, commit_id: str
) -> None:
    """Write the root only over the version the commit read, and make sure it stayed.

    The write is conditional (S3 ``If-Match`` / ``If-None-Match``, a lock and a rename on
    local disk); a store without conditional writes checks, then writes. Either way the
    root is read back: another commit that replaced this one without having seen it (a
    store that ignores the condition, or the check-then-write race) is caught there.
    Raises ``CommitConflictError`` naming the version that won.
    """
    refused = False
    try:
        # a retried write whose first attempt went through is not refused: the store's
        # retries read it back (``RetryingStore.put_if_version``)
        await store.put_if_version(ROOT_KEY, document, version, MAX_ROOT_BYTES + 1)
    except ConcurrentWriteError:
        refused = True
    found, _ = await read_root(store)
    if found == document:
        return
    where = store.describe(ROOT_KEY)
    winner = None
    if found is not None:
        with contextlib.suppress(MetadataError):
            winner = parse_bounded_root(found, where)
    if not refused and winner is not None and winner.extra.get("previous_commit_id") == commit_id:
        return  # committed, then replaced by a later write that saw this version
    other = f"commit {winner.commit_id}" if winner is not None else "another write"
    how = (
        "while this commit ran"
        if refused
        else "right after this commit, without seeing it (the store has no conditional writes)"
    )
    raise CommitConflictError(
        f"{where}: {other} was published {how}, so commit {commit_id} is not the dataset's "
        f"version; its objects under {data_prefix(commit_id)}/ are left for `rangestream gc` "
        "(or session.abort()). Write again to replace the other version."
    )


def parse_bounded_root(raw: bytes, where: str) -> Manifest:
    if len(raw) > MAX_ROOT_BYTES:
        raise MetadataError(f"{where} is larger than the {MAX_ROOT_BYTES}-byte metadata cap")
    return parse_root(raw, where)
