"""Writes and commits: hostile inputs end in library errors with bounded memory."""

from __future__ import annotations

import json
import multiprocessing
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.s3 import Location

from rangestream import RetryPolicy, StreamNumpyFormat, StreamStorage
from rangestream.errors import (
    AccessDeniedError,
    CommitConflictError,
    CommitError,
    StorageError,
)
from rangestream.storage import writing
from rangestream.storage.gc import collect_garbage
from testkit import FaultConfig, FaultKind, LatencyProxy, S3Endpoint

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
    monkeypatch.setattr(writing, "MAX_ROOT_BYTES", cap)
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


# -- every error a user can cause on the write path is a library error ------------------------

FAST = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02, request_timeout=5)


def test_writing_with_a_wrong_secret_is_an_access_denied_library_error(s3_url: Location) -> None:
    options = {**s3_url.storage_options, "secret": "not-the-secret"}
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS), storage_options=options)
    with pytest.raises(AccessDeniedError) as caught:
        write(storage, np.arange(4, dtype="<i4"))
    assert isinstance(caught.value, PermissionError)  # code written for builtins still works
    assert s3_url.url in str(caught.value)


def test_a_dataset_path_under_a_regular_file_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    storage = tokens_storage(str(tmp_path / "file" / "ds"))
    with pytest.raises(StorageError, match="file/ds"):
        write(storage, np.arange(4, dtype="<i4"))


@pytest.fixture
def denying_proxy(s3_server: S3Endpoint) -> Iterator[LatencyProxy]:
    with LatencyProxy(s3_server, delay=0.0) as proxy:
        yield proxy


def proxied(url: str, proxy: LatencyProxy) -> StreamStorage:
    # small blocks: a few appended KiB are uploaded before the with block ends
    return StreamStorage(
        url,
        StreamNumpyFormat(TOKENS),
        storage_options=proxy.storage_options,
        retry=FAST,
        chunk_bytes=256,
        block_bytes=4096,
    )


def test_a_refused_commit_is_an_access_denied_library_error(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    # only the root document's PUT is refused: blocks and parts go through
    denying_proxy.set_faults(
        FaultConfig(
            access_denied=1.0, methods={"PUT"}, path_regex=r"/[^/]+-[0-9a-f]{8}/zarr\.json$"
        )
    )
    with pytest.raises(AccessDeniedError, match=r"zarr\.json"):
        write(proxied(s3_url.url, denying_proxy), np.arange(4, dtype="<i4"))
    assert denying_proxy.stats().fault(FaultKind.ACCESS_DENIED) >= 1


def test_a_refused_abort_is_an_access_denied_library_error(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    session = proxied(s3_url.url, denying_proxy).parallel_write()
    with session.sync_writer() as writer:
        writer.append(0, {"t": np.arange(4, dtype="<i4")})
    denying_proxy.set_faults(FaultConfig(access_denied=1.0, methods={"POST", "DELETE"}))
    with pytest.raises(AccessDeniedError):
        session.abort()


# -- a failed write whose clean-up fails too raises its own failure ---------------------------


class WriteFailed(Exception):
    """The failure of the user's code inside a writer's ``with`` block."""


def test_a_write_whose_clean_up_fails_raises_its_own_failure_with_the_clean_up_as_context(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    storage = proxied(s3_url.url, denying_proxy)
    with pytest.raises(WriteFailed) as caught, storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(16384, dtype="<i4")})  # 16 blocks, 8 at most pending
        denying_proxy.set_faults(FaultConfig(access_denied=1.0, methods={"POST", "DELETE"}))
        raise WriteFailed("the data source broke")
    failure = caught.value
    assert isinstance(failure.__context__, AccessDeniedError)
    assert any("rangestream gc" in note for note in getattr(failure, "__notes__", []))
    denying_proxy.clear_faults()
    (leftover,) = collect_garbage(s3_url.url, s3_url.storage_options, grace=0).orphans
    assert leftover.objects >= 8 and leftover.prefix in failure.__notes__[-1]


def test_a_commit_whose_clean_up_fails_raises_the_commit_failure(
    s3_url: Location, denying_proxy: LatencyProxy
) -> None:
    denying_proxy.set_faults(
        FaultConfig(
            access_denied=1.0,
            methods={"PUT", "POST", "DELETE"},
            # the root's PUT and the bulk delete (a POST to the bucket) are refused
            path_regex=r"(/[^/]+-[0-9a-f]{8}/zarr\.json$)|(^/[^/]+/?$)",
        )
    )
    storage = proxied(s3_url.url, denying_proxy)
    with pytest.raises(AccessDeniedError, match=r"zarr\.json") as caught:
        write(storage, np.arange(4, dtype="<i4"))
    assert isinstance(caught.value.__context__, AccessDeniedError)
    assert "zarr.json" not in str(caught.value.__context__)
