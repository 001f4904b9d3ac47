"""Tokenizers: one behaviour whether loaded from a file, a directory or bytes; masks by offsets."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.corpus import make_texts

from rangestream.errors import BadInputError
from rangestream.ingest.tokenizers import ByteTokenizer, TextTokenizer, load_tokenizer


def test_a_tokenizer_json_and_its_transformers_directory_encode_alike(
    tokenizer_dir: Path, rust_tokenizer: Any
) -> None:
    texts = make_texts(40, seed=9)
    from_file = load_tokenizer(tokenizer_dir / "tokenizer.json")
    from_dir = load_tokenizer(tokenizer_dir / "hf")
    want = [rust_tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    assert [a.tolist() for a in from_file.encode_batch(texts)] == want
    assert [a.tolist() for a in from_dir.encode_batch(texts)] == want
    assert from_file.eos_id == from_dir.eos_id == rust_tokenizer.token_to_id("<|endoftext|>")
    assert from_file.vocab_size == rust_tokenizer.get_vocab_size(with_added_tokens=True)
    assert from_file.chat_template is None and from_dir.chat_template is not None


def test_a_tokenizer_survives_pickling_and_keeps_its_template(tokenizer_dir: Path) -> None:
    loaded = load_tokenizer(tokenizer_dir / "hf")
    copy = pickle.loads(pickle.dumps(loaded))
    assert isinstance(copy, TextTokenizer)
    assert copy.fingerprint() == loaded.fingerprint()
    assert (
        copy.chat_template is not None and copy.chat_template.source == loaded.chat_template.source
    )


def test_masks_mark_tokens_starting_inside_the_spans(
    rust_tokenizer: Any, tokenizer_json: Path
) -> None:
    text = "<|im_start|>user\nwhy<|im_end|>\n<|im_start|>assistant\nfast data<|im_end|>\n"
    start = text.index("fast")
    stop = text.rindex("<|im_end|>") + len("<|im_end|>")
    ((ids, mask),) = load_tokenizer(tokenizer_json).encode_masked([text], [[(start, stop)]])
    encoding = rust_tokenizer.encode(text, add_special_tokens=False)
    assert ids.tolist() == encoding.ids
    want = [1 if start <= a < stop else 0 for a, _ in encoding.offsets]
    assert mask.tolist() == want and 0 < sum(want) < len(want)


def test_bytes_are_ids_and_masks_count_bytes_not_characters() -> None:
    text = "é:über"
    ((ids, mask),) = ByteTokenizer().encode_masked([text], [[(2, 6)]])
    assert ids.tolist() == list(text.encode())
    assert mask.tolist() == [0, 0, 0] + [1] * 5  # é is 2 bytes, ü is 2 bytes


def test_an_unknown_eos_token_and_a_missing_tokenizer_are_named(tokenizer_json: Path) -> None:
    with pytest.raises(BadInputError, match="no token '<nope>'"):
        load_tokenizer(tokenizer_json, eos_token="<nope>")
    with pytest.raises(BadInputError, match="nothing is downloaded"):
        load_tokenizer("org/model-on-a-hub")


def test_a_chat_template_file_overrides_the_directory_one(
    tokenizer_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    loaded = load_tokenizer(tokenizer_dir / "hf", chat_template=tmp_path / "t.jinja")
    assert loaded.chat_template.render([{"role": "user", "content": "x"}]) == "[x]"
    ids = load_tokenizer("bytes").encode_batch(["ab"])
    assert np.array_equal(ids[0], [97, 98])
