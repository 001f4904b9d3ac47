"""Tasks on any executor: a Dask cluster gives the same dataset, retried tasks count once."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
from support.corpus import make_texts, write_jsonl

import rangestream
from rangestream import DocumentStorage
from rangestream.formats.records import RecordField, RecordFormat

# Dask workers are separate processes that cannot import this test module by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = RecordFormat(
    [RecordField("ids", np.dtype("<i8")), RecordField("index", np.dtype("<i8"), 0)]
)


def record(index: int) -> dict[str, Any]:
    return {"ids": np.arange(index % 7 + 20, dtype=np.int64) * index, "index": index}


def record_or_die(marker: str, index: int) -> dict[str, Any]:
    """Input 13's first attempt kills its own worker process, halfway through split 2."""
    if index == 13 and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return record(index)


def stored_objects(root: Path) -> dict[str, bytes]:
    attributes = json.loads((root / "zarr.json").read_text())["attributes"]["rangestream"]
    prefix = root / attributes["data_prefix"]
    return {
        str(p.relative_to(prefix)): p.read_bytes()
        for p in sorted(prefix.rglob("*"))
        if p.is_file() and "parts" not in p.parts
    }


def test_convert_on_a_dask_cluster_writes_the_same_objects_as_in_process(
    tmp_path: Path, tokenizer_json: Path, dask_client: Any
) -> None:
    rows = [{"text": t} for t in make_texts(200, seed=21)]
    source = str(write_jsonl(tmp_path / "in.jsonl", rows))
    kwargs = {"preset": "seq", "tokenizer": tokenizer_json, "split_bytes": 3000, "progress": False}
    local = rangestream.convert(source, tmp_path / "local", workers=0, **kwargs)
    dask = rangestream.convert(
        source, tmp_path / "dask", executor=dask_client.get_executor(), **kwargs
    )
    assert dask.shards == local.shards > 4
    assert (dask.records, dask.tokens) == (local.records, local.tokens)
    assert stored_objects(tmp_path / "dask") == stored_objects(tmp_path / "local")


def test_a_worker_killed_mid_task_leaves_its_split_exactly_once(
    tmp_path: Path, dask_client: Any
) -> None:
    marker = tmp_path / "killed"
    summary = rangestream.write(
        functools.partial(record_or_die, str(marker)),
        range(30),
        tmp_path / "ds",
        kind="document",
        storage_format=RECORDS,
        items_per_split=5,
        executor=dask_client.get_executor(),
        chunk_bytes=64,
        block_bytes=512,  # blocks are uploaded while the split is written
        progress=False,
    )
    assert marker.exists()  # a worker did die in the middle of split 2
    dask_client.wait_for_workers(2, timeout=60)
    assert (summary.records, summary.shards) == (30, 6)
    parts = sorted(p.name for p in (tmp_path / "ds").glob("data/*/parts/*.json"))
    assert parts == [f"split-{k:08d}.json" for k in range(6)]
    with DocumentStorage(tmp_path / "ds", RECORDS).sync_reader() as reader:
        assert len(reader) == 30
        for index in range(30):
            got = reader.read(index)
            assert int(got["index"]) == index
            assert got["ids"].tolist() == record(index)["ids"].tolist()


def record_unless(marker: str, index: int) -> dict[str, Any]:
    """Input 13 (split 2) fails until ``marker`` exists: an interrupted conversion."""
    if index == 13 and not os.path.exists(marker):
        raise RuntimeError("input 13 is not ready")
    return record(index)


def test_an_interrupted_write_on_a_dask_cluster_resumes_there_skipping_written_splits(
    tmp_path: Path, dask_client: Any
) -> None:
    marker = tmp_path / "ready"
    kwargs: dict[str, Any] = {
        "kind": "document", "storage_format": RECORDS, "items_per_split": 5,
        "chunk_bytes": 64, "block_bytes": 512, "progress": False,
    }  # fmt: skip
    fn = functools.partial(record_unless, str(marker))
    executor = dask_client.get_executor()
    try:
        rangestream.write(fn, range(30), tmp_path / "ds", executor=executor, **kwargs)
    except RuntimeError as error:
        assert "not ready" in str(error)
    else:
        raise AssertionError("split 2 should have failed")
    assert not DocumentStorage(tmp_path / "ds", RECORDS).exists()
    marker.write_text("")
    resumed = rangestream.write(
        fn, range(30), tmp_path / "ds", executor=executor, resume=True, **kwargs
    )
    # split 0 or 1 ended before split 2 began (two workers), so at least one is reused
    assert resumed.splits == 6 and 1 <= resumed.splits_skipped < 6
    assert resumed.added is not None and resumed.splits_skipped + resumed.added.split == 6
    assert len(resumed.results) == 6 and resumed.rows == 30  # the whole dataset
    rangestream.write(record, range(30), tmp_path / "clean", workers=0, **kwargs)
    assert stored_objects(tmp_path / "ds") == stored_objects(tmp_path / "clean")
