"""``rangestream gc URL``: lists orphaned versions; ``--yes`` deletes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rangestream import StreamNumpyFormat, StreamStorage
from rangestream.cli.gc import parse_duration
from rangestream.cli.main import main
from rangestream.errors import CommandLineError

TOKENS = np.dtype([("t", "<i4")])


def dataset_with_an_orphan(tmp_path: Path) -> tuple[str, Path]:
    url = str(tmp_path / "ds")
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS))
    with storage.sync_writer() as writer:
        writer.append(0, {"t": np.arange(100, dtype="<i4")})
    session = storage.parallel_write(overwrite=True)
    with session.sync_writer() as writer:  # never committed
        writer.append(0, {"t": np.arange(50, dtype="<i4")})
    return url, tmp_path / "ds" / session.prefix


def test_gc_lists_then_deletes_with_yes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, orphan = dataset_with_an_orphan(tmp_path)
    size = sum(p.stat().st_size for p in orphan.rglob("*") if p.is_file())
    assert main(["gc", url, "--grace", "0"]) == 0
    out = capsys.readouterr().out
    assert f"orphan     data/{orphan.name}:" in out and f"{size:,} bytes" in out
    assert "run again with --yes" in out and orphan.exists()
    assert main(["gc", url, "--grace", "0", "--yes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deleted"] and [o["prefix"] for o in report["orphans"]] == [f"data/{orphan.name}"]
    assert not orphan.exists()
    assert main(["inspect", url]) == 0  # the committed version is untouched


def test_gc_keeps_what_is_younger_than_the_default_grace_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, orphan = dataset_with_an_orphan(tmp_path)
    assert main(["gc", url, "--yes"]) == 0
    assert "young      data/" in capsys.readouterr().out and orphan.exists()


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("30m", 1800.0), ("24h", 86400.0), ("1.5d", 129600.0)]
)
def test_grace_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_malformed_grace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CommandLineError):
        parse_duration("a week")
    assert main(["gc", str(tmp_path), "--grace", "a week"]) == 2
    assert "--grace takes a duration" in capsys.readouterr().err
