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


# -- commits read parts concurrently; writers keep a budget; short shards stay small ----------


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
    assert writing.COMMIT_CONCURRENCY // 2 <= stats.max_in_flight <= writing.COMMIT_CONCURRENCY
    assert read_all(storage).tolist() == [t for part in range(parts) for t in range(part % 5 + 1)]


BYTES = np.dtype([("b", "u1")])


def bytes_storage(location: Location, **options: Any) -> StreamStorage:
    return StreamStorage(location.child("ds"), StreamNumpyFormat(BYTES),
                         storage_options=location.storage_options, **options)  # fmt: skip


def test_spilled_pieces_cost_a_put_each_and_a_get_each_when_their_block_is_assembled(
    s3_url: Location, s3_proxy: LatencyProxy
) -> None:
    options = s3_proxy.merge_storage_options(s3_url.storage_options)
    storage = bytes_storage(Location(s3_url.url, options))
    record = {"b": np.arange(92, dtype="u1")}  # 92 bytes of stream + 8 of record_ends
    session = storage.parallel_write()
    s3_proxy.reset_stats()
    with session.sync_writer(part_id="w", max_buffered_bytes=250) as writer:
        writer.append(0, record)
        writer.append(1, record)
        assert writer.buffered_bytes == 200
        writer.append(2, record)  # 300 > 250: shard 0 (least recent) spills 2 pieces
        assert writer.buffered_bytes == 200
        writer.append(0, record)  # 300 again: shard 1 spills, 0 was just appended
        assert writer.buffered_bytes == 200
    stats = s3_proxy.stats()
    # at close, shards 0 and 1 read back their pieces; the spill prefix is listed and
    # its pieces deleted in one batch
    assert stats.method("GET") == 4 + 1 and stats.method("POST") == 1
    # 3 shards x (2 blocks, 2 array documents, 1 group) + 4 pieces + the part manifest
    assert stats.method("PUT") == 3 * 5 + 4 + 1
    session.commit()
    with storage.sync_reader() as reader:
        assert reader.read(0, 184)["b"].tolist() == list(range(92)) * 2
        assert reader.read(184, 184)["b"].tolist() == list(range(92)) * 2
        assert [reader.num_records(s) for s in range(3)] == [2, 1, 1]
    assert not any("/spill/" in key for key in _keys(storage))


def _keys(storage: StreamStorage) -> list[str]:
    from rangestream.io.process import run_blocking

    store = storage._new_write_store()

    async def listing() -> list[str]:
        try:
            return await store.list("")
        finally:
            await store.aclose()

    return run_blocking(listing())


def test_blocks_filled_across_many_spills_hold_the_rows_in_append_order(
    location: Location,
) -> None:
    rng = np.random.default_rng(1)
    storage = bytes_storage(location, chunk_bytes=16, block_bytes=512)  # 480-row blocks
    appended: dict[int, list[np.ndarray]] = {shard: [] for shard in range(6)}
    with storage.sync_writer() as writer:
        writer.max_buffered_bytes = 300  # a budget far below one block per shard
        for _ in range(400):
            shard = int(rng.integers(0, 6))
            values = rng.integers(0, 256, int(rng.integers(1, 40))).astype("u1")
            writer.append(shard, {"b": values})
            appended[shard].append(values)
            assert writer.buffered_bytes <= 300
    truth = np.concatenate([np.concatenate(appended[s]) for s in range(6)])
    with storage.sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(0, len(truth))["b"], truth)
    assert not any("/spill/" in key for key in _keys(storage))


_PEAK_WRITING = """
import sys, tracemalloc
import numpy as np
from rangestream import StreamNumpyFormat, StreamStorage
path, shards, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) or None
storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("b", "u1")])), block_bytes=1 << 16)
session = storage.parallel_write()
record = {"b": np.zeros(16 * 1024, dtype="u1")}
tracemalloc.start()
with session.sync_writer(max_buffered_bytes=budget) as writer:
    for _ in range(3):  # 48 KiB per shard: no 64 KiB block ever fills
        for shard in range(shards):
            writer.append(shard, record)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
session.commit()
with storage.sync_reader() as reader:
    assert reader.total_length == shards * 3 * 16 * 1024
print(peak)
"""


def _peak_writing(path: Path, shards: int, budget: int | None) -> int:
    """The traced peak of a writer's appends and close, in a process of its own."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _PEAK_WRITING, str(path), str(shards), str(budget or 0)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def test_a_writers_memory_is_bounded_by_its_budget_not_by_its_shards(tmp_path: Path) -> None:
    budget = 256 * 1024
    bounded = [_peak_writing(tmp_path / f"b{n}", n, budget) for n in (150, 300)]
    unbounded = _peak_writing(tmp_path / "u", 150, None)  # the default budget is not reached
    assert unbounded > 150 * 48 * 1024  # every shard's partial block in memory
    # the budget, each shard's bookkeeping, and the interpreter's own (a resize of its
    # table of interned strings, which local paths go through, showed up as 0.9 MiB)
    assert bounded[0] < budget + 3 * 1024 * 1024
    # 150 more shards add their bookkeeping, not their 7 MiB of rows
    assert bounded[1] - bounded[0] < 150 * 12 * 1024


def test_a_short_shard_is_stored_in_kilobytes_with_one_block_per_array(tmp_path: Path) -> None:
    storage = tokens_storage(str(tmp_path / "ds"))
    write(storage, np.arange(3, dtype="<i4"))
    with storage.sync_reader() as reader:
        stream = reader.opened.manifest.arrays["stream"]
        ends = reader.opened.manifest.arrays["record_ends"]
        prefix = tmp_path / "ds" / "data" / reader.opened.manifest.commit_id / "shards" / "0"
    # one inner chunk and a chunk index of one entry (16 bytes and its 4-byte crc32c)
    assert (prefix / "stream" / "c" / "0" / "0").stat().st_size == stream.chunk_nbytes + 4 + 20
    assert (prefix / "record_ends" / "c" / "0").stat().st_size == ends.chunk_nbytes + 4 + 20
    document = json.loads((prefix / "stream" / "zarr.json").read_bytes())
    assert document["chunk_grid"]["configuration"]["chunk_shape"][0] == stream.chunk_rows
    total = sum(p.stat().st_size for p in prefix.rglob("*") if p.is_file())
    assert total < 12 * 1024  # 86 KB when every block carried a 4 MiB block's chunk index
