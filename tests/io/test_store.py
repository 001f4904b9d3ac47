"""open_store: the store for a URL, and URLs of a known scheme in the wrong form refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import StorageError
from rangestream.io import FsspecStore, LocalStore, S3Store, open_store


@pytest.mark.parametrize("url", ["s3:/bucket/x", "s3:bucket/x", "memory:/name", "file:/tmp/x"])
def test_a_known_scheme_without_its_slashes_is_refused_naming_the_form(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match="lacks its '//'"):
        open_store(url)
    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("t", "<i4")])))
    with pytest.raises(StorageError, match="lacks its '//'"):
        storage.sync_writer()
    assert not any(tmp_path.iterdir())  # no local directory named "s3:" was made


def test_urls_get_the_store_of_their_scheme(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_store("s3://bucket/prefix"), S3Store)
    assert isinstance(open_store("memory://name"), FsspecStore)
    with pytest.raises(StorageError, match="names no bucket"):
        open_store("s3://")
