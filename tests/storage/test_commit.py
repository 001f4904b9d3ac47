"""The commit: parts read concurrently, hostile parts and roots, concurrent commits."""

from __future__ import annotations

import json
import multiprocessing
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import (
    CommitConflictError,
    CommitError,
)
from rangestream.storage.core import commit, writing
from rangestream.storage.core import parts as part_manifests
from rangestream.storage.core import root as root_module
from rangestream.storage.maintenance.gc import collect_garbage
from testkit import LatencyProxy

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core

TOKENS = np.dtype([("t", "<i4")])


def tokens_storage(url: str) -> StreamStorage:
    return StreamStorage(url, StreamNumpyFormat(TOKENS))


def write(storage: StreamStorage, values: np.ndarray, *, overwrite: bool = False) -> None:
    with storage.sync_writer(overwrite=overwrite) as writer:
        writer.append(0, {"t": values})


def read_all(storage: StreamStorage) -> np.ndarray:
    with storage.sync_reader() as reader:
        return np.asarray(reader.read(0, reader.total_length)["t"])


def test_a_part_manifest_nested_100000_deep_fails_the_commit_with_a_library_error(
    tmp_path: Path,
) -> None:
    storage = tokens_storage(str(tmp_path / "ds"))
    session = storage.parallel_write()
    with session.sync_writer() as writer:
        writer.append(0, {"t": np.arange(10, dtype="<i4")})
    (part,) = (tmp_path / "ds" / session.prefix / "parts").iterdir()
    part.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CommitError, match="part manifest"):
        session.commit()
    assert not storage.exists()


def test_an_overwrite_reads_at_most_the_metadata_cap_of_a_huge_old_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = tokens_storage(str(tmp_path / "ds"))
    write(storage, np.arange(10, dtype="<i4"))
    root = tmp_path / "ds" / "zarr.json"
    with open(root, "r+b") as handle:  # 64 MiB, sparse: costs no disk
        handle.truncate(64 << 20)
    cap = 1 << 20
    monkeypatch.setattr(root_module, "MAX_ROOT_BYTES", cap)  # the old root's read
    monkeypatch.setattr(part_manifests, "MAX_ROOT_BYTES", cap)  # the parts' reads
    tracemalloc.start()
    try:
        write(storage, np.arange(5, dtype="<i4"), overwrite=True)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * cap, f"the old root was read whole: {peak:,} bytes at the peak"
    assert read_all(storage).tolist() == [0, 1, 2, 3, 4]
    extra = json.loads(root.read_bytes())["attributes"]["rangestream"]["extra"]
    assert "previous_commit_id" not in extra  # an unreadable old root names no version


# -- concurrent commits: a lost version is reported to its writer, never silent ---------------

ROUNDS = 3
WRITERS = 4


def _commit_in_rounds(
    url: str, options: dict[str, Any], worker: int, barrier: Any, results: Any
) -> None:
    """One writer process: each round, write a part, wait for the others, commit."""
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)
    for round_number in range(ROUNDS):
        session = storage.parallel_write(overwrite=True)
        with session.sync_writer() as writer:
            writer.append(0, {"t": np.full(8, 100 * round_number + worker, dtype="<i4")})
        barrier.wait()  # every writer commits at once
        try:
            manifest = session.commit()
            outcome = ("committed", manifest.extra.get("previous_commit_id"))
        except CommitConflictError as error:
            outcome = ("conflict", str(error))
        except Exception as error:  # reported, so the test names it
            outcome = ("error", repr(error))
        results.put((round_number, worker, session.commit_id, *outcome))
        barrier.wait()


@pytest.mark.s3_limit(
    "rclone",
    "rclone ignores If-Match / If-None-Match: its cases declare one writer at a time, which "
    "concurrent writers break (test_conditional_commits: undeclared, they are refused)",
    strict=False,  # a race: some runs lose no commit
)
def test_concurrent_commits_either_chain_up_or_learn_they_lost(location: Location) -> None:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(WRITERS), context.Queue()
    processes = [
        context.Process(
            target=_commit_in_rounds,
            args=(location.url, location.storage_options, worker, barrier, results),
        )
        for worker in range(WRITERS)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=240) for _ in range(ROUNDS * WRITERS)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    errors = [outcome for outcome in outcomes if outcome[3] == "error"]
    assert not errors, errors
    previous_of = {commit: prev for _r, _w, commit, kind, prev in outcomes if kind == "committed"}
    # every commit that reported success is the committed version or one it replaced
    storage = StreamStorage(
        location.url, StreamNumpyFormat(TOKENS), storage_options=location.storage_options
    )
    with storage.sync_reader() as reader:
        final = reader.opened.manifest.commit_id
        values = np.asarray(reader.read(0, reader.total_length)["t"])
    chain, commit = [], final
    while commit in previous_of:
        chain.append(commit)
        commit = previous_of[commit]
    assert set(previous_of) == set(chain), "a commit reported success but was lost"
    conflicts = [outcome for outcome in outcomes if outcome[3] == "conflict"]
    assert conflicts, "no commit ever raced another: the test proved nothing"
    assert all("rangestream gc" in message for *_, message in conflicts)
    (winner,) = [(r, w) for r, w, commit, *_ in outcomes if commit == final]
    assert values.tolist() == [100 * winner[0] + winner[1]] * 8
    # the lost versions are exactly what gc collects (older successes were deleted by the
    # commits two after them)
    report = collect_garbage(location.url, location.storage_options, grace=0)
    lost = {f"data/{commit}" for _r, _w, commit, kind, _m in outcomes if kind == "conflict"}
    assert {orphan.prefix for orphan in report.orphans} == lost


@pytest.mark.s3_limit(
    "rclone",
    "with one writer declared (rclone ignores conditions) a commit checks the root, then "
    "writes it: one more GET than the conditional write",
)
def test_a_commit_reads_its_parts_concurrently_one_request_each(
    s3_url: Location, s3_proxy: LatencyProxy
) -> None:
    parts = 150
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_url.storage_options)  # fmt: skip
    session = storage.parallel_write()
    for part in range(parts):
        with session.sync_writer(part_id=f"p{part}") as writer:
            writer.append(part, {"t": np.arange(part % 5 + 1, dtype="<i4")})
    proxied = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_proxy.merge_storage_options(
                                s3_url.storage_options))  # fmt: skip
    s3_proxy.delay = 0.05  # every request takes 50 ms: those sent together overlap
    s3_proxy.reset_stats()
    writing.WriteSession(proxied, session.commit_id).commit()
    stats = s3_proxy.stats()
    s3_proxy.delay = 0.0
    # the root (read, then read back after the put), the listing of parts, one get per part
    assert stats.method("GET") == parts + 3 and stats.range_gets == parts + 2
    assert commit.COMMIT_CONCURRENCY // 2 <= stats.max_in_flight <= commit.COMMIT_CONCURRENCY
    assert read_all(storage).tolist() == [t for part in range(parts) for t in range(part % 5 + 1)]
