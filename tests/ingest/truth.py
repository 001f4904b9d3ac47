"""Independent ground truth for the presets, computed from the tokenizer directly.

Conversations are assembled here by string pieces (not through the chat template), and
each piece is encoded on its own: piece boundaries are at special tokens or before a
newline, where the byte-level pre-tokenizer splits anyway, so the concatenation is what
encoding the whole text gives, and each piece's mask is known by construction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EOS = "<|endoftext|>"


def encode(tokenizer: Any, text: str) -> list[int]:
    if tokenizer == "bytes":
        return list(text.encode("utf-8"))
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def eos_id(tokenizer: Any) -> int:
    return 256 if tokenizer == "bytes" else int(tokenizer.token_to_id(EOS))


def pieces_tokens(tokenizer: Any, pieces: list[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    ids: list[int] = []
    mask: list[int] = []
    for text, masked in pieces:
        encoded = encode(tokenizer, text)
        ids += encoded
        mask += [masked] * len(encoded)
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8)


def turn(role: str, content: str) -> list[tuple[str, int]]:
    """A ChatML turn; an assistant's content and end-of-turn token train, nothing else."""
    trains = 1 if role == "assistant" else 0
    return [
        ("<|im_start|>", 0),
        (f"{role}\n", 0),
        (content, trains),
        ("<|im_end|>", trains),
        ("\n", 0),
    ]


def seq(tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray([*encode(tokenizer, t), eos_id(tokenizer)]) for t in texts]


def sft(
    tokenizer: Any, conversations: list[list[dict[str, str]]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for messages in conversations:
        pieces = [piece for m in messages for piece in turn(m["role"], m["content"])]
        out.append(pieces_tokens(tokenizer, pieces))
    return out


def dpo_chat(tokenizer: Any, prompt: str, answer: str) -> tuple[np.ndarray, np.ndarray]:
    return pieces_tokens(tokenizer, turn("user", prompt) + turn("assistant", answer))


def dpo_plain(tokenizer: Any, prompt: str, answer: str) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = pieces_tokens(tokenizer, [(prompt, 0), (answer, 1)])
    return np.append(ids, eos_id(tokenizer)), np.append(mask, 1).astype(np.uint8)


def grpo_chat(
    tokenizer: Any, prompt: str, responses: list[str]
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    prompt_ids, _ = pieces_tokens(
        tokenizer, [*turn("user", prompt), ("<|im_start|>", 0), ("assistant\n", 0)]
    )
    answers = [pieces_tokens(tokenizer, [(r, 1), ("<|im_end|>", 1), ("\n", 0)]) for r in responses]
    return prompt_ids, [a for a, _ in answers], [m for _, m in answers]
