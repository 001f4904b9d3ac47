"""``rangestream inspect``: what a dataset holds, counted as the user appended it."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rangestream import (
    DocumentPickleFormat,
    DocumentStorage,
    StreamNumpyFormat,
    StreamStorage,
    TemporalArrayStorage,
)
from rangestream.cli.main import main

TOKENS = np.dtype([("tokens", "<i4"), ("loss_mask", "u1")])


def inspect_json(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["inspect", url, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_a_token_stream_is_counted_in_records_and_elements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "tokens")
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(1, 500, size=37)]
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    with storage.sync_writer() as writer:
        for record, n in enumerate(lengths):
            writer.append(record % 3, {"tokens": np.arange(n), "loss_mask": np.ones(n, "u1")})
    summary = inspect_json(url, capsys)
    assert summary["kind"] == "stream"
    assert summary["counts"] == {"records": 37, "elements": sum(lengths)}
    assert summary["schema"]["fields"] == ["tokens int32", "loss_mask uint8"]
    assert summary["shards"] == 3
    version = tmp_path / "tokens" / "data" / summary["commit_id"]
    assert summary["stored_objects"] == len(files_under(version))
    assert summary["stored_bytes"] == sum(p.stat().st_size for p in files_under(version))
    committed = datetime.datetime.fromisoformat(summary["committed_at"].replace("Z", "+00:00"))
    assert before <= committed <= datetime.datetime.now(datetime.UTC)
    assert summary["orphans"] == [] and summary["previous_commit_id"] is None

    assert main(["inspect", url]) == 0
    text = capsys.readouterr().out
    assert f"records   37\nelements  {sum(lengths):,}\nshards    3" in text
    assert f"version   {summary['commit_id']}, committed {summary['committed_at']}" in text
    assert "orphans   none" in text


def test_documents_are_counted_not_their_offsets_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "docs")
    documents = [{"id": i, "text": "x" * i} for i in range(25)]
    storage = DocumentStorage(url, DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for i, document in enumerate(documents):
            writer.append(i % 4, document)
    summary = inspect_json(url, capsys)
    heap = sum(len(DocumentPickleFormat().pack(d)) for d in documents)
    assert summary["counts"] == {"documents": 25, "payload bytes": heap}
    assert summary["schema"]["payload_encoding"] == "pickle"


def test_temporal_records_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "tracks")
    storage = TemporalArrayStorage(url, field_groups=[["clock", "pose"]])
    with storage.sync_writer() as writer:
        for record in range(7):
            frames = 10 + record
            writer.append(
                record % 2,
                {"clock": np.arange(frames, dtype="<f8"), "pose": np.ones((frames, 3), "<f4")},
            )
    summary = inspect_json(url, capsys)
    assert summary["kind"] == "temporal" and summary["counts"]["records"] == 7
    assert summary["schema"]["fields"] == ["clock float64", "pose float32 x [3]"]


def test_an_overwrite_and_an_orphan_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "tokens")
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
    commits = []
    for n in (10, 20):
        with storage.sync_writer(overwrite=True) as writer:
            writer.append(0, {"tokens": np.arange(n), "loss_mask": np.ones(n, "u1")})
        commits.append(writer.session.commit_id)
    session = storage.parallel_write(overwrite=True)
    with session.sync_writer() as writer:  # written, never committed
        writer.append(0, {"tokens": np.arange(5), "loss_mask": np.ones(5, "u1")})
    summary = inspect_json(url, capsys)
    assert (summary["commit_id"], summary["previous_commit_id"]) == (commits[1], commits[0])
    size = sum(p.stat().st_size for p in files_under(tmp_path / "tokens" / session.prefix))
    assert summary["orphans"] == [
        {"prefix": session.prefix, "bytes": size, "objects": len(files_under(
            tmp_path / "tokens" / session.prefix))}
    ]  # fmt: skip
    assert main(["inspect", url]) == 0
    assert f"orphans   1 version(s) no reader uses, {size:,} bytes" in capsys.readouterr().out


def test_inspect_shows_a_write_in_progress_its_start_and_splits_done(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from rangestream.storage.core.kill_points import ENVIRONMENT

    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"text": "row {i} {"x" * 200}"}}\n' for i in range(40)))
    child = subprocess.run(
        [sys.executable, "-c", "from rangestream.cli.main import main; raise SystemExit(main())",
         "convert", str(source), "--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer",
         "bytes", "--workers", "0", "--no-progress", "--split-bytes", "2000"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, ENVIRONMENT: "part-written"},
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "rangestream.cli.main", "inspect", str(tmp_path / "out"), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    writing = json.loads(shown.stdout)["in_progress"]
    assert (writing["splits_done"], writing["splits"], writing["running"]) == (1, 5, True)
    assert writing["started"].endswith("Z")
    text = subprocess.run(
        [sys.executable, "-m", "rangestream.cli.main", "inspect", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "1 of 5 splits written" in text.stdout and "no commit yet" in text.stdout
