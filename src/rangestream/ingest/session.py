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
part exists; a restart without it deletes the abandoned session's data and starts over,
unless the dataset reads that data (a run killed between its commit and the removal of
the session file) or the session's lease still holds (see ``Heartbeat``). The file is
removed once the commit has published the dataset.
"""

from __future__ import annotations

import contextlib
import json
import threading
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
from rangestream.storage.core.kill_points import kill_point
from rangestream.storage.core.live_versions import (
    LEASE_SECONDS,
    SESSION_KEY,
    SESSION_PREFIX,
    commits_of,
    lease_end,
)
from rangestream.storage.core.root import read_committed
from rangestream.storage.core.store_errors import library_errors
from rangestream.storage.core.writing import WriteSession, new_session, write_mode

__all__ = ["SESSION_KEY", "Heartbeat", "Resumable", "begin", "finish", "part_id"]

#: Seconds between two refreshes of a running write's heartbeat.
HEARTBEAT_SECONDS = 10.0


def part_id(split: int) -> str:
    """The part manifest name of ``split``: the same in every run of that split."""
    return f"split-{split:08d}"


def rejects_key(session: WriteSession, split: int) -> str:
    """Where a split's rejected rows go until the commit gathers them."""
    return f"{session.prefix}/rejects/{part_id(split)}.jsonl"


def counts_key(session: WriteSession, split: int) -> str:
    """Where a split's counts go (rows, records...), for the summary of a resumed run."""
    return f"{session.prefix}/counts/{part_id(split)}.json"


@dataclass
class Resumable:
    """A session and the splits it already holds.

    ``finished``: the version a resumed session had already committed (its run was killed
    before it removed the session file); there is nothing left to write.
    """

    session: WriteSession
    done: frozenset[int]
    resumed: bool
    finished: Manifest | None = None


def session_document(session: WriteSession, fingerprint: str, splits: int) -> dict[str, Any]:
    """What ``in_progress/session.json`` holds; ``heartbeat`` is refreshed by its writer."""
    now = time.time()
    return {
        "commit_id": session.commit_id,
        "appends_to": session.appends_to,
        "fingerprint": fingerprint,
        "splits": splits,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "heartbeat": now,
        "lease_seconds": LEASE_SECONDS,
    }


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

    A session file left by an earlier run is the run's, not the dataset's: if it names a
    version the dataset reads (the run was killed after its commit), that version is kept
    whatever this run does, and a resume of it finds it finished. Only the prefix of an
    uncommitted session is deleted by a rerun without resume.
    """
    mode = write_mode(overwrite, mode)

    async def run() -> Resumable:
        store = storage.new_write_store()
        try:
            exists, committed = await read_committed(store)
            # None: the root cannot be read, so no prefix is known to be garbage
            live = commits_of(committed) if committed is not None else None if exists else set()
            previous = None
            try:
                previous = json.loads(await store.get(SESSION_KEY))
            except FileNotFoundError:
                previous = None  # no earlier session here: a fresh write
            except ValueError:
                previous = None  # a damaged session file: start over
            commit_id = previous.get("commit_id") if isinstance(previous, dict) else None
            valid = isinstance(commit_id, str) and len(commit_id) == 32
            if valid and committed is not None and commit_id == committed.commit_id:
                assert isinstance(previous, dict)
                if resume:
                    if previous.get("fingerprint") != fingerprint:
                        raise ResumeError(
                            f"the interrupted write at {storage.url} had already committed "
                            f"version {commit_id}, with other inputs or options: there is "
                            "nothing to resume (--overwrite replaces the dataset, --append "
                            "adds to it)"
                        )
                    session = WriteSession(storage, str(commit_id), overwrite)
                    return Resumable(session, frozenset(range(splits)), True, committed)
                # committed, but killed before it removed its session file: finished
                await store.delete_prefix(SESSION_PREFIX)
                previous, valid = None, False
            if exists and mode == "create":
                raise DatasetExistsError(
                    f"{storage.url} already holds a committed dataset; pass overwrite=True "
                    "(--overwrite) to replace it, or mode='append' (--append) to add shards "
                    "to it"
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
            protected = valid and (live is None or commit_id in live)
            if resume and valid and isinstance(previous, dict):
                if protected:
                    raise ResumeError(
                        f"the interrupted write at {storage.url} committed version "
                        f"{commit_id}, which a later write has replaced since: there is "
                        "nothing to resume; rerun without resume (--resume) to start over"
                    )
                if previous.get("fingerprint") != fingerprint:
                    raise ResumeError(
                        f"the interrupted write at {storage.url} was made with other inputs "
                        "or options, so its splits cannot be reused; rerun without resume "
                        "(--resume) to start over"
                    )
                appends_to = previous.get("appends_to")
                if (base.commit_id if base is not None else None) != appends_to:
                    raise ResumeError(
                        f"the interrupted write at {storage.url} "
                        + ("appended to another version" if appends_to else "was not an append")
                        + "; rerun without resume (--resume) to start over"
                    )
                first = (
                    int(base.shard_ids[-1]) + 1 if base is not None and len(base.shard_ids) else 0
                )
                session = WriteSession(writing, str(commit_id), overwrite, appends_to, first)
                prefix = f"{session.prefix}/parts/"
                names = {key[len(prefix) :] for key in await store.list(f"{session.prefix}/parts")}
                done = frozenset(k for k in range(splits) if f"{part_id(k)}.json" in names)
                document = {**previous, **session_document(session, fingerprint, splits)}
                document["started"] = previous.get("started", document["started"])
                await store.put(SESSION_KEY, json.dumps(document).encode())
                return Resumable(session, done, True)
            if valid and not protected and not _alive(previous):
                # an abandoned write: its objects are garbage (one still alive is left to
                # `gc`, which waits for its lease to end)
                await store.delete_prefix(data_prefix(str(commit_id)))
            session = new_session(writing, overwrite, base)
            document = session_document(session, fingerprint, splits)
            await store.put(SESSION_KEY, json.dumps(document).encode())
            kill_point("session-started")
            return Resumable(session, frozenset(), False)
        finally:
            await store.aclose()

    with library_errors(f"starting a write at {storage.url}", storage.url):
        return run_blocking(run())


def _alive(document: Any) -> bool:
    """Whether the session ``document`` describes may still be running: its lease holds."""
    return lease_end(document) > time.time()


class Heartbeat:
    """Refreshes the session file's ``heartbeat`` while a write runs, on a thread.

    ``gc`` keeps the objects of a session whose lease (``heartbeat + lease_seconds``) has
    not ended, and counts its grace period from the last heartbeat, so a write that runs
    for days is never collected under it. The file is only rewritten while it still names
    this session (a later run may have taken the URL over).
    """

    def __init__(self, storage: Storage, commit_id: str) -> None:
        self.storage = storage
        self.commit_id = commit_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rangestream-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is not None:  # stopped, not killed: the lease ends now, not in minutes
            with contextlib.suppress(Exception):
                run_blocking(self.beat(lease=0.0))

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(Exception):  # a missed beat shortens the lease, no more
                run_blocking(self.beat())

    async def beat(self, lease: float = LEASE_SECONDS) -> None:
        """Refresh the heartbeat, with a lease of ``lease`` seconds from now."""
        store = self.storage.new_write_store()
        try:
            document = json.loads(await store.get(SESSION_KEY))
            if isinstance(document, dict) and document.get("commit_id") == self.commit_id:
                document["heartbeat"] = time.time()
                document["lease_seconds"] = lease
                await store.put(SESSION_KEY, json.dumps(document).encode())
        finally:
            await store.aclose()


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
