"""``rangestream verify --json``: the report as one JSON object, for scripts."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.cli.main import main


def verify_json(url: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["verify", url, "--json"])
    return code, json.loads(out.getvalue())


def test_verify_json_reports_what_it_checked_and_each_problem(tmp_path: Path) -> None:
    storage = StreamStorage(tmp_path / "ds", StreamNumpyFormat(np.dtype([("t", "<i4")])))
    with storage.sync_writer() as writer:
        for shard in range(3):
            writer.append(shard, {"t": np.arange(1000, dtype="<i4")})
    code, report = verify_json(str(tmp_path / "ds"))
    assert code == 0 and report["ok"] is True and report["problems"] == []
    assert report["kind"] == "stream" and report["checked"]["shards"] == 3
    assert report["checked"]["bytes"] > 3 * 4000
    blocks = sorted((tmp_path / "ds" / "data").rglob("*"))
    block = next(p for p in blocks if p.is_file() and "/shards/0/stream/c/" in str(p))
    data = bytearray(block.read_bytes())
    data[10] ^= 0xFF
    block.write_bytes(bytes(data))
    code, report = verify_json(str(tmp_path / "ds"))
    assert code == 1 and report["ok"] is False
    assert any("stream/c/" in problem["where"] for problem in report["problems"])
