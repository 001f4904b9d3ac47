"""Which versions a dataset still needs, and whether a version's objects are all there.

Two questions every step of a write asks before it deletes or publishes anything:

- ``live_commits``: the commits whose prefixes readers of the dataset may read (the
  committed version, the one it replaced, and every commit either inherits shards from).
  No write, abort or clean-up deletes one of them, whatever a session file says.
- ``missing_objects``: the block and metadata objects a version names that the store does
  not hold. A commit refuses to publish a version with any (a ``gc`` that ran while the
  write was stopped, a prefix deleted by hand), so a published version is always readable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rangestream.errors import MetadataError
from rangestream.io.store import ObjectStore
from rangestream.layout.manifest import MAX_ROOT_BYTES, ROOT_KEY, Manifest, data_prefix
from rangestream.layout.manifest_parsing import parse_root

__all__ = [
    "LEASE_SECONDS",
    "SESSION_KEY",
    "WriteLease",
    "lease_end",
    "live_commits",
    "missing_objects",
    "read_lease",
    "version_keys",
]

#: Where a ``convert`` or ``write`` in progress keeps its session (``ingest.session``).
SESSION_PREFIX = "in_progress"
SESSION_KEY = f"{SESSION_PREFIX}/session.json"
#: Seconds a heartbeat keeps a write alive for ``gc`` (several beats may be missed).
LEASE_SECONDS = 120.0


@dataclass(frozen=True)
class WriteLease:
    """The write in progress that the session file names: its prefix, when it started
    (as written), its last heartbeat and when its lease ends (seconds since the epoch)."""

    commit_id: str
    started: str | None
    heartbeat: float | None
    until: float
    splits: int | None

    @property
    def prefix(self) -> str:
        return data_prefix(self.commit_id)


def lease_end(document: Any) -> float:
    """When the lease of the session ``document`` ends (seconds since the epoch; 0 if it
    has none)."""
    if not isinstance(document, dict):
        return 0.0
    beat, lease = document.get("heartbeat"), document.get("lease_seconds", LEASE_SECONDS)
    if isinstance(beat, bool) or not isinstance(beat, (int, float)):
        return 0.0
    if isinstance(lease, bool) or not isinstance(lease, (int, float)):
        lease = LEASE_SECONDS
    return float(beat) + float(lease)


async def read_lease(store: ObjectStore) -> WriteLease | None:
    """The write in progress at ``store``'s dataset, if a readable session file names one."""
    try:
        raw = await store.get_range(SESSION_KEY, 0, MAX_ROOT_BYTES + 1)
        document = json.loads(raw)
    except (FileNotFoundError, ValueError):
        return None
    commit = document.get("commit_id") if isinstance(document, dict) else None
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{32}", commit):
        return None
    beat = document.get("heartbeat")
    started, splits = document.get("started"), document.get("splits")
    return WriteLease(
        commit,
        started if isinstance(started, str) else None,
        float(beat) if isinstance(beat, (int, float)) and not isinstance(beat, bool) else None,
        lease_end(document),
        splits if isinstance(splits, int) and not isinstance(splits, bool) else None,
    )


async def live_commits(store: ObjectStore) -> set[str] | None:
    """The commits the dataset reads; empty without a root, ``None`` if the root cannot be
    read (then nothing is known to be garbage)."""
    try:
        raw = await store.get_range(ROOT_KEY, 0, MAX_ROOT_BYTES + 1)
    except FileNotFoundError:
        return set()
    if len(raw) > MAX_ROOT_BYTES:
        return None
    try:
        manifest = parse_root(raw, store.describe(ROOT_KEY))
    except MetadataError:
        return None
    return commits_of(manifest)


def commits_of(manifest: Manifest) -> set[str]:
    """The commits readers of ``manifest`` may read: its own and inherited ones, the
    version it replaced and the commits that one inherited."""
    live = {*manifest.commits}
    previous = manifest.extra.get("previous_commit_id")
    if isinstance(previous, str):
        live.add(previous)
    inherited = manifest.extra.get("previous_inherited", [])
    if isinstance(inherited, list):
        live.update(c for c in inherited if isinstance(c, str))
    return live


def version_keys(manifest: Manifest) -> Iterable[str]:
    """Every shard object ``manifest`` names: group and array documents and every block."""
    lengths = manifest.lengths
    for position, shard in enumerate(manifest.shard_ids.tolist()):
        commit = manifest.shard_commit(shard)
        yield f"{data_prefix(commit)}/shards/{shard}/zarr.json"
        for name in manifest.arrays:
            length = int(lengths[name][position])
            key = manifest.array_key(shard, name)
            yield f"{key}/zarr.json"
            layout = manifest.stored_layout(name, length)
            for block in range(layout.num_blocks(length)):
                yield layout.block_key(key, block)


async def missing_objects(
    store: ObjectStore, manifest: Manifest, listed: Iterable[str] = ()
) -> list[str]:
    """The shard objects of ``manifest`` the store lacks, in order.

    ``listed``: keys already listed under the version's own prefix (the commit lists it
    for its parts anyway); the prefixes of inherited commits are listed here.
    """
    present = set(listed)
    for commit in manifest.inherited:
        present.update(await store.list(f"{data_prefix(commit)}/shards"))
    return [key for key in version_keys(manifest) if key not in present]
