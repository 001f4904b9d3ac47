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
from rangestream.storage.verify import verify_dataset

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
