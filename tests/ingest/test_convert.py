"""convert: every preset from JSONL and Parquet, locally and on S3, equal to ground truth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.corpus import make_texts, write_jsonl
from support.s3 import Location

import rangestream
from ingest import truth
from rangestream import DocumentStorage, StreamStorage
from rangestream.errors import BadInputError, ResumeError

ROWS = 24


def conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    """Multi-turn conversations: 1 to 3 exchanges, some with a system turn."""
    texts = iter(make_texts(count * 8, seed))
    out = []
    for i in range(count):
        messages = [{"role": "system", "content": next(texts)}] if i % 3 == 0 else []
        for _ in range(1 + i % 3):
            messages += [
                {"role": "user", "content": next(texts)},
                {"role": "assistant", "content": next(texts)},
            ]
        out.append(messages)
    return out


def rows_for(preset: str) -> list[dict[str, Any]]:
    texts = make_texts(ROWS * 4, seed=7)
    if preset == "seq":
        return [{"text": t} for t in texts[:ROWS]]
    if preset == "sft":
        return [{"messages": m} for m in conversations(ROWS, seed=8)]
    if preset == "dpo":
        return [
            {"prompt": texts[3 * i], "chosen": texts[3 * i + 1], "rejected": texts[3 * i + 2]}
            for i in range(ROWS)
        ]
    return [
        {
            "prompt": texts[4 * i],
            "responses": [texts[4 * i + 1 + j] for j in range(1 + i % 3)],
            "rewards": [float(j) / 2 - i for j in range(1 + i % 3)],
        }
        for i in range(ROWS)
    ]


def write_input(kind: str, directory: Path, rows: list[dict[str, Any]]) -> str:
    if kind == "jsonl":
        return str(write_jsonl(directory / "in.jsonl", rows))
    path = directory / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)  # 5 splits
    return str(path)


def stream_of(storage: StreamStorage) -> dict[str, np.ndarray]:
    with storage.sync_reader() as reader:
        return dict(reader.read(0, reader.total_length))


def documents_of(storage: DocumentStorage) -> list[dict[str, Any]]:
    with storage.sync_reader() as reader:
        return [reader.read(i) for i in range(len(reader))]


def check_preset(preset: str, summary: Any, rows: list[dict[str, Any]], tok: Any) -> None:
    """The dataset ``summary`` names holds exactly the ground truth of ``rows``."""
    assert summary.records == len(rows) and summary.rejected == 0
    if preset == "seq":
        want = truth.seq(tok, [r["text"] for r in rows])
        got = stream_of(summary.storage)
        assert got["sequence"].tolist() == np.concatenate(want).tolist()
        assert summary.tokens == summary.loss_tokens == sum(map(len, want))
    elif preset == "sft":
        want = truth.sft(tok, [r["messages"] for r in rows])
        got = stream_of(summary.storage)
        ids = np.concatenate([i for i, _ in want])
        mask = np.concatenate([m for _, m in want])
        assert got["sequence"].tolist() == ids.tolist()
        assert got["loss_mask"].tolist() == mask.tolist()  # token by token
        positions = np.concatenate([np.arange(len(i)) for i, _ in want])
        assert got["position_ids"].tolist() == positions.tolist()
        assert summary.loss_tokens == int(mask.sum()) and summary.tokens == len(ids)
    elif preset == "dpo":
        got = documents_of(summary.storage)
        assert len(got) == len(rows)
        for record, row in zip(got, rows, strict=True):
            for key in ("chosen", "rejected"):
                ids, mask = truth.dpo_chat(tok, row["prompt"], row[key])
                assert record[key].tolist() == ids.tolist()
                assert record[f"{key}_mask"].tolist() == mask.tolist()
    else:
        got = documents_of(summary.storage)
        assert len(got) == len(rows)
        for record, row in zip(got, rows, strict=True):
            prompt, responses, masks = truth.grpo_chat(tok, row["prompt"], row["responses"])
            assert record["prompts"].tolist() == prompt.tolist()
            assert [r.tolist() for r in record["responses"]] == [r.tolist() for r in responses]
            assert [m.tolist() for m in record["masks"]] == [m.tolist() for m in masks]
            assert record["rewards"].tolist() == np.float32(row["rewards"]).tolist()


@pytest.mark.parametrize("preset", ["seq", "sft", "dpo", "grpo"])
@pytest.mark.parametrize("input_kind", ["jsonl", "parquet"])
def test_each_preset_reads_back_equal_to_the_tokenizer_ground_truth(
    preset: str,
    input_kind: str,
    location: Location,
    tmp_path: Path,
    tokenizer_dir: Path,
    rust_tokenizer: Any,
) -> None:
    rows = rows_for(preset)
    source = write_input(input_kind, tmp_path, rows)
    summary = rangestream.convert(
        source,
        location.url,
        preset=preset,
        tokenizer=tokenizer_dir / "tokenizer.json",
        chat_template=tokenizer_dir / "chatml.jinja",
        storage_options=location.storage_options,
        input_storage_options={},
        workers=0,
        progress=False,
    )
    check_preset(preset, summary, rows, rust_tokenizer)
    assert summary.shards == (5 if input_kind == "parquet" else 1)
    # and read back without a format object: the dataset records its own
    summary.storage = type(summary.storage)(location.url, storage_options=location.storage_options)
    assert summary.storage.storage_format is None
    check_preset(preset, summary, rows, rust_tokenizer)


def test_a_hugging_face_dataset_converts_like_its_jsonl(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    import datasets

    rows = rows_for("sft")
    dataset = datasets.Dataset.from_list(rows)
    summary = rangestream.convert(
        dataset, tmp_path / "out", preset="sft", tokenizer=tokenizer_dir / "hf", workers=2,
        split_rows=10, progress=False,
    )  # fmt: skip
    check_preset("sft", summary, rows, rust_tokenizer)
    assert summary.shards == 3


def test_inputs_on_s3_are_read_through_fsspec(
    s3_url: Location, tokenizer_json: Path, rust_tokenizer: Any, tmp_path: Path
) -> None:
    import fsspec

    rows = rows_for("seq")
    fs = fsspec.filesystem("s3", **s3_url.storage_options)
    fs.pipe(f"{s3_url.url}/in/a.jsonl".removeprefix("s3://"), json.dumps(rows[0]).encode() + b"\n")
    body = "".join(json.dumps(r) + "\n" for r in rows[1:]).encode()
    fs.pipe(f"{s3_url.url}/in/b.jsonl".removeprefix("s3://"), body)
    summary = rangestream.convert(
        f"{s3_url.url}/in/*.jsonl",
        s3_url.child("out"),
        preset="seq",
        tokenizer=tokenizer_json,
        storage_options=s3_url.storage_options,
        workers=0,
        progress=False,
    )
    check_preset("seq", summary, rows, rust_tokenizer)
    assert summary.shards == 2


def test_a_transformers_directory_gives_the_same_dataset_as_its_tokenizer_json(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    rows = rows_for("sft")
    source = write_input("jsonl", tmp_path, rows)
    summary = rangestream.convert(
        source, tmp_path / "out", preset="sft", tokenizer=tokenizer_dir / "hf", workers=0,
        progress=False,
    )  # fmt: skip
    check_preset("sft", summary, rows, rust_tokenizer)


def test_the_bytes_tokenizer_stores_utf8_bytes_and_256_as_eos(tmp_path: Path) -> None:
    rows = rows_for("seq")
    source = write_input("jsonl", tmp_path, rows)
    summary = rangestream.convert(
        source, tmp_path / "out", preset="seq", tokenizer="bytes", workers=0, progress=False
    )
    check_preset("seq", summary, rows, "bytes")
    assert stream_of(summary.storage)["sequence"].dtype == np.dtype("<u2")


def test_dpo_and_grpo_without_a_chat_template_concatenate_prompt_and_answer(tmp_path: Path) -> None:
    rows = rows_for("dpo")
    summary = rangestream.convert(
        write_input("jsonl", tmp_path, rows), tmp_path / "dpo", preset="dpo", tokenizer="bytes",
        workers=0, progress=False,
    )  # fmt: skip
    for record, row in zip(documents_of(summary.storage), rows, strict=True):
        for key in ("chosen", "rejected"):
            ids, mask = truth.dpo_plain("bytes", row["prompt"], row[key])
            assert record[key].tolist() == ids.tolist()
            assert record[f"{key}_mask"].tolist() == mask.tolist()
    rows = rows_for("grpo")
    (tmp_path / "g").mkdir()
    summary = rangestream.convert(
        write_input("jsonl", tmp_path / "g", rows), tmp_path / "grpo", preset="grpo",
        tokenizer="bytes", workers=0, progress=False,
    )  # fmt: skip
    for record, row in zip(documents_of(summary.storage), rows, strict=True):
        assert record["prompts"].tolist() == list(row["prompt"].encode())
        want = [[*r.encode(), 256] for r in row["responses"]]
        assert [r.tolist() for r in record["responses"]] == want
        assert [m.tolist() for m in record["masks"]] == [[1] * len(w) for w in want]


def test_dpo_messages_without_a_prompt_share_their_common_turns_as_the_prompt(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    texts = make_texts(4, seed=3)
    prompt = [{"role": "user", "content": texts[0]}]
    row = {
        "chosen": [*prompt, {"role": "assistant", "content": texts[1]}],
        "rejected": [*prompt, {"role": "assistant", "content": texts[2]}],
    }
    summary = rangestream.convert(
        write_input("jsonl", tmp_path, [row]), tmp_path / "out", preset="dpo",
        tokenizer=tokenizer_dir / "hf", workers=0, progress=False,
    )  # fmt: skip
    (record,) = documents_of(summary.storage)
    for key, answer in (("chosen", texts[1]), ("rejected", texts[2])):
        ids, mask = truth.dpo_chat(rust_tokenizer, texts[0], answer)
        assert record[key].tolist() == ids.tolist()
        assert record[f"{key}_mask"].tolist() == mask.tolist()


def test_the_output_is_identical_whatever_the_number_of_workers(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    rows = [{"text": t} for t in make_texts(300, seed=11)]
    source = str(write_jsonl(tmp_path / "in.jsonl", rows))
    outputs = []
    for workers in (0, 1, 2):
        summary = rangestream.convert(
            source, tmp_path / f"out{workers}", preset="seq", tokenizer=tokenizer_json,
            workers=workers, split_bytes=4000, progress=False,
        )  # fmt: skip
        outputs.append(stored_objects(tmp_path / f"out{workers}"))
        assert summary.shards > 4
    assert outputs[0] == outputs[1] == outputs[2]


def stored_objects(root: Path) -> dict[str, bytes]:
    """Every data object of a dataset by its key without the commit id (which is random)."""
    root_doc = json.loads((root / "zarr.json").read_text())["attributes"]["rangestream"]
    prefix = root / root_doc["data_prefix"]
    out = {}
    for path in sorted(prefix.rglob("*")):
        if path.is_file() and "parts" not in path.parts:
            out[str(path.relative_to(prefix))] = path.read_bytes()
    assert out
    return out


# -- bad input --------------------------------------------------------------------------------
BAD_LINES = [
    (b'{"text": "ok one"}\n', None),
    (b'{"text": "broken\n', "malformed JSON"),
    (b'{"other": "no text"}\n', "missing field 'text'"),
    (b'{"text": "caf\xe9 latin-1"}\n', "not valid UTF-8"),
    (b'{"text": ""}\n', "empty document"),
    (b'{"text": "ok two"}\n', None),
]


def bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(line for line, _ in BAD_LINES))
    return path


@pytest.mark.parametrize("line", [2, 3, 4, 5])
def test_a_bad_line_fails_with_its_file_and_line_and_commits_nothing(
    tmp_path: Path, line: int
) -> None:
    lines = [BAD_LINES[0][0], BAD_LINES[line - 1][0], BAD_LINES[5][0]]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(BadInputError, match=f"{path}:2: .*{BAD_LINES[line - 1][1]}"):
        rangestream.convert(
            str(path), tmp_path / "out", preset="seq", tokenizer="bytes", workers=0, progress=False
        )
    assert not StreamStorage(
        tmp_path / "out", rangestream.StreamNumpyFormat(np.dtype([("sequence", "<u2")]))
    ).exists()


def test_a_bad_line_in_a_later_byte_range_split_names_its_line_in_the_file(tmp_path: Path) -> None:
    good = [json.dumps({"text": t}).encode() + b"\n" for t in make_texts(40, seed=2)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(good[:33]) + b"{oops\n" + b"".join(good[33:]))
    with pytest.raises(BadInputError, match=f"{path}:34: malformed JSON"):
        rangestream.convert(
            str(path), tmp_path / "out", preset="seq", tokenizer="bytes", workers=0,
            split_bytes=300, progress=False,
        )  # fmt: skip


def test_skip_bad_counts_and_lists_rejects_and_keeps_the_good_rows(tmp_path: Path) -> None:
    summary = rangestream.convert(
        str(bad_file(tmp_path)), tmp_path / "out", preset="seq", tokenizer="bytes", workers=0,
        skip_bad=True, progress=False,
    )  # fmt: skip
    assert (summary.records, summary.rejected, summary.rows) == (2, 4, 6)
    assert stream_of(summary.storage)["sequence"].tolist() == [*b"ok one", 256, *b"ok two", 256]
    rejects = [json.loads(line) for line in Path(summary.rejects_url).read_text().splitlines()]
    assert [r["where"] for r in rejects] == [f"{tmp_path / 'bad.jsonl'}:{n}" for n in (2, 3, 4, 5)]
    for reject, (_, reason) in zip(rejects, BAD_LINES[1:5], strict=True):
        assert reason in reject["error"]
    assert "no text" in rejects[1]["raw"]
    assert "rejected  4 rows" in str(summary)


def test_rejected_parquet_rows_are_listed_with_their_row_and_value(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["good", "", "fine"]}), path, row_group_size=2)
    summary = rangestream.convert(
        str(path), tmp_path / "out", preset="seq", tokenizer="bytes", workers=0,
        skip_bad=True, progress=False,
    )  # fmt: skip
    (reject,) = [json.loads(x) for x in Path(summary.rejects_url).read_text().splitlines()]
    assert reject == {"where": f"{path} row 1", "error": f"{path} row 1: empty document",
                      "raw": '{"text": ""}'}  # fmt: skip
    assert stream_of(summary.storage)["sequence"].tolist() == [*b"good", 256, *b"fine", 256]


def test_unknown_roles_and_conversations_without_an_answer_are_bad_rows(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": "not a list"},
        {"messages": [{"from": "human", "value": "sharegpt"}]},
    ]
    with pytest.raises(BadInputError, match=r"in\.jsonl:1: message 1 has unknown role 'robot'"):
        rangestream.convert(
            str(write_jsonl(tmp_path / "in.jsonl", rows)), tmp_path / "out", preset="sft",
            tokenizer=tokenizer_dir / "hf", workers=0, progress=False,
        )  # fmt: skip
    summary = rangestream.convert(
        str(tmp_path / "in.jsonl"), tmp_path / "out2", preset="sft", tokenizer=tokenizer_dir / "hf",
        workers=0, progress=False, skip_bad=True,
    )  # fmt: skip
    assert (summary.records, summary.rejected) == (0, 4)
    errors = [json.loads(x)["error"] for x in Path(summary.rejects_url).read_text().splitlines()]
    assert "unknown role 'robot'" in errors[0]
    assert "no assistant message" in errors[1]
    assert "non-empty list" in errors[2]
    assert "message 0 has unknown role None" in errors[3]


def test_sharegpt_field_and_role_names_are_configurable(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo ."}]}
    summary = rangestream.convert(
        str(write_jsonl(tmp_path / "in.jsonl", [row])), tmp_path / "out", preset="sft",
        tokenizer=tokenizer_dir / "hf", workers=0, progress=False,
        fields={"messages": "conversations", "role": "from", "content": "value"},
    )  # fmt: skip
    ((want_ids, want_mask),) = truth.sft(
        rust_tokenizer,
        [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo ."}]],
    )
    got = stream_of(summary.storage)
    assert got["sequence"].tolist() == want_ids.tolist()
    assert got["loss_mask"].tolist() == want_mask.tolist()


@pytest.mark.parametrize("too_long", ["error", "truncate", "split"])
def test_documents_over_max_len_fail_are_truncated_or_split(tmp_path: Path, too_long: str) -> None:
    rows = [{"text": "a" * 5}, {"text": "b" * 12}]
    kwargs = {"preset": "seq", "tokenizer": "bytes", "workers": 0, "progress": False}
    path = str(write_jsonl(tmp_path / "in.jsonl", rows))
    if too_long == "error":
        with pytest.raises(BadInputError, match=r"in.jsonl:2: 13 tokens, more than max_len=8"):
            rangestream.convert(path, tmp_path / "out", max_len=8, too_long=too_long, **kwargs)
        return
    summary = rangestream.convert(path, tmp_path / "out", max_len=8, too_long=too_long, **kwargs)
    got = stream_of(summary.storage)["sequence"].tolist()
    a, b = [*b"aaaaa", 256], [*b"bbbbbbbbbbbb", 256]
    if too_long == "truncate":
        assert got == a + b[:8] and summary.records == 2
    else:
        assert got == a + b and summary.records == 3  # b in records of 8 and 5
        with summary.storage.sync_reader() as reader:
            assert reader.num_records(0) == 3


def test_sft_split_restarts_positions_in_each_piece(tmp_path: Path, tokenizer_dir: Path) -> None:
    rows = [{"messages": m} for m in conversations(3, seed=5)]
    summary = rangestream.convert(
        str(write_jsonl(tmp_path / "in.jsonl", rows)), tmp_path / "out", preset="sft",
        tokenizer=tokenizer_dir / "hf", workers=0, progress=False, max_len=16, too_long="split",
    )  # fmt: skip
    got = stream_of(summary.storage)
    assert got["position_ids"].dtype == np.dtype("u1")  # positions below max_len
    starts = np.flatnonzero(got["position_ids"] == 0)
    pieces = np.diff(np.append(starts, len(got["position_ids"])))
    assert (pieces <= 16).all() and summary.records == len(starts)


def test_a_token_id_beyond_the_vocabulary_is_refused_not_wrapped(tmp_path: Path) -> None:
    from rangestream.ingest.tokenizers import ByteTokenizer

    class Lying(ByteTokenizer):
        vocab_size = 256  # says its ids fit one byte, then produces EOS 256

    # a row error naming the line (so skip_bad can skip it), not a bare InvalidRecordError
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    with pytest.raises(BadInputError, match=r"in\.jsonl:1: field 'token ids of bytes': value 256"):
        rangestream.convert(
            str(path), tmp_path / "out", preset="seq", tokenizer=Lying(), workers=0, progress=False
        )


# -- sessions ---------------------------------------------------------------------------------
def test_resume_after_a_failure_reuses_the_splits_already_written(
    tmp_path: Path, tokenizer_json: Path, rust_tokenizer: Any
) -> None:
    rows = [{"text": t} for t in make_texts(60, seed=4)]
    rows[45] = {"nothing": 1}
    path = str(write_jsonl(tmp_path / "in.jsonl", rows))
    kwargs = {
        "preset": "seq", "tokenizer": tokenizer_json, "workers": 0, "split_bytes": 1500,
        "progress": False,
    }  # fmt: skip
    with pytest.raises(BadInputError, match="missing field") as caught:
        rangestream.convert(path, tmp_path / "out", **kwargs)
    assert any("resume" in note for note in caught.value.__notes__)
    summary = rangestream.convert(path, tmp_path / "out", resume=True, skip_bad=True, **kwargs)
    assert summary.splits_skipped > 0
    # the summary counts the whole dataset, and says what this run added
    assert summary.added is not None
    assert summary.splits_skipped + summary.added.split == summary.splits
    assert len(summary.results) == summary.splits
    assert (summary.rows, summary.records) == (60, 59)
    assert 0 < summary.added.rows < 60
    assert "this run" in str(summary)
    good = [r["text"] for i, r in enumerate(rows) if i != 45]
    assert (
        stream_of(summary.storage)["sequence"].tolist()
        == np.concatenate(truth.seq(rust_tokenizer, good)).tolist()
    )
    assert summary.rejected == 1
    assert not (tmp_path / "out" / "in_progress").exists()


def test_resume_with_other_options_is_refused(tmp_path: Path) -> None:
    rows = [{"text": "x"}, {"bad": 1}]
    path = str(write_jsonl(tmp_path / "in.jsonl", rows))
    kwargs = {"preset": "seq", "tokenizer": "bytes", "workers": 0, "progress": False}
    with pytest.raises(BadInputError):
        rangestream.convert(path, tmp_path / "out", **kwargs)
    with pytest.raises(ResumeError, match="other inputs or options"):
        rangestream.convert(path, tmp_path / "out", max_len=9, resume=True, **kwargs)


def test_the_stored_schema_describes_the_records_and_their_origin(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    from rangestream.formats.records import RecordFormat

    rows = rows_for("grpo")
    summary = rangestream.convert(
        write_input("jsonl", tmp_path, rows), tmp_path / "out", preset="grpo",
        tokenizer=tokenizer_dir / "hf", workers=0, progress=False,
    )  # fmt: skip
    schema = json.loads((tmp_path / "out" / "zarr.json").read_text())["attributes"]["rangestream"][
        "schema"
    ]
    assert RecordFormat.from_schema(schema["format"]) == summary.storage.storage_format
    assert schema["ingest"]["preset"] == "grpo"
    assert schema["ingest"]["keys"] == ["prompts", "responses", "masks", "rewards"]


def test_append_adds_a_conversion_as_new_shards_of_the_same_preset_and_tokenizer(
    location: Location, tmp_path: Path, rust_tokenizer: Any, tokenizer_dir: Path
) -> None:
    rows = rows_for("seq")
    first, second = rows[:10], rows[10:]
    kwargs = {
        "preset": "seq", "tokenizer": tokenizer_dir / "tokenizer.json", "workers": 0,
        "progress": False, "storage_options": location.storage_options,
        "input_storage_options": {},
    }  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rangestream.convert(write_input("jsonl", tmp_path / "a", first), location.url, **kwargs)
    summary = rangestream.convert(
        write_input("parquet", tmp_path / "b", second), location.url, mode="append", **kwargs
    )
    assert summary.shards == 1 + 3  # the old shard and 14 rows in row groups of 5
    stored = StreamStorage(location.url, storage_options=location.storage_options)
    want = truth.seq(rust_tokenizer, [r["text"] for r in rows])
    assert stream_of(stored)["sequence"].tolist() == np.concatenate(want).tolist()
    with stored.sync_reader() as reader:
        assert reader.num_records() == len(rows)
        assert reader.read_record(-1)["sequence"].tolist() == want[-1].tolist()
    with pytest.raises(Exception, match="tokenizer"):
        rangestream.convert(
            write_input("jsonl", tmp_path / "a", first), location.url, mode="append",
            **{**kwargs, "tokenizer": "bytes"},
        )  # fmt: skip
