"""A torchrun training loop over a rangestream loader, written as a user writes one.

Run by ``test_torchrun.py`` under ``torchrun --nproc_per_node N``:
``torchrun_train.py DATA OUT PLAN``. The loader is built before ``init_process_group``.
``PLAN`` is ``stop:K`` (K steps, then rank 0 saves the loader's state), ``resume`` (load
that state, play the rest of the epoch, with any number of ranks) or ``die:HOW`` (rank 1
ends itself after two steps, ``os._exit`` or ``SIGKILL``; rank 0 waits for it in a
barrier, and torchrun then stops it). Each rank appends the windows it read to
``OUT/<plan>.rank<r>.jsonl`` and writes its workers' pids to ``OUT/workers.rank<r>.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed

from rangestream import StatefulDataLoader, StreamStorage

WINDOW = 8  # the stored tokens are 0, 1, 2, ...: a window names its start


def write_workers(out: Path, rank: int) -> None:
    workers = [child.pid for child in multiprocessing.active_children()]
    path = out / f"workers.rank{rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"rank": os.getpid(), "workers": workers}))
    path.with_suffix(".tmp").rename(path)


def main(data: str, out_dir: str, plan: str) -> None:
    out, name = Path(out_dir), plan.split(":")[0]
    # -- the user-side code (counted in the closing note) --------------------------------
    loader = StatefulDataLoader.from_storage(
        StreamStorage(data), sequence_length=WINDOW, batch_size=2, num_workers=2
    )
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    if plan == "resume":
        loader.load_state_dict(torch.load(out / "state.pt"))
    # -- (the training loop, then the save below) ----------------------------------------
    stop_at = int(plan.split(":")[1]) if plan.startswith("stop:") else None
    with open(out / f"{name}.rank{rank}.jsonl", "a") as log:
        for step, batch in enumerate(loader):
            windows = (batch["tokens"][:, 0] // WINDOW).tolist()
            log.write(json.dumps({"step": step, "windows": windows}) + "\n")
            log.flush()
            if plan.startswith("die:") and step == 1:
                write_workers(out, rank)
                if rank == 1:
                    os._exit(3) if plan == "die:exit" else os.kill(os.getpid(), signal.SIGKILL)
                torch.distributed.barrier()  # waits for rank 1, which is gone
            if step + 1 == stop_at:
                break
    if stop_at is not None and rank == 0:
        torch.save(loader.state_dict(), out / "state.pt")
    # -- end of the user-side code --------------------------------------------------------
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
