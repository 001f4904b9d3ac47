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

from rangestream.errors import (
    DatasetExistsError,
    MetadataError,
    ResumeError,
    SchemaMismatchError,
)
from rangestream.io.process import run_blocking
from rangestream.layout.manifest import Manifest, data_prefix
from rangestream.storage.core.base import Storage
from rangestream.storage.core.root import read_committed
from rangestream.storage.core.writing import WriteSession, write_mode

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
    storage: Storage,
    fingerprint: str,
    splits: int,
    *,
    resume: bool,
    overwrite: bool,
    mode: str | None = None,
) -> Resumable:
    """Start a write of ``splits`` splits, or resume the interrupted one at the URL.

    ``mode="append"`` adds the splits as new shards of the committed version (split ``k``
    becomes shard ``first_shard + k``); see ``Storage.parallel_write``.
    """
    mode = write_mode(overwrite, mode)

    async def run() -> Resumable:
        store = storage.new_write_store()
        try:
            exists, committed = await read_committed(store)
            if exists and mode == "create":
                raise DatasetExistsError(
                    f"{storage.url} already holds a committed dataset; pass overwrite=True "
                    "to replace it, or mode='append' to add shards to it"
                )
            base = None
            if exists and mode == "append":
                if committed is None:
                    raise MetadataError(
                        f"{storage.url}/zarr.json cannot be read, so there is no version "
                        "to append to"
                    )
                check_same_origin(storage, committed)
                base = committed
            writing = storage if base is None else storage.appending_to(base)
            previous = None
            try:
                previous = json.loads(await store.get(SESSION_KEY))
            except FileNotFoundError:
                previous = None  # no earlier session here: a fresh write
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
                appends_to = previous.get("appends_to")
                if (base.commit_id if base is not None else None) != appends_to:
                    raise ResumeError(
                        f"the interrupted write at {storage.url} "
                        + ("appended to another version" if appends_to else "was not an append")
                        + "; rerun without resume to start over"
                    )
                first = (
                    int(base.shard_ids[-1]) + 1 if base is not None and len(base.shard_ids) else 0
                )
                session = WriteSession(writing, commit_id, overwrite, appends_to, first)
                prefix = f"{session.prefix}/parts/"
                names = {key[len(prefix) :] for key in await store.list(f"{session.prefix}/parts")}
                done = frozenset(k for k in range(splits) if f"{part_id(k)}.json" in names)
                return Resumable(session, done, True)
            if valid:
                await store.delete_prefix(data_prefix(str(commit_id)))
            from rangestream.storage.core.writing import new_session

            session = new_session(writing, overwrite, base)
            document = {
                "commit_id": session.commit_id,
                "appends_to": session.appends_to,
                "fingerprint": fingerprint,
                "splits": splits,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            await store.put(SESSION_KEY, json.dumps(document).encode())
            return Resumable(session, frozenset(), False)
        finally:
            await store.aclose()

    return run_blocking(run())


#: What must agree between the records of a dataset and those appended by ``convert``.
_SAME_ORIGIN = ("preset", "tokenizer", "vocab_size", "eos_id", "keys")


def check_same_origin(storage: Storage, committed: Manifest) -> None:
    """Refuse appending converted records of another preset or tokenizer: their token ids
    would mean other things than the stored ones'."""
    mine = storage.notes.get("ingest")
    stored = committed.schema.get("ingest")
    if not isinstance(mine, dict) or not isinstance(stored, dict):
        return
    for key in _SAME_ORIGIN:
        if key in mine and key in stored and mine[key] != stored[key]:
            raise SchemaMismatchError(
                f"{storage.url} was converted with {key}={stored[key]!r:.100}; appending "
                f"records made with {key}={mine[key]!r:.100} would mix them"
            )


def finish(storage: Storage) -> None:
    """Forget the session file once the dataset is committed."""

    async def run() -> None:
        store = storage.new_write_store()
        try:
            await store.delete_prefix(SESSION_PREFIX)
        finally:
            await store.aclose()

    run_blocking(run())


def fingerprint_of(value: Any) -> str:
    """A stable digest of a JSON-able description of a write."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
