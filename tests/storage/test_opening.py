"""Opening: what a missing dataset is called, and one open per process shared by readers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.s3 import S3Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import DatasetNotFoundError

TOKENS = np.dtype([("tokens", "<i4")])


def test_a_missing_bucket_is_called_a_missing_bucket(s3_url: S3Location) -> None:
    url = "s3://rangestream-no-such-bucket-7f3a/ds"
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=s3_url.storage_options)
    with pytest.raises(DatasetNotFoundError, match="bucket 'rangestream-no-such-bucket-7f3a' does"):
        storage.sync_reader().read(0, 1)


def test_a_missing_local_directory_and_an_uncommitted_one_are_told_apart(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no such directory"):
        StreamStorage(tmp_path / "nothing", StreamNumpyFormat(TOKENS)).sync_reader().read(0, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="never committed"):
        StreamStorage(tmp_path / "empty", StreamNumpyFormat(TOKENS)).sync_reader().read(0, 1)


def test_a_prefix_without_a_dataset_in_an_existing_bucket_is_not_committed(
    s3_url: S3Location,
) -> None:
    storage = StreamStorage(s3_url.url, StreamNumpyFormat(TOKENS),
                            storage_options=s3_url.storage_options)  # fmt: skip
    with pytest.raises(DatasetNotFoundError, match="never committed"):
        storage.sync_reader().read(0, 1)
