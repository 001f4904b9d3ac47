"""Real ranks: ``torch.distributed`` (gloo, CPU) processes, each with two DataLoader workers.

Each test spawns a two-rank job that plays a whole epoch, then stops the next epoch at step
``k`` and saves the loader state; then a three-rank job resumes from that state. Checked for
one storage (the block shuffle over S3, the per-window shuffle on local disk) and for a
mixture of two: every sample of an epoch is loaded exactly once across ranks (padding aside,
which is counted), and the resumed three ranks load exactly what the two left.
"""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed
import torch.multiprocessing
from support.s3 import Location

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


def run_rank(rank: int, world_size: int, job_text: str) -> None:
    """One rank: join the gloo group, load, write what was loaded (rank 0: the state)."""
    job = Job(**json.loads(job_text))
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


WINDOWS_A, WINDOWS_B = 90, 60
STOP_AT = 4


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spawn(world_size: int, job: Job) -> list[dict[str, Any]]:
    """Start ``world_size`` rank processes and wait for them. They are forked (a spawned rank
    re-imports torch: seconds per rank on these machines); each then joins the process group
    and starts its own DataLoader workers, as under torchrun."""
    torch.multiprocessing.start_processes(
        run_rank, args=(world_size, job_json(job)), nprocs=world_size, join=True,
        start_method="fork",
    )  # fmt: skip
    return [json.loads(Path(job.out_dir, f"rank{r}.json").read_text()) for r in range(world_size)]


def global_order(reports: list[dict[str, Any]], name: str, epoch: int) -> list[int]:
    """Samples of one epoch over all ranks, step by step, rank by rank."""
    per_rank = [report[name]["epochs"][epoch] for report in reports]
    assert len({len(batches) for batches in per_rank}) == 1  # every rank steps together
    return [s for step in zip(*per_rank, strict=True) for batch in step for s in batch]


def test_ranks_load_each_sample_once_and_three_ranks_resume_what_two_left(
    location: Location, tmp_path: Path
) -> None:
    url_a, url_b = location.child("a"), location.child("b")
    write_tokens(url_a, location.storage_options, 0, WINDOWS_A)
    write_tokens(url_b, location.storage_options, OFFSET, WINDOWS_B)
    everything = {
        "single": list(range(WINDOWS_A)),
        "mixture": list(range(WINDOWS_A)) + [OFFSET + i for i in range(WINDOWS_B)],
    }
    first_dir, second_dir = tmp_path / "two", tmp_path / "three"
    first_dir.mkdir()
    second_dir.mkdir()
    two = spawn(2, Job(url_a, url_b, location.storage_options, str(first_dir), free_port(),
                       stop_at=STOP_AT))  # fmt: skip
    assert [(r["single"]["rank"], r["single"]["world_size"]) for r in two] == [(0, 2), (1, 2)]
    states = {name: two[0][name]["state"] for name in everything}
    three = spawn(3, Job(url_a, url_b, location.storage_options, str(second_dir), free_port(),
                         resume=states))  # fmt: skip
    for name, samples in everything.items():
        # epoch 0 over two ranks: every sample once; batches of 3 on 2 ranks pad the last
        # global batch with at most 5 samples from the start of the epoch's order
        epoch = global_order(two, name, 0)
        counts = Counter(epoch)
        assert set(counts) == set(samples)
        assert len(epoch) - len(samples) == -len(samples) % 6
        # epoch 1: k steps on two ranks, the rest on three
        head = global_order(two, name, 1)
        rest = global_order(three, name, 0)
        assert len(head) == STOP_AT * 6
        resumed = Counter(head + rest)
        assert set(resumed) == set(samples)  # nothing lost ...
        padding = len(head) + len(rest) - len(samples)
        assert 0 <= padding < 9  # ... and only the last global batch of 9 padded
        assert sum(count - 1 for count in resumed.values()) == padding
