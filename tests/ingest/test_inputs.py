"""Inputs: every line once at any split size, compressed files, Parquet row groups, datasets."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support.corpus import make_texts

from rangestream.errors import BadInputError
from rangestream.ingest.inputs import DatasetSource, FileSource, open_inputs


def all_rows(sources: list[Any], split_bytes: int = 1 << 30, split_rows: int = 1000) -> list[Any]:
    out = []
    for number, source in enumerate(sources):
        for split in source.splits(number, split_bytes, split_rows):
            out.extend(source.rows(split, ["text"]))
    return out


def jsonl_bytes(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode()


@pytest.mark.parametrize("split_bytes", [1, 7, 100, 999, 1 << 20])
def test_byte_range_splits_yield_every_line_once_in_order(tmp_path: Path, split_bytes: int) -> None:
    texts = make_texts(50, seed=3)
    path = tmp_path / "a.jsonl"
    data = jsonl_bytes(texts)
    path.write_bytes(data.replace(b"\n", b"\n\n", 3))  # blank lines are not rows
    rows = all_rows(open_inputs(str(path)), split_bytes=split_bytes)
    assert [r.value["text"] for r in rows] == texts
    lines = path.read_bytes().split(b"\n")
    for row in rows:  # every row names its own line
        number = int(str(row.where).rsplit(":", 1)[1])
        assert json.loads(lines[number - 1])["text"] == row.value["text"]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_jsonl_is_one_split_read_as_a_stream(tmp_path: Path, suffix: str) -> None:
    texts = make_texts(30, seed=4)
    data = jsonl_bytes(texts)
    compressed = gzip.compress(data) if suffix.endswith("gz") else zstandard.compress(data)
    path = tmp_path / f"a{suffix}"
    path.write_bytes(compressed)
    (source,) = open_inputs(str(path))
    assert len(source.splits(0, 10, 10)) == 1
    rows = all_rows([source], split_bytes=10)
    assert [r.value["text"] for r in rows] == texts
    assert str(rows[29].where) == f"{path}:30"


def test_parquet_is_split_and_read_by_row_group(tmp_path: Path) -> None:
    texts = make_texts(23, seed=5)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": texts, "other": list(range(23))}), path, row_group_size=5)
    (source,) = open_inputs(str(path))
    splits = source.splits(0, 1, 1)
    assert len(splits) == 5
    for group, split in enumerate(splits):
        rows = list(source.rows(split, ["text"]))
        assert [r.value for r in rows] == [{"text": t} for t in texts[5 * group : 5 * group + 5]]
        assert str(rows[0].where) == f"{path} row {5 * group}"


def test_a_text_file_is_one_document(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first\nsecond line\n")
    (tmp_path / "b.md").write_text("# title")
    (tmp_path / "skip.bin").write_bytes(b"\0")
    rows = all_rows(open_inputs(str(tmp_path)))  # a directory: its known files, sorted
    assert [r.value["text"] for r in rows] == ["first\nsecond line\n", "# title"]
    (source, _) = open_inputs(str(tmp_path))
    (split,) = source.splits(0, 1, 1)
    assert [r.value for r in source.rows(split, ["body"])] == [{"body": "first\nsecond line\n"}]


def test_bad_lines_are_rows_with_an_error_not_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "a"}\n[1, 2]\n{"text": "\xff"}\n{nope\n')
    rows = all_rows(open_inputs(str(path)))
    assert rows[0].error is None
    assert "JSON object was expected" in rows[1].error
    assert "not valid UTF-8" in rows[2].error
    assert "malformed JSON" in rows[3].error and rows[3].raw == "{nope\n"
    assert [str(r.where) for r in rows] == [f"{path}:{n}" for n in (1, 2, 3, 4)]


def test_globs_expand_sorted_and_unknown_formats_are_named(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl", "c.csv"):
        (tmp_path / name).write_bytes(jsonl_bytes([name]))
    sources = open_inputs(str(tmp_path / "*.jsonl"))
    assert [s.url for s in sources] == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(BadInputError, match=r"c\.csv: cannot tell the input format"):
        open_inputs(str(tmp_path / "c.csv"))
    with pytest.raises(BadInputError, match="no such file"):
        open_inputs(str(tmp_path / "missing.jsonl"))
    assert isinstance(open_inputs(str(tmp_path / "c.csv"), input_format="jsonl")[0], FileSource)


def test_a_dataset_is_split_by_rows_and_reads_only_the_columns_asked(tmp_path: Path) -> None:
    import datasets

    texts = make_texts(25, seed=6)
    dataset = datasets.Dataset.from_dict({"text": texts, "n": list(range(25))})
    (source,) = open_inputs(dataset)
    assert isinstance(source, DatasetSource)
    splits = source.splits(0, 0, 10)
    assert [(s.start, s.stop) for s in splits] == [(0, 10), (10, 20), (20, 25)]
    rows = [r for s in splits for r in source.rows(s, ["text"])]
    assert [r.value for r in rows] == [{"text": t} for t in texts]
    assert str(rows[12].where) == "dataset 0 row 12"


def test_an_iterable_dataset_is_split_by_its_shards(tmp_path: Path) -> None:
    import datasets

    texts = make_texts(12, seed=8)
    for k in range(3):
        (tmp_path / f"p{k}.jsonl").write_bytes(jsonl_bytes(texts[4 * k : 4 * k + 4]))
    files = [str(tmp_path / f"p{k}.jsonl") for k in range(3)]
    iterable = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    (source,) = open_inputs(iterable)
    splits = source.splits(0, 0, 0)
    assert len(splits) == 3
    rows = [r for s in splits for r in source.rows(s, ["text"])]
    assert [r.value["text"] for r in rows] == texts
