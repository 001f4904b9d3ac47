"""Bad inputs are refused with their file (and line): cut or empty compressed files, deep
nesting, lone surrogates, corrupt Parquet, rows over the byte bound; a BOM is accepted."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

import rangestream
from rangestream.errors import BadInputError

ROWS = [{"text": f"row number {i}, " * 20} for i in range(300)]
KWARGS = {"preset": "seq", "tokenizer": "bytes", "workers": 0, "progress": False}


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def stored(summary: rangestream.Summary) -> list[int]:
    with summary.storage.sync_reader() as reader:
        return reader.read(0, reader.total_length)["sequence"].tolist()


def want(rows: list[dict[str, object]]) -> list[int]:
    return [t for r in rows for t in [*str(r["text"]).encode(), 256]]


@pytest.mark.parametrize("skip_bad", [False, True])
def test_a_cut_gzip_file_stops_the_conversion_naming_it_and_the_rows_read(
    tmp_path: Path, skip_bad: bool
) -> None:
    data = gzip.compress(jsonl(ROWS))
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(BadInputError, match=r"in\.jsonl\.gz ends before .* lines were read"):
        rangestream.convert(str(path), tmp_path / "out", skip_bad=skip_bad, **KWARGS)
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)
    with pytest.raises(BadInputError, match=r"garbage\.jsonl\.gz cannot be decompressed"):
        rangestream.convert(str(garbage), tmp_path / "out2", skip_bad=skip_bad, **KWARGS)


def test_every_zstd_frame_is_read_and_a_cut_frame_stops_the_conversion(tmp_path: Path) -> None:
    compressor = zstandard.ZstdCompressor()
    frames = [compressor.compress(jsonl(ROWS[i : i + 100])) for i in range(0, 300, 100)]
    whole = tmp_path / "whole.jsonl.zst"
    whole.write_bytes(b"".join(frames))
    summary = rangestream.convert(str(whole), tmp_path / "out", **KWARGS)
    assert stored(summary) == want(ROWS)  # all three frames, not the first one only
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(b"".join(frames)[: len(frames[0]) + len(frames[1]) // 2])
    with pytest.raises(BadInputError, match=r"cut\.jsonl\.zst ends before .*100 lines were read"):
        rangestream.convert(str(cut), tmp_path / "out2", skip_bad=True, **KWARGS)


@pytest.mark.parametrize("name", ["empty.jsonl.gz", "empty.jsonl.zst"])
def test_an_empty_compressed_file_is_an_error(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(BadInputError, match=rf"{name.replace('.', '[.]')} is empty"):
        rangestream.convert(str(tmp_path / name), tmp_path / "out", **KWARGS)
    assert not (tmp_path / "out" / "zarr.json").exists()


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"text": "a \\ud800 b"}', "lone surrogate"),
        ('{"text": "x' + "y" * 2_000_000 + '"}', "over the bound of 1,048,576"),
    ],
    ids=["nesting", "surrogate", "too-long"],
)
def test_a_row_that_cannot_be_read_is_a_row_error_with_its_line(
    tmp_path: Path, line: str, error: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(ROWS[:2]) + line.encode() + b"\n" + jsonl(ROWS[2:4]))
    kwargs = {**KWARGS, "max_len": 4096}
    with pytest.raises(BadInputError, match=rf"in\.jsonl:3: .*{error}.*--skip-bad"):
        rangestream.convert(str(path), tmp_path / "out", **kwargs)
    summary = rangestream.convert(str(path), tmp_path / "out", skip_bad=True, **kwargs)
    assert summary.rejected == 1 and stored(summary) == want(ROWS[:4])
    (reject,) = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    assert json.loads(reject)["where"] == f"{path}:3" and error in json.loads(reject)["error"]


def test_a_utf8_bom_at_the_start_of_a_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl(ROWS[:5]))
    summary = rangestream.convert(str(path), tmp_path / "out", **KWARGS)
    assert stored(summary) == want(ROWS[:5])


def test_a_corrupt_parquet_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    path.write_bytes(b"PAR1" + bytes(range(200)) + b"PAR1")
    with pytest.raises(BadInputError, match=r"in\.parquet: not a readable Parquet file"):
        rangestream.convert(str(path), tmp_path / "out", **KWARGS)


# VmHWM, the peak RSS of this process image (ru_maxrss would include the forked test's)
CHILD = """
import sys
import rangestream
summary = rangestream.convert(sys.argv[1], sys.argv[2], preset="seq", tokenizer=sys.argv[3],
                              workers=0, progress=False, max_len=4096, skip_bad=True)
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(summary.rejected, summary.records, status)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_50_mb_row_with_max_len_4096_keeps_the_worker_under_a_gigabyte(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    path = tmp_path / "in.jsonl"
    words = np.random.default_rng(0).choice(["range ", "stream ", "zarr ", "token "], 10_000_000)
    huge = "".join(words.tolist())[:50_000_000]
    path.write_bytes(jsonl(ROWS[:2]) + json.dumps({"text": huge}).encode() + b"\n")
    del words, huge
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(tmp_path / "out"), str(tokenizer_json)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    rejected, records, peak_kib = map(int, child.stdout.split())
    print(f"peak RSS of the converting process: {peak_kib / 1024:.0f} MiB")
    assert (rejected, records) == (1, 2)
    assert peak_kib < 1024 * 1024, f"{peak_kib / 1024:.0f} MiB"


def test_a_corrupt_tokenizer_file_and_a_failing_chat_template_are_named(tmp_path: Path) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": ')
    with pytest.raises(BadInputError, match=r"tokenizer\.json: not a readable tokenizer"):
        rangestream.convert(str(tmp_path), tmp_path / "out", **{**KWARGS, "tokenizer": broken})
    template = tmp_path / "chat.jinja"
    template.write_text("{{ raise_exception('no system turns') if true }}{{ 1 / 0 }}")
    rows = [{"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "ho"}]}]  # fmt: skip
    path = tmp_path / "chat.jsonl"
    path.write_bytes(jsonl(rows))
    kwargs = {**KWARGS, "preset": "sft", "chat_template": template}
    with pytest.raises(BadInputError, match=r"chat template .*chat\.jinja failed"):
        rangestream.convert(str(path), tmp_path / "out2", **kwargs)
