"""A write in splits that survives interruptions: where its session is kept, what is done.

A conversion writes split ``k`` as shard ``k`` with a writer whose part manifest is named
after the split (``parts/split-<k>.json``). A part is uploaded after all of its writer's
data, so its presence means the split is complete; a task that runs twice (a retried Dask
task) overwrites the same objects and the same part, so each split is in the commit
exactly once.

While the write is in progress, ``<dataset>/in_progress/session.json`` names its commit id
and a fingerprint of its inputs and options. Readers never look there (a dataset is what
the root ``zarr.json`` names), so uncommitted data stays invisible. A restart with
``resume=True`` finds the session there, checks the fingerprint, and skips the splits whose
part exists; a restart without it deletes the abandoned session's data and starts over.
The file is removed once the commit has published the dataset.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rangestream.errors import DatasetExistsError, ResumeError
from rangestream.io.process import run_blocking
from rangestream.layout.manifest import data_prefix
from rangestream.storage.base import Storage
from rangestream.storage.writing import WriteSession, read_committed

__all__ = ["SESSION_KEY", "Resumable", "begin", "finish", "part_id"]

SESSION_PREFIX = "in_progress"
SESSION_KEY = f"{SESSION_PREFIX}/session.json"


def part_id(split: int) -> str:
    """The part manifest name of ``split``: the same in every run of that split."""
    return f"split-{split:08d}"


def rejects_key(session: WriteSession, split: int) -> str:
    """Where a split's rejected rows go until the commit gathers them."""
    return f"{session.prefix}/rejects/{part_id(split)}.jsonl"


@dataclass
class Resumable:
    """A session and the splits it already holds."""

    session: WriteSession
    done: frozenset[int]
    resumed: bool


def begin(
    storage: Storage, fingerprint: str, splits: int, *, resume: bool, overwrite: bool
) -> Resumable:
    """Start a write of ``splits`` splits, or resume the interrupted one at the URL."""

    async def run() -> Resumable:
        store = storage._new_write_store()
        try:
            exists, _ = await read_committed(store)
            if exists and not overwrite:
                raise DatasetExistsError(
                    f"{storage.url} already holds a committed dataset; "
                    "pass overwrite=True to replace it"
                )
            previous = None
            try:
                previous = json.loads(await store.get(SESSION_KEY))
            except FileNotFoundError:
                pass
            except ValueError:
                previous = None  # a damaged session file: start over
            commit_id = previous.get("commit_id") if isinstance(previous, dict) else None
            valid = isinstance(commit_id, str) and len(commit_id) == 32
            if resume and valid and isinstance(previous, dict):
                if previous.get("fingerprint") != fingerprint:
                    raise ResumeError(
                        f"the interrupted write at {storage.url} was made with other inputs "
                        "or options, so its splits cannot be reused; rerun without resume "
                        "to start over"
                    )
                session = WriteSession(storage, commit_id, overwrite)
                prefix = f"{session.prefix}/parts/"
                names = {key[len(prefix) :] for key in await store.list(f"{session.prefix}/parts")}
                done = frozenset(k for k in range(splits) if f"{part_id(k)}.json" in names)
                return Resumable(session, done, True)
            if valid:
                await store.delete_prefix(data_prefix(str(commit_id)))
            from rangestream.storage.writing import new_session

            session = new_session(storage, overwrite)
            document = {
                "commit_id": session.commit_id,
                "fingerprint": fingerprint,
                "splits": splits,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            await store.put(SESSION_KEY, json.dumps(document).encode())
            return Resumable(session, frozenset(), False)
        finally:
            await store.aclose()

    return run_blocking(run())


def finish(storage: Storage) -> None:
    """Forget the session file once the dataset is committed."""

    async def run() -> None:
        store = storage._new_write_store()
        try:
            await store.delete_prefix(SESSION_PREFIX)
        finally:
            await store.aclose()

    run_blocking(run())


def fingerprint_of(value: Any) -> str:
    """A stable digest of a JSON-able description of a write."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
