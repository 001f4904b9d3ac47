"""Writers with a caller-chosen part id: a second run of the same work replaces the first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage

FORMAT = StreamNumpyFormat(np.dtype([("tokens", "<i4")]))


def test_a_rerun_with_the_same_part_id_replaces_the_part_instead_of_conflicting(
    tmp_path: Path,
) -> None:
    storage = StreamStorage(tmp_path / "ds", FORMAT)
    session = storage.parallel_write()
    for attempt in range(2):  # the same shard written twice, as a retried task would
        with session.sync_writer(part_id="split-00000003") as writer:
            writer.append(3, {"tokens": np.arange(5, dtype="<i4") + 10 * attempt})
    with session.sync_writer(part_id="split-00000004") as writer:
        writer.append(4, {"tokens": np.arange(2, dtype="<i4")})
    parts = sorted(p.name for p in (tmp_path / "ds" / session.prefix / "parts").iterdir())
    assert parts == ["split-00000003.json", "split-00000004.json"]
    session.commit()
    with storage.sync_reader() as reader:
        assert reader.read(0, 7)["tokens"].tolist() == [10, 11, 12, 13, 14, 0, 1]


def test_random_part_ids_of_two_writers_of_one_shard_still_conflict(tmp_path: Path) -> None:
    from rangestream.errors import CommitError

    storage = StreamStorage(tmp_path / "ds", FORMAT)
    session = storage.parallel_write()
    for _ in range(2):
        with session.sync_writer() as writer:
            writer.append(0, {"tokens": np.arange(3, dtype="<i4")})
    with pytest.raises(CommitError, match="two writers"):
        session.commit()


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "x" * 129, ".."])
def test_a_part_id_that_is_not_a_plain_name_is_refused(tmp_path: Path, bad: str) -> None:
    session = StreamStorage(tmp_path / "ds", FORMAT).parallel_write()
    with pytest.raises(ValueError, match="part_id"):
        session.sync_writer(part_id=bad)
