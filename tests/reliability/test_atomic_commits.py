"""A writer killed at any point leaves the previous version (or nothing); readers stay put.

The writer runs in a forked child whose object puts go through a hook that sends the
child SIGKILL just before (or after) a chosen put: the k-th put overall for a seeded
random k, or the first put of a named phase (block uploads, array metadata, the part
manifest, the commit's group documents and index arrays, the root document, the deletion
of an old version). The parent then checks what a reader sees and that a rerun succeeds.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamStorage
from rangestream.errors import DatasetNotFoundError, MissingObjectError
from rangestream.io import FsspecStore, LocalStore, S3Store
from rangestream.storage.maintenance.verify import verify_dataset

from .datasets import SMALL, token_ground_truth, tokens_storage, write_tokens

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core

TOKENS_PER_SHARD = 3_000
PHASES = ("block", "array_meta", "shard_group", "part", "commit_group", "index", "root")


def phase_of(key: str) -> str:
    """Which step of a write a put belongs to (see docs/format.md, "Commit protocol")."""
    parts = key.split("/")
    if key == "zarr.json":
        return "root"
    if len(parts) > 2 and parts[2] in ("parts", "index"):
        return "part" if parts[2] == "parts" else "index"
    if len(parts) > 5 and parts[5] == "c":
        return "block"
    if len(parts) == 6:
        return "array_meta"
    if len(parts) == 5:
        return "shard_group"
    return "commit_group"


@dataclass(frozen=True)
class KillPoint:
    """Die ``when`` ("before"/"after") put number ``nth`` of ``phase`` (any phase if None)."""

    phase: str | None
    nth: int = 0
    when: str = "before"


class PutHook:
    """Counts puts per phase and kills the process at a ``KillPoint`` (or only counts).

    Puts to S3 run several at a time, so "before put n" counts puts started and "after put
    n" counts puts finished.
    """

    def __init__(self, kill: KillPoint | None = None) -> None:
        self.kill = kill
        self.counts: dict[str | None, int] = {}  # puts finished, per phase and in all
        self._started: dict[str | None, int] = {}

    def _step(self, key: str, when: str) -> None:
        counter = self._started if when == "before" else self.counts
        kill = self.kill
        for scope in (None, phase_of(key)):
            number = counter.get(scope, 0)
            counter[scope] = number + 1
            if kill is not None and (kill.phase, kill.nth, kill.when) == (scope, number, when):
                os.kill(os.getpid(), signal.SIGKILL)

    def install(self, monkeypatch: Any | None = None) -> None:
        local_put, s3_put = LocalStore.put_sync, FsspecStore.put
        s3_conditional_put = S3Store.put_if_version  # the commit's root, on S3
        local_delete, s3_delete = LocalStore.delete_prefix, FsspecStore.delete_prefix
        hook = self

        def put_sync(store: LocalStore, key: str, data: Any) -> None:
            hook._step(key, "before")
            local_put(store, key, data)
            hook._step(key, "after")

        async def put(store: FsspecStore, key: str, data: Any) -> None:
            hook._step(key, "before")
            await s3_put(store, key, data)
            hook._step(key, "after")

        async def put_if_version(store: S3Store, key: str, data: Any, *rest: Any) -> None:
            hook._step(key, "before")
            await s3_conditional_put(store, key, data, *rest)
            hook._step(key, "after")

        def deleting(original: Any) -> Any:
            async def delete_prefix(store: Any, prefix: str) -> None:
                if hook.kill is not None and hook.kill.phase == "delete_old":
                    os.kill(os.getpid(), signal.SIGKILL)
                await original(store, prefix)

            return delete_prefix

        replacements = {
            (LocalStore, "put_sync"): put_sync,
            (FsspecStore, "put"): put,
            (S3Store, "put_if_version"): put_if_version,
            (LocalStore, "delete_prefix"): deleting(local_delete),
            (FsspecStore, "delete_prefix"): deleting(s3_delete),
        }
        for (cls, name), function in replacements.items():
            if monkeypatch is not None:
                monkeypatch.setattr(cls, name, function)
            else:
                setattr(cls, name, function)


def _killed_writer(url: str, options: dict[str, Any], seed: int, kill: KillPoint) -> None:
    PutHook(kill).install()
    write_tokens(url, options, seed=seed, tokens_per_shard=TOKENS_PER_SHARD, overwrite=True,
                 **SMALL)  # fmt: skip


def write_killed(location: Location, url: str, seed: int, kill: KillPoint) -> None:
    child = multiprocessing.get_context("fork").Process(
        target=_killed_writer, args=(url, location.storage_options, seed, kill)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, f"the writer was not killed at {kill}"


def read_all(storage: StreamStorage) -> np.ndarray | None:
    """Every token of the committed version, or None if nothing is committed."""
    try:
        with storage.sync_reader() as reader:
            return np.asarray(reader.read(0, reader.total_length)["tokens"])
    except DatasetNotFoundError:
        return None


def check_kill_and_rerun(location: Location, kill: KillPoint, *, previous: bool) -> None:
    """Kill a writer at ``kill``; check what is visible, then that a rerun commits."""
    url, options = location.child("ds"), location.storage_options
    storage = tokens_storage(url, options)
    last = None
    if previous:  # two committed versions, so the next commit deletes the older one
        for seed in (100, 101):
            last = write_tokens(url, options, seed=seed, overwrite=True,
                                tokens_per_shard=TOKENS_PER_SHARD, **SMALL).tokens  # fmt: skip
    old_reader = storage.sync_reader().__enter__() if previous else None
    try:
        write_killed(location, url, 102, kill)
        seen = read_all(storage)
        committed = kill.phase == "delete_old" or (kill.phase == "root" and kill.when == "after")
        if committed:  # the root document was written: the new version is complete
            np.testing.assert_array_equal(seen, token_ground_truth(102, 3, TOKENS_PER_SHARD))
        elif last is not None:
            np.testing.assert_array_equal(seen, last)
        else:
            assert seen is None and not storage.exists()

        rerun = write_tokens(url, options, seed=103, tokens_per_shard=TOKENS_PER_SHARD,
                             overwrite=True, **SMALL)  # fmt: skip
        np.testing.assert_array_equal(read_all(storage), rerun.tokens)
        assert verify_dataset(url, options).ok
        if old_reader is not None and last is not None and not committed:
            # its version is the one the rerun replaced, which is kept for such readers
            window = old_reader.read(1234, 2000)["tokens"]
            np.testing.assert_array_equal(window, last[1234:3234])
    finally:
        if old_reader is not None:
            old_reader.close()


@pytest.fixture(scope="module")
def puts_per_write(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, int]:
    """How many puts of each phase one write makes (counted on a local write)."""
    hook = PutHook()
    with pytest.MonkeyPatch.context() as monkeypatch:
        hook.install(monkeypatch)
        write_tokens(str(tmp_path_factory.mktemp("count") / "ds"), seed=100,
                     tokens_per_shard=TOKENS_PER_SHARD, **SMALL)  # fmt: skip
    assert all(hook.counts.get(phase, 0) >= 1 for phase in PHASES)
    return hook.counts


@pytest.mark.parametrize(
    ("backend", "seed"), [("local", seed) for seed in range(6)] + [("s3", 0), ("s3", 1)]
)
def test_a_writer_killed_at_a_random_put_leaves_the_previous_version_and_a_rerun_succeeds(
    backend: str,
    seed: int,
    puts_per_write: dict[str | None, int],
    request: pytest.FixtureRequest,
    tmp_path: Any,
) -> None:
    location = request.getfixturevalue("s3_url") if backend == "s3" else Location(str(tmp_path), {})
    nth = int(np.random.default_rng(seed).integers(0, puts_per_write[None]))
    check_kill_and_rerun(location, KillPoint(None, nth), previous=seed != 2)


@pytest.mark.parametrize(
    "kill",
    [KillPoint(phase) for phase in PHASES]
    + [
        KillPoint("block", 7, "after"),
        KillPoint("part", 0, "after"),
        KillPoint("root", 0, "after"),
        KillPoint("delete_old"),
    ],
    ids=lambda kill: f"{kill.when}-{kill.phase}-{kill.nth}",
)
def test_a_writer_killed_in_each_phase_leaves_a_consistent_dataset(
    tmp_path: Any, kill: KillPoint
) -> None:
    check_kill_and_rerun(Location(str(tmp_path), {}), kill, previous=True)


@pytest.mark.parametrize("kill", [KillPoint("part"), KillPoint("root")], ids=["part", "root"])
def test_a_writer_killed_on_s3_before_its_root_document_leaves_the_previous_version(
    s3_url: Location, kill: KillPoint
) -> None:
    check_kill_and_rerun(s3_url, kill, previous=True)


def test_a_first_write_killed_before_its_root_document_leaves_nothing_committed(
    tmp_path: Any,
) -> None:
    check_kill_and_rerun(Location(str(tmp_path), {}), KillPoint("root"), previous=False)


def _slow_writer(url: str, options: dict[str, Any], seed: int, tokens_per_shard: int) -> None:
    original = FsspecStore.put

    async def put(store: FsspecStore, key: str, data: Any) -> None:
        await original(store, key, data)
        time.sleep(0.01)  # stretch the write so the parent reads all along it

    FsspecStore.put = put  # type: ignore[method-assign]
    write_tokens(url, options, seed=seed, tokens_per_shard=tokens_per_shard, overwrite=True,
                 **SMALL)  # fmt: skip


def test_readers_keep_reading_their_version_while_a_new_one_is_written_on_s3(
    s3_url: Location,
) -> None:
    url, options = s3_url.url, s3_url.storage_options
    first = write_tokens(url, options, seed=200, tokens_per_shard=TOKENS_PER_SHARD, **SMALL)
    second = token_ground_truth(201, 3, TOKENS_PER_SHARD + 100)
    versions = {len(first.tokens): first.tokens, len(second): second}
    assert len(versions) == 2  # the two versions differ in length: a reader shows which
    rng = np.random.default_rng(0)
    with first.storage.sync_reader() as old:
        child = multiprocessing.get_context("fork").Process(
            target=_slow_writer, args=(url, options, 201, TOKENS_PER_SHARD + 100)
        )
        child.start()
        reads, opened = 0, {len(first.tokens): 0, len(second): 0}
        while child.is_alive() or reads < 10:
            start = int(rng.integers(0, len(first.tokens) - 500))
            window = old.read(start, 500)["tokens"]
            np.testing.assert_array_equal(window, first.tokens[start : start + 500])
            with first.storage.sync_reader() as new:  # whichever version is committed now
                tokens = versions[new.total_length]
                opened[new.total_length] += 1
                start = int(rng.integers(0, new.total_length - 500))
                window = new.read(start, 500)["tokens"]
                np.testing.assert_array_equal(window, tokens[start : start + 500])
            reads += 1
        child.join(60)
        assert child.exitcode == 0
        assert opened[len(first.tokens)] >= 3  # many reads overlapped the write
        np.testing.assert_array_equal(old.read(0, len(first.tokens))["tokens"], first.tokens)
        np.testing.assert_array_equal(read_all(first.storage), second)

        # one more version: the first is now two versions old and is deleted; a reader
        # still on it fails clearly on its next read rather than returning wrong data
        write_tokens(url, options, seed=202, tokens_per_shard=TOKENS_PER_SHARD,
                     overwrite=True, **SMALL)  # fmt: skip
        with pytest.raises(MissingObjectError, match="is missing"):
            old.read(0, 100)
