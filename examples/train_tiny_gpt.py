"""Train a tiny GPT on a 70/30 mixture of two token datasets streamed with rangestream.

A complete, resumable training script in plain torch:

    python examples/train_tiny_gpt.py --data s3://bucket/tiny-gpt --prepare \\
        --storage-options '{"key": "...", "secret": "...",
                            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'
    python examples/train_tiny_gpt.py --data /tmp/tiny-gpt --prepare        # local disk

``--prepare`` writes the two datasets (``web``: Zipf-distributed words; ``code``: short
arithmetic sequences) once. Training reads them with ``StatefulDataLoader.from_storages``
(two DataLoader workers, the block shuffle over S3, the per-window shuffle on local disk)
and saves model, optimizer and loader state to ``--checkpoint`` every
``--checkpoint-every`` steps, atomically. Started again with the same arguments, it resumes
from the checkpoint: the loader hands out exactly the batches the uninterrupted run would
have, so the loss curve (``--log``, one JSON line per step) is the same to the last bit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.loader import NextTokenCollate

VOCAB = 256
TOKENS = np.dtype([("tokens", "<i4")])


# -- data ------------------------------------------------------------------------------------


def web_tokens(count: int, seed: int) -> np.ndarray:
    """Words of 2-6 tokens drawn from a Zipf vocabulary of 400 words, separated by 0."""
    rng = np.random.default_rng(seed)
    words = [rng.integers(1, VOCAB // 2, size=rng.integers(2, 7)) for _ in range(400)]
    ranks = np.minimum(rng.zipf(1.3, size=count // 3), len(words)) - 1
    stream = np.concatenate([np.append(words[r], 0) for r in ranks])
    return stream[:count].astype("<i4")


def code_tokens(count: int, seed: int) -> np.ndarray:
    """Arithmetic sequences ``a, a + d, ...`` (mod 128, offset into the upper vocabulary)."""
    rng = np.random.default_rng(seed)
    pieces = []
    total = 0
    while total < count:
        start, step, length = rng.integers(0, 128), rng.integers(1, 8), rng.integers(4, 17)
        piece = VOCAB // 2 + (start + step * np.arange(length)) % (VOCAB // 2)
        pieces.append(np.append(piece, 1))
        total += length + 1
    return np.concatenate(pieces)[:count].astype("<i4")


def storages(data: str, options: dict[str, Any]) -> tuple[StreamStorage, StreamStorage]:
    make = lambda name: StreamStorage(  # noqa: E731
        f"{data.rstrip('/')}/{name}", StreamNumpyFormat(TOKENS), storage_options=options
    )
    return make("web"), make("code")


def prepare(data: str, options: dict[str, Any], tokens: int) -> None:
    """Write both datasets (two shards each), replacing any earlier version."""
    web, code = storages(data, options)
    for storage, make in ((web, web_tokens), (code, code_tokens)):
        stream = make(tokens, seed=len(storage.url))
        with storage.sync_writer(overwrite=True) as writer:
            half = len(stream) // 2
            writer.append(0, {"tokens": stream[:half]})
            writer.append(1, {"tokens": stream[half:]})


# -- model -----------------------------------------------------------------------------------


class TinyGPT(nn.Module):
    """A decoder-only transformer: token and position embeddings, causal blocks, a head."""

    def __init__(self, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.register_buffer(
            "causal", torch.triu(torch.full((context, context), -math.inf), 1), persistent=False
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        x = self.blocks(x, mask=self.causal[:length, :length], is_causal=True)
        return self.head(self.norm(x))


# -- training --------------------------------------------------------------------------------


def save_atomically(path: Path, state: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def train(args: argparse.Namespace) -> list[float]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one thread: the same reductions in every run
    torch.use_deterministic_algorithms(True)
    options = json.loads(args.storage_options) if args.storage_options else {}
    web, code = storages(args.data, options)
    loader = StatefulDataLoader.from_storages(
        {web: 0.7, code: 0.3},
        NextTokenCollate(),
        names={web: "web", code: "code"},
        sequence_length=args.context,
        next_token=True,
        batch_size=args.batch_size,
        num_workers=args.workers,
        shuffle_seed=args.seed,
    )
    model = TinyGPT(args.context, args.width, args.layers, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step = 0
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
        print(f"resumed at step {step} (epoch {loader.epoch}, {loader.consumed_samples} samples)")
    log = Path(args.log).open("a") if args.log else None  # noqa: SIM115 - closed below
    losses = []
    try:
        while step < args.steps:
            for batch in loader:
                logits = model(batch["input_ids"].long())
                loss = nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), batch["target_ids"].long().reshape(-1)
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                losses.append(loss.item())
                if log is not None:
                    log.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
                    log.flush()
                if checkpoint is not None and step % args.checkpoint_every == 0:
                    save_atomically(checkpoint, {
                        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict(), "step": step,
                    })  # fmt: skip
                if step % 50 == 0 or step == args.steps:
                    mix = {name: s["samples"] for name, s in loader.source_stats().items()}
                    print(f"step {step} loss {loss.item():.4f} epoch {loader.epoch} mix {mix}")
                if step >= args.steps:
                    break
    finally:
        if log is not None:
            log.close()
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="URL prefix of the two datasets")
    parser.add_argument("--storage-options", default="", help="JSON, for s3:// URLs")
    parser.add_argument("--prepare", action="store_true", help="write the datasets first")
    parser.add_argument("--tokens", type=int, default=400_000, help="tokens per dataset")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default="", help="checkpoint file (resumed if found)")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--log", default="", help="append one JSON line per step here")
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.data, json.loads(args.storage_options or "{}"), args.tokens)
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
