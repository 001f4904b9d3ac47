"""``gc``: every version no reader can reach is found, old ones deleted, live ones never."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import s3fs
from support.s3 import Location

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.errors import MetadataError
from rangestream.storage.maintenance.gc import collect_garbage

#: on every server of the S3 matrix (support/s3_matrix.py)
pytestmark = pytest.mark.s3_core

TOKENS = np.dtype([("t", "<i4")])
#: Small blocks, so that a killed write has uploaded whole blocks before it dies.
SMALL = {"chunk_bytes": 256, "block_bytes": 4096}

KILLED_WRITER = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    from rangestream import StreamNumpyFormat, StreamStorage
    url, options = sys.argv[1], json.loads(sys.argv[2])
    storage = StreamStorage(url, StreamNumpyFormat(np.dtype([("t", "<i4")])),
                            storage_options=options, chunk_bytes=256, block_bytes=4096)
    writer = storage.sync_writer(overwrite=True)
    writer.append(0, {"t": np.arange(20 * 1024, dtype="<i4")})  # 20 blocks, <= 8 pending
    print(writer.session.commit_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def storage_at(location: Location) -> StreamStorage:
    return StreamStorage(
        location.url, StreamNumpyFormat(TOKENS), storage_options=location.storage_options, **SMALL
    )


def write(location: Location, values: np.ndarray) -> str:
    storage = storage_at(location)
    with storage.sync_writer(overwrite=True) as writer:
        writer.append(0, {"t": values})
    return writer.session.commit_id


def killed_write(location: Location) -> str:
    """The commit id of a write killed with SIGKILL after uploading some blocks."""
    run = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, location.url, json.dumps(location.storage_options)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    return run.stdout.strip()


def stored_objects(location: Location, prefix: str) -> dict[str, int]:
    """Object sizes under ``prefix``, listed without rangestream."""
    if not location.is_s3:
        base = Path(location.url) / prefix
        return {
            str(path.relative_to(location.url)): path.stat().st_size
            for path in base.rglob("*")
            if path.is_file()
        }
    fs = s3fs.S3FileSystem(**location.storage_options, skip_instance_cache=True)
    root = location.url[len("s3://") :]
    found = fs.find(f"{root}/{prefix}", detail=True)
    return {
        path[len(root) + 1 :]: int(info["size"])
        for path, info in found.items()
        if info.get("type") == "file"
    }


def test_a_killed_write_is_listed_with_its_size_and_deleted_only_when_asked(
    location: Location,
) -> None:
    first = write(location, np.arange(100, dtype="<i4"))
    second = write(location, np.arange(50, dtype="<i4"))
    killed = killed_write(location)
    leftovers = stored_objects(location, f"data/{killed}")
    assert len(leftovers) >= 12  # whole blocks made it before the kill

    listed = collect_garbage(location.url, location.storage_options, grace=0)
    assert (listed.committed, listed.previous) == (second, first)
    assert [(o.prefix, o.objects, o.bytes) for o in listed.orphans] == [
        (f"data/{killed}", len(leftovers), sum(leftovers.values()))
    ]
    assert not listed.deleted and stored_objects(location, f"data/{killed}") == leftovers

    deleted = collect_garbage(location.url, location.storage_options, grace=0, delete=True)
    assert deleted.deleted and [o.prefix for o in deleted.orphans] == [f"data/{killed}"]
    assert stored_objects(location, f"data/{killed}") == {}
    assert stored_objects(location, f"data/{first}") and stored_objects(location, f"data/{second}")
    with storage_at(location).sync_reader() as reader:
        assert reader.read(0, 50)["t"].tolist() == list(range(50))


def test_a_version_younger_than_the_grace_period_is_kept(location: Location) -> None:
    write(location, np.arange(10, dtype="<i4"))
    killed = killed_write(location)
    report = collect_garbage(location.url, location.storage_options, delete=True)  # 24 h
    assert report.orphans == [] and [o.prefix for o in report.young] == [f"data/{killed}"]
    assert stored_objects(location, f"data/{killed}")


def test_writes_never_committed_are_all_orphans(tmp_path: Path) -> None:
    location = Location(str(tmp_path / "ds"), {})
    killed = {killed_write(location), killed_write(location)}
    report = collect_garbage(location.url, grace=0)
    assert report.committed is None
    assert {o.prefix for o in report.orphans} == {f"data/{k}" for k in killed}


def test_an_unreadable_root_stops_gc_before_it_deletes_anything(tmp_path: Path) -> None:
    location = Location(str(tmp_path / "ds"), {})
    write(location, np.arange(10, dtype="<i4"))
    killed = killed_write(location)
    (tmp_path / "ds" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    with pytest.raises(MetadataError, match="nothing is collected"):
        collect_garbage(location.url, grace=0, delete=True)
    assert stored_objects(location, f"data/{killed}")


def test_objects_outside_versions_are_left_alone(tmp_path: Path) -> None:
    location = Location(str(tmp_path / "ds"), {})
    write(location, np.arange(10, dtype="<i4"))
    (tmp_path / "ds" / "data" / "notes").mkdir()
    (tmp_path / "ds" / "data" / "notes" / "readme.txt").write_text("mine")
    report: Any = collect_garbage(location.url, grace=0, delete=True)
    assert report.orphans == [] and (tmp_path / "ds" / "data" / "notes" / "readme.txt").exists()
    assert os.listdir(tmp_path / "ds" / "data")
