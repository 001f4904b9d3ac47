"""What one rank of a real ``torch.distributed`` job does in the distributed tests.

Each rank is a process started by ``torch.multiprocessing.spawn``, joins a gloo process group
on loopback, and builds its loaders with ``rank=None, world_size=None``: the loader takes
both from the process group, as in a training script. It writes what it loaded (and, on
rank 0, the loader state) as JSON for the test to check.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed

from rangestream import StatefulDataLoader, StreamNumpyFormat, StreamStorage

WINDOW = 8
OFFSET = 1_000_000  # the second storage's tokens start here: a window names its storage
TOKENS = np.dtype([("tokens", "<i4")])


@dataclass(frozen=True)
class Job:
    """One spawn of ranks: which storages, how long to load, what to resume."""

    url_a: str
    url_b: str
    storage_options: dict[str, Any]
    out_dir: str
    port: int
    stop_at: int | None = None  # steps of the second epoch before saving (None: all)
    resume: dict[str, Any] = field(default_factory=dict)  # loader name -> saved state


def write_tokens(url: str, options: dict[str, Any], first: int, windows: int) -> None:
    storage = StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options,
                            chunk_bytes=256, block_bytes=4096)  # fmt: skip
    with storage.sync_writer(overwrite=True) as writer:
        tokens = np.arange(first, first + windows * WINDOW, dtype="<i4")
        half = len(tokens) // 2
        writer.append(0, {"tokens": tokens[:half]})
        writer.append(1, {"tokens": tokens[half:]})


def _storage(url: str, options: dict[str, Any]) -> StreamStorage:
    return StreamStorage(url, StreamNumpyFormat(TOKENS), storage_options=options)


def loaders(job: Job) -> dict[str, StatefulDataLoader]:
    a, b = _storage(job.url_a, job.storage_options), _storage(job.url_b, job.storage_options)
    # DataLoader workers are forked, as under torchrun (a rank made by spawn would spawn them
    # too, and a spawned worker re-imports torch: seconds per epoch on a busy machine)
    common: dict[str, Any] = {"sequence_length": WINDOW, "batch_size": 3, "num_workers": 2,
                              "drop_last": False, "shuffle_seed": 5,
                              "multiprocessing_context": "fork"}  # fmt: skip
    return {
        "single": StatefulDataLoader.from_storage(a, **common),  # block over S3, window local
        "mixture": StatefulDataLoader.from_storages(
            {a: 0.6, b: 0.4}, names={a: "a", b: "b"}, **common
        ),
    }


def _windows(batch: dict[str, Any]) -> list[int]:
    return [int(t) // WINDOW if t < OFFSET else OFFSET + (int(t) - OFFSET) // WINDOW
            for t in batch["tokens"][:, 0].tolist()]  # fmt: skip


def run_rank(rank: int, world_size: int, job_json: str) -> None:
    job = Job(**json.loads(job_json))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{job.port}", rank=rank, world_size=world_size
    )
    try:
        report: dict[str, Any] = {}
        for name, loader in loaders(job).items():
            if name in job.resume:
                loader.load_state_dict(job.resume[name])
            epochs: list[list[list[int]]] = []
            if not job.resume:
                epochs.append([_windows(batch) for batch in loader])  # a whole epoch
            second: list[list[int]] = []
            for batch in loader:
                second.append(_windows(batch))
                if job.stop_at is not None and len(second) == job.stop_at:
                    break
            epochs.append(second)
            report[name] = {"epochs": epochs, "state": loader.state_dict(),
                            "rank": loader.dataset.options.rank,
                            "world_size": loader.dataset.options.world_size}  # fmt: skip
            torch.distributed.barrier()
        Path(job.out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        torch.distributed.destroy_process_group()


def job_json(job: Job) -> str:
    return json.dumps(asdict(job))
