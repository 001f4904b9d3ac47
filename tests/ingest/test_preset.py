"""One row's bad data is that row's error, named by its file and line, whatever raises it.

Each path that escaped as a bare exception, or as an error naming no row (a role that is
not text, a reward float32 cannot hold, a chat template raising on one conversation, a
token id beyond the stored dtype, a tokenizer failing a whole batch for one text), now
stops the conversion naming ``file:line`` and suggesting ``--skip-bad``; with
``skip_bad`` exactly that row is listed in the rejects and exactly the other rows are
stored, compared with ground truth computed from the tokenizer directly (``truth``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.corpus import CHATML, SPECIALS, WORDS, make_texts, write_jsonl

import rangestream
from ingest import truth
from ingest.test_convert import conversations, documents_of, stream_of
from rangestream.errors import BadInputError
from rangestream.ingest.inputs import Row
from rangestream.ingest.preset import Fields, Limits
from rangestream.ingest.presets import get_preset
from rangestream.ingest.tokenizers import ByteTokenizer, Tokenizer

Rows = list[dict[str, Any]]


def with_bad_rows(good: Rows, bad: dict[int, dict[str, Any]]) -> Rows:
    """``good`` with ``bad[line]`` placed so that it is line ``line`` (1-based) of the file."""
    rows, good_rows = [], iter(good)
    for line in range(1, len(good) + len(bad) + 1):
        rows.append(bad[line] if line in bad else next(good_rows))
    return rows


def convert_twice(path: Path, out: Path, bad_lines: Sequence[int], **options: Any) -> Any:
    """Without ``skip_bad`` the conversion stops naming the first bad line and suggesting
    ``--skip-bad``, committing nothing; with it, the bad lines (and only they) are the
    rejects. Returns the skipping run's summary and the rejects' error texts."""
    with pytest.raises(BadInputError) as raised:
        rangestream.convert(str(path), out / "failed", workers=0, progress=False, **options)
    message = str(raised.value)
    assert message.startswith(f"{path}:{bad_lines[0]}: "), message
    assert "--skip-bad" in message, message
    assert not (out / "failed" / "zarr.json").exists()
    summary = rangestream.convert(
        str(path), out / "skipped", workers=0, progress=False, skip_bad=True, **options
    )
    rejects = [json.loads(x) for x in Path(summary.rejects_url).read_text().splitlines()]
    assert [r["where"] for r in rejects] == [f"{path}:{line}" for line in bad_lines]
    assert summary.rejected == len(bad_lines)
    for reject in rejects:
        assert reject["error"].startswith(f"{reject['where']}: "), reject
    return summary, [r["error"] for r in rejects]


def check_sft(summary: Any, tokenizer: Any, kept: list[list[dict[str, str]]]) -> None:
    want = truth.sft(tokenizer, kept)
    got = stream_of(summary.storage)
    assert summary.records == len(kept)
    assert got["sequence"].tolist() == np.concatenate([i for i, _ in want]).tolist()
    assert got["loss_mask"].tolist() == np.concatenate([m for _, m in want]).tolist()


# -- a role that is not text ------------------------------------------------------------------
def test_a_role_that_is_not_text_is_a_row_error_with_its_line(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    good = conversations(6, seed=3)
    bad = {
        2: [{"role": 5, "content": "a number"}, {"role": "assistant", "content": "x"}],
        5: [{"role": ["user"], "content": "a list"}, {"role": "assistant", "content": "x"}],
        6: [{"role": "user", "content": "q"}, {"role": {"r": "assistant"}, "content": "a"}],
    }
    rows = with_bad_rows(
        [{"messages": m} for m in good], {k: {"messages": v} for k, v in bad.items()}
    )
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    summary, errors = convert_twice(
        path, tmp_path, [2, 5, 6], preset="sft", tokenizer=tokenizer_dir / "hf"
    )
    assert "message 0 has unknown role 5" in errors[0]
    assert "message 0 has unknown role ['user']" in errors[1]
    assert "message 1 has unknown role {'r': 'assistant'}" in errors[2]
    check_sft(summary, rust_tokenizer, good)


# -- a reward float32 cannot hold -------------------------------------------------------------
def test_a_reward_outside_float32_is_a_row_error_never_stored_as_infinity(
    tmp_path: Path, tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    texts = make_texts(20, seed=5)
    good = [
        {"prompt": texts[3 * i], "responses": [texts[3 * i + 1], texts[3 * i + 2]],
         "rewards": [float(i), -0.5 * i]}
        for i in range(5)
    ]  # fmt: skip
    bad = {
        1: {"prompt": "p", "responses": ["a"], "rewards": [1e300]},  # overflows float32
        3: {"prompt": "p", "responses": ["a", "b"], "rewards": [0.0, 10**400]},  # and float64
        7: {"prompt": "p", "responses": ["a"], "rewards": [float("nan")]},  # JSON's NaN
    }
    path = write_jsonl(tmp_path / "in.jsonl", with_bad_rows(good, bad))
    summary, errors = convert_twice(
        path, tmp_path, [1, 3, 7], preset="grpo", tokenizer=tokenizer_dir / "hf"
    )
    assert "'rewards'" in errors[0] and "overflows float32" in errors[0], errors[0]
    assert "OverflowError" in errors[1], errors[1]
    assert "'rewards' must be finite numbers" in errors[2], errors[2]
    got = documents_of(summary.storage)
    assert len(got) == len(good)
    for record, row in zip(got, good, strict=True):
        prompt, responses, _ = truth.grpo_chat(rust_tokenizer, row["prompt"], row["responses"])
        assert record["prompts"].tolist() == prompt.tolist()
        assert [r.tolist() for r in record["responses"]] == [r.tolist() for r in responses]
        assert record["rewards"].tolist() == np.float32(row["rewards"]).tolist()


# -- a chat template that raises on one conversation ------------------------------------------
#: ChatML, refusing (as many real templates do) a system turn that does not come first.
STRICT_CHATML = (
    "{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('a system message must come first') }}{% endif %}{% endfor %}" + CHATML
)


def test_a_chat_template_raising_on_one_row_is_that_rows_error(
    tmp_path: Path, rust_tokenizer: Any
) -> None:
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path / "strict"
    PreTrainedTokenizerFast(
        tokenizer_object=rust_tokenizer, eos_token="<|endoftext|>", chat_template=STRICT_CHATML
    ).save_pretrained(str(directory))
    good = conversations(5, seed=4)
    late_system = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "late"},
        {"role": "assistant", "content": "yo"},
    ]
    rows = with_bad_rows([{"messages": m} for m in good], {3: {"messages": late_system}})
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    summary, errors = convert_twice(path, tmp_path, [3], preset="sft", tokenizer=directory)
    assert "chat template" in errors[0] and "a system message must come first" in errors[0]
    check_sft(summary, rust_tokenizer, good)


# -- a token id the stored dtype cannot hold --------------------------------------------------
class CodePoints(Tokenizer):
    """Unicode code points as ids, claiming the Basic Multilingual Plane only (uint16): a
    character beyond it (an emoji) gives an id over the stored dtype."""

    name = "codepoints"
    vocab_size = 1 << 16
    eos_id = 0
    chat_template = None

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.array([ord(c) for c in text], dtype=np.int64) for text in texts]

    def encode_masked(self, texts: Any, spans: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError("the seq preset does not mask")

    def fingerprint(self) -> str:
        return "codepoints"


def test_a_token_id_over_the_stored_dtype_is_a_row_error_with_its_line(tmp_path: Path) -> None:
    good = [{"text": t} for t in make_texts(6, seed=9)]
    bad = {2: {"text": "a smile \N{GRINNING FACE}"}, 4: {"text": "\N{PILE OF POO} too"}}
    path = write_jsonl(tmp_path / "in.jsonl", with_bad_rows(good, bad))
    summary, errors = convert_twice(path, tmp_path, [2, 4], preset="seq", tokenizer=CodePoints())
    assert "token ids of codepoints" in errors[0] and "does not fit uint16" in errors[0]
    assert str(ord("\N{GRINNING FACE}")) in errors[0]
    want = [i for row in good for i in [*map(ord, row["text"]), 0]]
    assert stream_of(summary.storage)["sequence"].tolist() == want


# -- a tokenizer failing a whole batch for one text -------------------------------------------
@pytest.fixture(scope="module")
def ascii_bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BPE whose unknown token is not in its vocabulary, trained on ASCII words only: a
    text with a character it never saw fails ``encode_batch`` for the whole batch."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = RustTokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False)
    words = [w for w in WORDS if w.isascii()]
    tokenizer.train_from_iterator([" ".join(words)] * 20, trainer=trainer)
    assert tokenizer.token_to_id("[UNK]") is None
    path = tmp_path_factory.mktemp("ascii_bpe") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def ascii_texts(count: int, seed: int) -> list[str]:
    return [
        " ".join(w for w in t.split() if w.isascii()) or "data" for t in make_texts(count, seed)
    ]


@pytest.mark.parametrize("preset", ["seq", "sft"])
def test_a_batch_the_tokenizer_fails_for_one_row_names_that_row(
    tmp_path: Path, ascii_bpe: Path, preset: str
) -> None:
    from tokenizers import Tokenizer as RustTokenizer

    rust = RustTokenizer.from_file(str(ascii_bpe))
    texts = ascii_texts(12, seed=6)
    if preset == "seq":
        good: Rows = [{"text": t} for t in texts]
        bad = {4: {"text": "the café is new"}}
        options: dict[str, Any] = {"eos_token": "<|endoftext|>"}
    else:
        chats = [
            [{"role": "user", "content": texts[2 * i]},
             {"role": "assistant", "content": texts[2 * i + 1]}]
            for i in range(6)
        ]  # fmt: skip
        good = [{"messages": m} for m in chats]
        bad = {4: {"messages": [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "naïve"}]}}  # fmt: skip
        options = {"chat_template": CHATML}
    path = write_jsonl(tmp_path / "in.jsonl", with_bad_rows(good, bad))
    summary, errors = convert_twice(
        path, tmp_path, [4], preset=preset, tokenizer=ascii_bpe, **options
    )
    assert "Unk token `[UNK]` not found in the vocabulary" in errors[0], errors[0]
    if preset == "seq":
        want = [i for t in texts for i in [*truth.encode(rust, t), truth.eos_id(rust)]]
        assert stream_of(summary.storage)["sequence"].tolist() == want
    else:
        check_sft(summary, rust, chats)


class FailsInBatches(ByteTokenizer):
    """A tokenizer whose batches fail though every text encodes alone (no row's fault)."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if len(texts) > 1:
            raise RuntimeError("the batch failed, not a row")
        return super().encode_batch(texts)


def test_a_batch_failure_no_single_row_explains_is_raised_as_it_is() -> None:
    preset = get_preset("seq", FailsInBatches(), Fields(), Limits())
    with pytest.raises(RuntimeError, match="the batch failed, not a row"):
        preset.convert([Row("f:1", {"text": "a"}), Row("f:2", {"text": "b"})])
    (one,) = preset.convert([Row("f:1", {"text": "a"})])
    assert one.error is None and one.records[0]["sequence"].tolist() == [97, 256]
