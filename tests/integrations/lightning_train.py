"""A Lightning DDP run over a rangestream loader, written as a user writes one.

Run by ``test_lightning.py``: ``python lightning_train.py DATA OUT STRATEGY PLAN``. The
loader is built in ``LightningDataModule.__init__``, before the process group exists; each
rank appends what it trained on to ``OUT/<run>.rank<r>.jsonl``. ``PLAN`` is ``resume:K``
(an uninterrupted epoch, then a run stopped by a checkpoint at step K, then a run resumed
from that checkpoint), ``once`` (one epoch) or ``die:HOW`` (every rank ends itself,
``os._exit`` or ``SIGKILL``, at its third step, after writing its workers' pids).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import lightning as L
import torch

from rangestream import StatefulDataLoader, StreamStorage

WINDOW = 8  # tokens per window; the stored tokens are 0, 1, 2, ...: a window names its start
VOCABULARY = 1024  # more than the tokens stored


# -- the user-side code (counted in the closing note: everything a Lightning user writes) --
class TokenData(L.LightningDataModule):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.loader = StatefulDataLoader.from_storage(
            StreamStorage(path), sequence_length=WINDOW, batch_size=4, num_workers=2
        )

    def train_dataloader(self) -> StatefulDataLoader:
        return self.loader


# -- end of the user-side code ------------------------------------------------------------


class TinyModel(L.LightningModule):
    """An embedding and a head: enough for real gradients through DDP."""

    def __init__(self, out: str, run: str, vocabulary: int, die: str | None = None) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, 4)
        self.head = torch.nn.Linear(4, vocabulary)
        self.out, self.run, self.die = Path(out), run, die

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens = batch["tokens"]
        windows = (tokens[:, 0] // WINDOW).tolist()
        record = {"step": self.global_step, "windows": windows, "dtype": str(tokens.dtype)}
        with open(self.out / f"{self.run}.rank{self.global_rank}.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        if self.die is not None and batch_idx == 2:
            self.end_rank()
        logits = self.head(self.embed(tokens[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def end_rank(self) -> None:
        workers = [child.pid for child in multiprocessing.active_children()]
        pids = self.out / f"workers.rank{self.global_rank}.json"
        pids.with_suffix(".tmp").write_text(json.dumps({"rank": os.getpid(), "workers": workers}))
        pids.with_suffix(".tmp").rename(pids)
        if self.die == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(strategy: str, **options: object) -> L.Trainer:
    settings: dict[str, object] = {
        "accelerator": "cpu", "devices": 2, "strategy": strategy, "max_epochs": 1,
        "logger": False, "enable_progress_bar": False, "enable_model_summary": False,
        "enable_checkpointing": False, "num_sanity_val_steps": 0,
    }  # fmt: skip
    return L.Trainer(**{**settings, **options})  # type: ignore[arg-type]


def main(data: str, out: str, strategy: str, plan: str) -> None:
    vocabulary = VOCABULARY
    if plan == "once" or plan.startswith("die:"):
        die = plan.split(":")[1] if plan.startswith("die:") else None
        trainer(strategy).fit(TinyModel(out, "once", vocabulary, die), TokenData(data))
        return
    stop_at = int(plan.split(":")[1])
    torch.manual_seed(0)
    trainer(strategy).fit(TinyModel(out, "full", vocabulary), TokenData(data))
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=out, filename="stop", every_n_train_steps=stop_at, save_top_k=-1
    )
    stopped = trainer(strategy, max_steps=stop_at, callbacks=[checkpoint],
                      enable_checkpointing=True)  # fmt: skip
    stopped.fit(TinyModel(out, "stop", vocabulary), TokenData(data))
    resumed = trainer(strategy)
    resumed.fit(TinyModel(out, "resume", vocabulary), TokenData(data),
                ckpt_path=str(Path(out, "stop.ckpt")))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:5])
