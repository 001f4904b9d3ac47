"""The loader's overhead in each training framework, against in-memory batches.

Run: ``PYTHONPATH=src:. python -m benchmarks.integrations_overhead [--steps N] [--repeats R]``.

For each framework (plain PyTorch loop, Hugging Face ``Trainer``, accelerate, Lightning) the
same tiny GPT-2 (from a config, CPU) trains ``N`` steps fed (a) from a list of the same
batches already in memory and (b) from a rangestream ``StatefulDataLoader`` over local disk
(2 forked workers, ``CausalLMCollate``). Each measurement is a whole fit of ``N`` steps
(the framework's own setup included, the same in (a) and (b)); (a) and (b) alternate,
``R`` repeats each. Reported per framework: the ratio (b)/(a), median and range over the
repeats (ratio of the i-th (b) to the i-th (a)).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage
from rangestream.loader import CausalLMCollate

VOCAB, LENGTH, BATCH = 256, 64, 8


def write_data(path: str, steps: int) -> StreamStorage:
    tokens = np.random.default_rng(0).integers(0, VOCAB, steps * BATCH * LENGTH, dtype="<u2")
    storage = StreamStorage(path, StreamNumpyFormat(np.dtype([("tokens", "<u2")])))
    with storage.sync_writer() as writer:
        writer.append(0, {"tokens": tokens})
    return StreamStorage(path)


def model() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=LENGTH)
    return GPT2LMHeadModel(config)


def plain(batches: Iterable[Any], steps: int) -> None:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for step, batch in enumerate(batches, 1):
        net(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == steps:
            break


def accelerated(batches: Iterable[Any], steps: int) -> None:
    from accelerate.state import AcceleratorState, GradientState

    from rangestream.integrations.accelerate import Accelerator

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    if isinstance(batches, StatefulDataLoader):
        net, optimizer, batches = accelerator.prepare(net, optimizer, batches)
    else:
        net, optimizer = accelerator.prepare(net, optimizer)
    for step, batch in enumerate(batches, 1):
        accelerator.backward(net(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == steps:
            break


def hf_trainer(batches: Iterable[Any], steps: int) -> None:
    import transformers
    from transformers import TrainingArguments

    from rangestream.integrations.transformers import Trainer

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, max_steps=steps, save_strategy="no", report_to=[],
                                 use_cpu=True, disable_tqdm=True, logging_strategy="no",
                                 per_device_train_batch_size=BATCH)  # fmt: skip
        if isinstance(batches, StatefulDataLoader):
            trainer: Any = Trainer(model=model(), args=args, train_loader=batches)
        else:
            in_memory = list(batches)

            class InMemory(transformers.Trainer):
                def get_train_dataloader(self) -> Any:
                    return in_memory

            trainer = InMemory(model=model(), args=args)
        trainer.train()


def lightning(batches: Iterable[Any], steps: int) -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> Any:
            return self.net(**batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, num_sanity_val_steps=0)  # fmt: skip
    if isinstance(batches, list):  # a list would be taken for a list of loaders
        batches = InMemoryBatches(batches)
    trainer.fit(Module(), train_dataloaders=batches)


class InMemoryBatches:
    """A list of batches as one iterable loader (for Lightning)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


FRAMEWORKS: dict[str, Callable[[Iterable[Any], int], None]] = {
    "plain loop": plain,
    "HF Trainer": hf_trainer,
    "accelerate": accelerated,
    "Lightning": lightning,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frameworks", nargs="*", default=list(FRAMEWORKS))
    options = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        storage = write_data(os.path.join(root, "tokens"), options.steps)

        def loader() -> StatefulDataLoader:
            return StatefulDataLoader.from_storage(
                storage, CausalLMCollate("tokens"), sequence_length=LENGTH, batch_size=BATCH,
                num_workers=2, multiprocessing_context="fork", shuffle=True,
            )  # fmt: skip

        in_memory = list(loader())
        print(f"{options.steps} steps of batch {BATCH} x {LENGTH} tokens, tiny GPT-2, CPU, "
              f"{options.repeats} repeats")  # fmt: skip
        print("| framework | in-memory s (median) | rangestream s (median) | ratio median "
              "| ratio range |")  # fmt: skip
        print("|---|---|---|---|---|")
        for name in options.frameworks:
            fit = FRAMEWORKS[name]
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                fit(in_memory, 2)  # warm: imports, first allocations (quiet: the table only)
            memory: list[float] = []
            ours: list[float] = []
            for _ in range(options.repeats):
                for feed, times in ((lambda: in_memory, memory), (loader, ours)):
                    batches = feed()
                    start = time.perf_counter()
                    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                        fit(batches, options.steps)
                    times.append(time.perf_counter() - start)
                    del batches
            ratios = [b / a for a, b in zip(memory, ours, strict=True)]
            print(f"| {name} | {statistics.median(memory):.2f} | {statistics.median(ours):.2f} "
                  f"| {statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
