"""Tokenizers and corpora the ingestion tests build themselves (nothing is downloaded).

A byte-level BPE is trained on a generated corpus with ``tokenizers``; the ChatML-style
template below is written here. Special tokens are added tokens, so the tokenizer splits
the text at them before BPE runs: tests compute ground truth by encoding the pieces between
them separately.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

WORDS = (
    "the a data stream token shard block window range read write zarr object store "
    "train model loss mask answer question why how fast small large über café naïve 数据 "
    "1 2 3 42 3.14 , . ! ? ; : ( ) - 'quoted' \"double\""
).split()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def sentence(rng: np.random.Generator, words: int) -> str:
    picked = rng.choice(len(WORDS), size=words)
    return " ".join(WORDS[i] for i in picked)


def make_texts(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [sentence(rng, int(rng.integers(1, 60))) for _ in range(count)]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained byte-level BPE: ``tokenizer.json`` alone, and a transformers directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(make_texts(2000, seed=1), trainer=trainer)
    tokenizer.save(str(root / "tokenizer.json"))
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", chat_template=CHATML
    )
    fast.save_pretrained(str(root / "hf"))
    (root / "chatml.jinja").write_text(CHATML)
    return root


@pytest.fixture(scope="session")
def tokenizer_json(tokenizer_dir: Path) -> Path:
    return tokenizer_dir / "tokenizer.json"


@pytest.fixture(scope="session")
def rust_tokenizer(tokenizer_json: Path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
