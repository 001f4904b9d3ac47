"""Generated corpora and the chat template the ingestion tests use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

WORDS = [
    "the",
    "a",
    "data",
    "stream",
    "token",
    "shard",
    "block",
    "window",
    "range",
    "read",
    "write",
    "zarr",
    "object",
    "store",
    "train",
    "model",
    "loss",
    "mask",
    "answer",
    "question",
    "why",
    "how",
    "fast",
    "small",
    "large",
    "über",
    "café",
    "naïve",
    "数据",
    "1",
    "2",
    "3",
    "42",
    "3.14",
    ",",
    ".",
    "!",
    "?",
    ";",
    ":",
    "(",
    ")",
    "-",
    "'quoted'",
    '"double"',
]
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


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path
