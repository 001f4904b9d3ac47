"""The commit of a write session: gather the parts, write the index, publish the root.

The commit gathers the parts the session's writers left, checks they do not overlap,
writes the index, and writes the root ``zarr.json`` last: that single atomic put
(``root.publish_root``) is what makes the version exist. A session that fails or is
abandoned leaves the previous commit (or nothing) visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rangestream.errors import CommitConflictError, CommitError, DatasetExistsError, MetadataError
from rangestream.io.store import ObjectStore
from rangestream.layout.block import ArrayLayout, encode_block
from rangestream.layout.manifest import ROOT_KEY, Manifest, data_prefix
from rangestream.layout.shard_table import SHARD_TABLE
from rangestream.layout.zarr_json import array_document, dumps, group_document
from rangestream.storage.core.appending import check_appendable, extended
from rangestream.storage.core.kill_points import kill_point
from rangestream.storage.core.live_versions import missing_objects
from rangestream.storage.core.parts import gather_parts, read_part
from rangestream.storage.core.root import completed, parse_bounded_root, publish_root, read_root
from rangestream.storage.core.store_errors import library_errors

if TYPE_CHECKING:
    from rangestream.storage.core.kind import StorageKind

T = TypeVar("T")

#: Objects the commit reads or writes at once (parts, index and group documents).
COMMIT_CONCURRENCY = 64


async def commit_session(
    storage: StorageKind,
    commit_id: str,
    overwrite: bool,
    appends_to: str | None,
    *,
    check_objects: bool = True,
) -> Manifest:
    """Publish what the closed writers of the session ``commit_id`` wrote
    (``WriteSession.commit``: ``overwrite`` and ``appends_to`` are the session's)."""
    prefix = data_prefix(commit_id)
    store = storage.new_write_store()
    try:
        old_root, version = await read_root(store)
        exists, previous = old_root is not None, None
        if old_root is not None:
            with contextlib.suppress(MetadataError):  # unreadable: replaced, not chained
                previous = parse_bounded_root(old_root, store.describe(ROOT_KEY))
        base = _appended(storage.url, appends_to, prefix, previous)
        if base is not None:
            base = await completed(store, base)
        if exists and not overwrite and base is None:
            raise DatasetExistsError(
                f"{storage.url} already holds a committed dataset; "
                "pass overwrite=True (--overwrite) to replace it, or mode='append' (--append) to "
                "add shards"
            )
        # one listing of the whole version: its parts, and the blocks checked below
        listed = await store.list(prefix)
        parts_prefix = f"{prefix}/parts/"
        part_keys = sorted(
            key for key in listed if key.startswith(parts_prefix) and key.endswith(".json")
        )
        raws = await _bounded([read_part(store, key) for key in part_keys])
        storage, parts = gather_parts(storage, part_keys, raws, store.describe)
        if base is not None:
            storage = storage.bind_schema(base.schema, store.describe(ROOT_KEY))
        layouts = storage.array_layouts()
        ids, lengths = parts.shard_ids, parts.lengths(list(layouts))
        inherited: dict[str, list[int]] = {}
        if base is not None:
            check_appendable(storage, base)
            ids, lengths, inherited = extended(base, ids, lengths)
        # when, for people (inspect); readers order versions by the chain, not by time
        extra: dict[str, Any] = {"committed_at": _utc_now()}
        if previous is not None:
            extra["previous_commit_id"] = previous.commit_id
            if previous.inherited:  # kept for its readers too (gc, the next commit)
                extra["previous_inherited"] = list(previous.inherited)
        schema = storage.committed_schema()
        manifest = Manifest(
            storage.kind, commit_id, schema, layouts, ids, lengths, extra, inherited
        )
        missing = await missing_objects(store, manifest, listed) if check_objects else []
        if missing:
            raise CommitError(
                f"{storage.url}: version {commit_id} names {len(missing)} object(s) "
                f"the store does not hold (the first: {store.describe(missing[0])}), so it "
                "is not published; something deleted them after their writer wrote them "
                "(a `rangestream gc` while the write was stopped?). Write the dataset "
                "again (a conversion: rerun without --resume)"
            )
        groups = (
            "data/zarr.json",
            f"{prefix}/zarr.json",
            f"{prefix}/shards/zarr.json",
        )
        await _bounded(
            [
                *(store.put(key, dumps(group_document())) for key in groups),
                *_index_puts(store, prefix, manifest),
                storage.write_derived_index(store, manifest),
            ]
        )
        kill_point("index-written")
        with library_errors(f"writing {store.describe(ROOT_KEY)}", storage.url):
            root = dumps(manifest.root_document())
            await publish_root(store, root, version, commit_id)
        kill_point("root-published")
        if previous is not None:
            # Readers may still be on the version just replaced; the one before it goes,
            # with the data it inherited, except what the two live versions still read.
            older = previous.extra.get("previous_commit_id")
            live = {*manifest.commits, *previous.commits}
            if isinstance(older, str):
                for commit in [older, *previous.extra.get("previous_inherited", [])]:
                    if commit not in live:
                        # leftover objects are garbage, not a failed commit
                        with contextlib.suppress(Exception):
                            await store.delete_prefix(data_prefix(commit))
        return manifest
    finally:
        await store.aclose()


def _appended(
    where: str, appends_to: str | None, prefix: str, committed: Manifest | None
) -> Manifest | None:
    """The version an append extends, checked to be the one committed now."""
    if appends_to is None:
        return None
    if committed is None or committed.commit_id != appends_to:
        found = "no readable version" if committed is None else committed.commit_id
        raise CommitConflictError(
            f"{where}: this append extends version {appends_to}, but {found} is "
            f"committed now; its objects under {prefix}/ are left for "
            "`rangestream gc` (or session.abort()). Append again to the new version."
        )
    return committed


async def _bounded(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Await ``calls`` with at most ``COMMIT_CONCURRENCY`` running at once, results in order.

    A failure cancels the calls still running (``TaskGroup``) and is raised as it is.
    """
    slots = asyncio.Semaphore(COMMIT_CONCURRENCY)

    async def one(call: Coroutine[Any, Any, T]) -> T:
        try:
            async with slots:
                return await call
        finally:
            call.close()  # one cancelled before it started is closed, not left unawaited

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(call)) for call in calls]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _index_puts(
    store: ObjectStore, prefix: str, manifest: Manifest
) -> list[Coroutine[Any, Any, None]]:
    """The puts of ``index/``: the shard table (one row per shard: its id and each array's
    rows), which readers read at open when the root does not list the shards, and the same
    numbers one array per column (``shard_ids``, ``<array>_length``, as version 1 wrote
    them), for readers that know only Zarr."""
    int64 = np.dtype("<i8")
    puts = [store.put(f"{prefix}/index/zarr.json", dumps(group_document()))]
    table = manifest.table_rows()
    arrays: list[tuple[str, ArrayLayout, np.ndarray, dict[str, Any]]] = [
        (
            SHARD_TABLE.removeprefix("index/"),
            manifest.table_layout,
            table,
            {"rangestream_columns": manifest.table_columns},
        ),
        ("shard_ids", _column_layout(), table[:, 0], {}),
    ]
    for i, name in enumerate(manifest.arrays):
        arrays.append((f"{name}_length", _column_layout(), table[:, 1 + i], {}))
    for name, layout, values, attributes in arrays:
        key = f"{prefix}/index/{name}"
        data = np.ascontiguousarray(values, dtype=int64)
        for block in range(layout.num_blocks(len(data))):
            rows = data[block * layout.block_rows : (block + 1) * layout.block_rows]
            encoded = encode_block(layout, rows.view(np.uint8))
            puts.append(store.put(layout.block_key(key, block), encoded))
        document = array_document(layout, len(data), attributes)
        puts.append(store.put(f"{key}/zarr.json", dumps(document)))
    return puts


def _column_layout() -> ArrayLayout:
    return ArrayLayout.for_sizes(np.dtype("<i8"), (), chunk_bytes=64 * 1024, block_bytes=1 << 22)
