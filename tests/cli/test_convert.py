"""``rangestream convert``: the README's quick start, locally, on S3 and on a Dask scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from ingest import truth
from support.corpus import make_texts, write_jsonl
from support.s3 import S3Location

from rangestream import DocumentStorage, StreamNumpyFormat, StreamStorage
from testkit import S3Endpoint


def run_convert(
    arguments: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from rangestream.cli.main import main; raise SystemExit(main())",
         "convert", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_convert_writes_a_seq_dataset_and_prints_its_summary(
    tmp_path: Path, tokenizer_json: Path, rust_tokenizer: Any
) -> None:
    texts = make_texts(30, seed=12)
    source = write_jsonl(tmp_path / "in.jsonl", [{"body": t} for t in texts])
    result = run_convert(
        [str(source), "--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer",
         str(tokenizer_json), "--workers", "2", "--text-field", "body"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "records   30 from 30 input rows" in result.stdout
    assert "convert seq" in result.stderr  # the progress bar
    want = np.concatenate(truth.seq(rust_tokenizer, texts))
    fmt = StreamNumpyFormat(np.dtype([("sequence", "<u2")]))
    with StreamStorage(tmp_path / "out", fmt).sync_reader() as reader:
        assert reader.read(0, reader.total_length)["sequence"].tolist() == want.tolist()


def test_bad_input_exits_2_naming_the_line_and_skip_bad_lists_it(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"text": 5}\n')
    arguments = [str(source), "--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer",
                 "bytes", "--workers", "0", "--no-progress"]  # fmt: skip
    failed = run_convert(arguments)
    assert failed.returncode == 2
    assert f"{source}:2: field 'text' is not text" in failed.stderr
    assert "--skip-bad" in failed.stderr  # the first row error says how to skip bad rows
    skipped = run_convert([*arguments, "--skip-bad", "--resume"])
    assert skipped.returncode == 0, skipped.stderr
    assert "rejected  1 rows" in skipped.stdout
    (reject,) = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    assert json.loads(reject)["where"] == f"{source}:2"


def test_a_row_over_max_row_bytes_exits_2_naming_the_line_and_the_flag(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    long_row = json.dumps({"text": "x" * 5000}) + "\n"
    source.write_text('{"text": "short"}\n' + long_row + '{"text": "also short"}\n')
    arguments = [str(source), "--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer",
                 "bytes", "--workers", "0", "--no-progress", "--max-row-bytes", "1000"]  # fmt: skip
    failed = run_convert(arguments)
    assert failed.returncode == 2, failed.stderr
    bound = f"the row is {len(long_row):,} bytes, over the bound of 1,000"
    assert f"{source}:2: {bound}" in failed.stderr and "--max-row-bytes" in failed.stderr
    assert "--skip-bad" in failed.stderr and "Traceback" not in failed.stderr
    skipped = run_convert([*arguments, "--skip-bad"])
    assert skipped.returncode == 0, skipped.stderr
    (reject,) = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    assert json.loads(reject)["where"] == f"{source}:2"
    storage = StreamStorage(tmp_path / "out", StreamNumpyFormat(np.dtype([("sequence", "<u2")])))
    with storage.sync_reader() as reader:
        got = reader.read(0, reader.total_length)["sequence"].tolist()
    assert got == [*b"short", 256, *b"also short", 256]


def test_convert_reads_and_writes_s3_with_the_endpoint_flag(
    s3_url: S3Location, s3_server: S3Endpoint, tmp_path: Path, tokenizer_dir: Path
) -> None:
    rows = [{"prompt": p, "chosen": c, "rejected": r}
            for p, c, r in zip(*[iter(make_texts(30, seed=13))] * 3, strict=True)]  # fmt: skip
    import fsspec

    fs = fsspec.filesystem("s3", **s3_url.storage_options)
    fs.pipe(
        f"{s3_url.url}/in.jsonl".removeprefix("s3://"),
        write_jsonl(tmp_path / "x.jsonl", rows).read_bytes(),
    )
    env = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    result = run_convert(
        [f"{s3_url.url}/in.jsonl", "--to", s3_url.child("out"), "--preset", "dpo", "--tokenizer",
         str(tokenizer_dir / "hf"), "--endpoint-url", s3_server.endpoint_url, "--workers", "1"],
        env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    from rangestream.ingest import Fields, Limits, load_tokenizer
    from rangestream.ingest.presets import get_preset

    fmt = get_preset(
        "dpo", load_tokenizer(tokenizer_dir / "hf"), Fields(), Limits()
    ).storage_format()
    storage = DocumentStorage(s3_url.child("out"), fmt, storage_options=s3_url.storage_options)
    with storage.sync_reader() as reader:
        assert len(reader) == 10
        assert reader.read(9)["chosen_mask"].sum() > 0


def test_convert_to_a_missing_bucket_fails_naming_the_bucket_and_the_url(
    s3_server: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    # s3_bucket: the server must hold a bucket, just not this one
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello"}])
    url = f"s3://rangestream-missing-{uuid.uuid4().hex[:8]}/x"
    env = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    result = run_convert(
        [str(source), "--to", url, "--preset", "seq", "--tokenizer", "bytes", "--endpoint-url",
         s3_server.endpoint_url, "--workers", "0", "--no-progress"],
        env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    bucket = url.removeprefix("s3://").split("/")[0]
    assert f"bucket '{bucket}' of {url} does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_convert_runs_on_a_dask_scheduler(
    tmp_path: Path, tokenizer_json: Path, rust_tokenizer: Any, dask_client: Any
) -> None:
    texts = make_texts(40, seed=14)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    result = run_convert(
        [str(source), "--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer",
         str(tokenizer_json), "--scheduler", dask_client.scheduler.address, "--no-progress"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    fmt = StreamNumpyFormat(np.dtype([("sequence", "<u2")]))
    with StreamStorage(tmp_path / "out", fmt).sync_reader() as reader:
        got = reader.read(0, reader.total_length)["sequence"]
    assert got.tolist() == np.concatenate(truth.seq(rust_tokenizer, texts)).tolist()


def test_append_adds_a_second_conversion_as_new_shards(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", [{"text": "one"}, {"text": "two"}])
    second = write_jsonl(tmp_path / "b.jsonl", [{"text": "three"}])
    common = ["--to", str(tmp_path / "out"), "--preset", "seq", "--tokenizer", "bytes",
              "--workers", "0", "--no-progress"]  # fmt: skip
    assert run_convert([str(first), *common]).returncode == 0
    refused = run_convert([str(second), *common])
    assert refused.returncode == 2 and "append" in refused.stderr
    result = run_convert([str(second), *common, "--append"])
    assert result.returncode == 0, result.stderr
    with StreamStorage(tmp_path / "out").sync_reader() as reader:  # the format is recorded
        assert reader.num_shards == 2
        records = [bytes(reader.read_record(i)["sequence"][:-1].astype("u1")) for i in range(3)]
    assert records == [b"one", b"two", b"three"]
