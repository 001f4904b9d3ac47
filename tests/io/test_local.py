"""LocalStore: a dataset directory holding what rangestream did not write is refused, never
waited on: a FIFO in place of a block (open would block forever) and a symbolic link that
leads out of the dataset."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import StorageError, UnsafeKeyError
from rangestream.storage.maintenance.verify import verify_dataset

TOKENS = np.dtype([("tokens", "<i4")])


def write(path: Path) -> tuple[StreamStorage, Path]:
    """A one-shard dataset and the file of its first stream block."""
    storage = StreamStorage(path, StreamNumpyFormat(TOKENS))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": np.arange(5000, dtype="<i4")})
    block = next(path.glob("data/*/shards/0/stream/c/0/0"))
    return storage, block


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mapped", [True, False])
def test_a_fifo_in_place_of_a_block_is_refused_without_blocking(
    tmp_path: Path, mapped: bool
) -> None:
    _, block = write(tmp_path / "ds")
    block.unlink()
    os.mkfifo(block)
    reader_storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), mapped=mapped)
    with reader_storage.sync_reader() as reader, pytest.raises(StorageError, match="FIFO"):
        reader.read(10, 100)
    report = verify_dataset(str(tmp_path / "ds"))  # reports it, instead of waiting forever
    assert not report.ok and any(str(block) in problem.where for problem in report.problems)


@pytest.mark.parametrize("mapped", [True, False])
def test_a_symlink_out_of_the_dataset_is_refused(tmp_path: Path, mapped: bool) -> None:
    _, block = write(tmp_path / "ds")
    outside = tmp_path / "elsewhere"
    outside.write_bytes(block.read_bytes())  # the same bytes, valid checksums and all
    block.unlink()
    block.symlink_to(outside)
    reader_storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(TOKENS), mapped=mapped)
    with reader_storage.sync_reader() as reader, pytest.raises(UnsafeKeyError, match="outside"):
        reader.read(10, 100)


def test_a_dataset_whose_root_is_a_symlink_reads_normally(tmp_path: Path) -> None:
    write(tmp_path / "ds")
    (tmp_path / "alias").symlink_to(tmp_path / "ds")
    with StreamStorage(tmp_path / "alias", StreamNumpyFormat(TOKENS)).sync_reader() as reader:
        np.testing.assert_array_equal(reader.read(10, 100)["tokens"], np.arange(10, 110))


def test_reads_on_many_threads_through_a_small_fd_cache_each_return_their_own_file(
    tmp_path: Path,
) -> None:
    """A descriptor evicted while another thread still reads through it must not be closed
    under that read: its number would go to the next file opened, whose bytes the read
    would then return as the evicted file's."""
    from concurrent.futures import ThreadPoolExecutor

    from rangestream.io.local import LocalStore

    files = 200
    for i in range(files):
        (tmp_path / f"{i}.bin").write_bytes(i.to_bytes(2, "little") * 512)
    store = LocalStore(tmp_path, max_open_files=2)
    rounds = 5

    def read_all(offset: int) -> list[int]:
        wrong = []
        for _ in range(rounds):
            for j in range(files):
                i = (j * 7 + offset) % files
                reads = (
                    store.get_range_sync(f"{i}.bin", 0, 1024),
                    store.get_suffix_sync(f"{i}.bin", 1024),
                    store.get_sync(f"{i}.bin"),
                )
                wrong += [i for data in reads if data != i.to_bytes(2, "little") * 512]
        return wrong

    with ThreadPoolExecutor(8) as pool:
        wrong = [i for found in pool.map(read_all, range(8)) for i in found]
    store.close_files()
    assert wrong == []
    assert _open_files_under(tmp_path) == 0  # every retired descriptor was closed


def _open_files_under(path: Path) -> int:
    """Descriptors of this process open on files under ``path`` (none may leak)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(str(path))
    return count
