"""Writes and commits: hostile inputs end in library errors with bounded memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import CommitError
from rangestream.storage import writing

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
