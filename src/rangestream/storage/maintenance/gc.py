"""Garbage: versions under ``data/`` that no reader of the dataset can reach.

Every write puts its objects under ``data/<commit>/``. The committed version (named by the
root ``zarr.json``) and the one it replaced (kept for readers that opened it before the
commit) are the dataset, with every earlier commit whose shards either of them still
reads (an append keeps the old shards where they were written: ``inherited``); a commit
deletes the version before those two. Everything else is garbage: writes killed before
their commit (SIGKILL, a lost machine), writes whose clean-up failed, commits that lost a
race with another commit. Nothing else ever deletes them.

A prefix whose newest object is younger than a grace period is never collected: it may
belong to a write still running, or to a parallel write session whose commit is yet to
come. So is a prefix whose age the store cannot tell, and the prefix of the write that
``in_progress/session.json`` names while its lease holds (its writer refreshes a heartbeat
there; the grace period counts from the last one). Before each deletion the root and the
session file are read again, so a version committed or resumed meanwhile is kept.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rangestream.errors import MetadataError
from rangestream.io.local import LocalStore
from rangestream.io.object_info import ObjectInfo
from rangestream.io.process import run_blocking
from rangestream.io.retry import RetryPolicy
from rangestream.io.retrying_store import RetryingStore
from rangestream.io.store import ObjectStore
from rangestream.io.stores import open_store
from rangestream.layout.manifest import MAX_ROOT_BYTES, ROOT_KEY, data_prefix
from rangestream.layout.manifest_parsing import parse_root
from rangestream.storage.core.live_versions import read_lease
from rangestream.storage.core.store_errors import library_errors

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "GarbageReport",
    "Orphan",
    "acollect_garbage",
    "collect_garbage",
    "find_orphans",
]

#: A version younger than this is kept: a running write or an uncommitted parallel session.
DEFAULT_GRACE_SECONDS = 24 * 3600.0
_VERSION = re.compile(r"^data/[0-9a-f]{32}$")


@dataclass(frozen=True)
class Orphan:
    """One version under ``data/`` that is neither committed nor the one it replaced."""

    prefix: str
    objects: int
    bytes: int
    #: Seconds since the epoch of its newest object; ``None`` if the store does not say.
    newest: float | None

    def age(self, now: float) -> float | None:
        return None if self.newest is None else max(0.0, now - self.newest)


@dataclass
class GarbageReport:
    """What ``gc`` found (and, with ``delete=True``, deleted) under one dataset."""

    url: str
    committed: str | None = None
    previous: str | None = None
    grace: float = DEFAULT_GRACE_SECONDS
    now: float = field(default_factory=time.time)
    #: Old enough to collect (deleted when ``deleted`` is set).
    orphans: list[Orphan] = field(default_factory=list)
    #: Younger than the grace period, or of unknown age: kept.
    young: list[Orphan] = field(default_factory=list)
    deleted: bool = False

    @property
    def orphan_bytes(self) -> int:
        return sum(orphan.bytes for orphan in self.orphans)

    def to_json(self) -> dict[str, Any]:
        def entry(orphan: Orphan) -> dict[str, Any]:
            return {
                "prefix": orphan.prefix,
                "objects": orphan.objects,
                "bytes": orphan.bytes,
                "age_seconds": orphan.age(self.now),
            }

        return {
            "dataset": self.url,
            "committed": self.committed,
            "previous": self.previous,
            "grace_seconds": self.grace,
            "orphans": [entry(orphan) for orphan in self.orphans],
            "young": [entry(orphan) for orphan in self.young],
            "deleted": self.deleted,
        }

    def lines(self) -> list[str]:
        """The report as ``rangestream gc`` prints it."""
        out = [
            f"dataset    {self.url}",
            f"committed  {self.committed or '(none: no commit yet)'}",
        ]
        if self.previous:
            out.append(f"previous   {self.previous} (kept for readers that opened it)")
        for orphan in self.orphans:
            verb = "deleted" if self.deleted else "orphan "
            out.append(f"{verb}    {describe(orphan, self.now)}")
        for orphan in self.young:
            out.append(
                f"young      {describe(orphan, self.now)}: kept, younger than the "
                f"{format_duration(self.grace)} grace period (a write still running?)"
            )
        total = f"{len(self.orphans)} orphaned version(s), {self.orphan_bytes:,} bytes"
        if self.deleted:
            out.append(f"result     deleted {total}")
        elif self.orphans:
            out.append(f"result     {total}; run again with --yes to delete them")
        else:
            out.append("result     nothing to collect")
        return out


def describe(orphan: Orphan, now: float) -> str:
    age = orphan.age(now)
    written = "age unknown" if age is None else f"written {format_duration(age)} ago"
    return f"{orphan.prefix}: {orphan.objects} objects, {orphan.bytes:,} bytes, {written}"


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def collect_garbage(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    grace: float = DEFAULT_GRACE_SECONDS,
    delete: bool = False,
    retry: RetryPolicy | None = None,
) -> GarbageReport:
    """List (and with ``delete=True`` delete) the orphaned versions of the dataset at ``url``.

    Parameters
    ----------
    url, storage_options
        The dataset, as given to a storage.
    grace
        Seconds; a version whose newest object is younger is kept (a write may still be
        running, or a parallel write session may commit it later).
    delete
        Delete the orphans older than ``grace``; otherwise only report them.
    retry
        Retry policy of the store's calls.

    Raises
    ------
    MetadataError
        If the root ``zarr.json`` exists but cannot be read: what is committed is then
        unknown, so nothing is deleted.
    """
    return run_blocking(
        acollect_garbage(url, storage_options, grace=grace, delete=delete, retry=retry)
    )


async def acollect_garbage(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    grace: float = DEFAULT_GRACE_SECONDS,
    delete: bool = False,
    retry: RetryPolicy | None = None,
) -> GarbageReport:
    """``collect_garbage`` for a running event loop."""
    store = open_store(url, storage_options)
    if not isinstance(store, LocalStore):
        store = RetryingStore(store, retry or RetryPolicy())
    try:
        with library_errors(f"collecting garbage under {url}"):
            report = await find_orphans(store, url, grace=grace)
            if delete:
                await _delete(store, report)
            return report
    finally:
        if isinstance(store, LocalStore):
            store.close_files()
        else:
            await store.aclose()


async def find_orphans(
    store: ObjectStore, url: str, *, grace: float = DEFAULT_GRACE_SECONDS
) -> GarbageReport:
    """The versions under ``data/`` of ``store`` that the dataset does not use.

    A dataset without a root (never committed) has nothing committed: every version is
    an orphan, subject to the grace period.
    """
    report = GarbageReport(url=str(url), grace=grace)
    report.committed, report.previous, kept = await _live_versions(store)
    # a write in progress keeps its objects while its lease holds, and its grace period
    # counts from its last heartbeat (a long write may not upload for a while)
    lease = await read_lease(store)
    live = {data_prefix(c) for c in kept}
    for prefix in await store.list_prefixes("data"):
        if not _VERSION.match(prefix) or prefix in live:
            continue
        objects = await store.list_details(prefix)
        if not objects:  # an empty "directory" some stores keep after deletions
            continue
        orphan = _orphan(prefix, objects)
        if lease is not None and lease.prefix == prefix:
            if lease.until > report.now:
                report.young.append(orphan)
                continue
            if lease.heartbeat is not None and orphan.newest is not None:
                orphan = Orphan(orphan.prefix, orphan.objects, orphan.bytes,
                                max(orphan.newest, lease.heartbeat))  # fmt: skip
        age = orphan.age(report.now)
        if age is not None and age >= grace:
            report.orphans.append(orphan)
        else:
            report.young.append(orphan)
    return report


def _orphan(prefix: str, objects: Iterable[ObjectInfo]) -> Orphan:
    listed = list(objects)
    stamps = [info.modified for info in listed]
    newest = None if not listed or None in stamps else max(s for s in stamps if s is not None)
    return Orphan(prefix, len(listed), sum(info.size for info in listed), newest)


async def _live_versions(store: ObjectStore) -> tuple[str | None, str | None, set[str]]:
    """The committed version, the one it replaced, and every commit the two read."""
    try:
        raw = await store.get_range(ROOT_KEY, 0, MAX_ROOT_BYTES + 1)
    except FileNotFoundError:
        return None, None, set()
    where = store.describe(ROOT_KEY)
    if len(raw) > MAX_ROOT_BYTES:
        raise MetadataError(f"{where} is larger than the {MAX_ROOT_BYTES}-byte metadata cap")
    try:
        manifest = parse_root(raw, where)
    except MetadataError as error:
        raise MetadataError(
            f"{error}; without a readable root the committed version is unknown, so "
            "nothing is collected"
        ) from error
    previous = manifest.extra.get("previous_commit_id")
    previous = previous if isinstance(previous, str) else None
    kept = {*manifest.commits, *manifest.extra.get("previous_inherited", [])}
    if previous is not None:
        kept.add(previous)
    return manifest.commit_id, previous, kept


async def _delete(store: ObjectStore, report: GarbageReport) -> None:
    deleted = []
    for orphan in report.orphans:
        # a commit may have published this version since the listing, or a resumed write
        # taken it up again: ask the root and the session file again
        live = {data_prefix(c) for c in (await _live_versions(store))[2]}
        lease = await read_lease(store)
        if orphan.prefix in live or (
            lease is not None and lease.prefix == orphan.prefix and lease.until > time.time()
        ):
            continue
        await store.delete_prefix(orphan.prefix)
        deleted.append(orphan)
    report.orphans, report.deleted = deleted, True
