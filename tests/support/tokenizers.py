"""Tokenizer fixtures the ingestion tests build themselves (nothing is downloaded).

A byte-level BPE is trained on a generated corpus with ``tokenizers``; the ChatML-style
template is written by ``corpus``. Special tokens are added tokens, so the tokenizer splits
the text at them before BPE runs: tests compute ground truth by encoding the pieces between
them separately (``tests/ingest/truth.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.corpus import CHATML, SPECIALS, make_texts

__all__ = ["rust_tokenizer", "tokenizer_dir", "tokenizer_json"]


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
def rust_tokenizer(tokenizer_json: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json))
